"""Exports taken away through the gateway: a signed link streams a file as it is and a directory as a tar that reads
back byte for byte, with its length announced first; a forged, altered or expired link, or one whose export is gone,
is refused with what to do; the download is audited under the name of whoever asked for the link."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import httpx
import pytest
from conftest import OPERATOR
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog
from posttrain.platform.models.downloads import Download, _members, export_link, open_export
from posttrain.platform.models.jobs import ExportModelConfig, export_registered
from posttrain.platform.models.registry import register_model
from posttrain.platform.serving import GatewayConfig, create_gateway_app, serve_in_thread
from posttrain.platform.settings import get_settings


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny",
        TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
    )


@pytest.fixture
def exported(platform_env: dict[str, str], tiny_model: Path):  # type: ignore[no-untyped-def]
    register_model(OPERATOR, "mine", tiny_model)
    hf = export_registered(OPERATOR, ExportModelConfig(model="mine", format="hf"), get_settings())
    gguf = export_registered(OPERATOR, ExportModelConfig(model="mine", format="gguf", outtype="f16"), get_settings())
    gateway = serve_in_thread(create_gateway_app(GatewayConfig(deployments=[]), exports=open_export))
    try:
        yield gateway.base_url, hf, gguf
    finally:
        gateway.stop()


def _digests(root: Path) -> dict[str, str]:
    return {
        str(Path(root.name) / p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_directory_streams_as_a_tar_that_reads_back_and_a_file_as_it_is(exported, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base, hf, gguf = exported
    received = tmp_path / "got.tar"
    with httpx.stream("GET", base + export_link(OPERATOR, "mine", hf["path"]), timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "application/x-tar"
        assert (
            "filename*=UTF-8" in response.headers["content-disposition"]
            and ".tar" in response.headers["content-disposition"]
        )
        announced = int(response.headers["content-length"])
        with received.open("wb") as out:
            for piece in response.iter_bytes():
                out.write(piece)
    assert received.stat().st_size == announced  # the length said first is the length sent
    got = {}
    with tarfile.open(received, "r:") as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member)
            assert extracted is not None
            got[member.name] = hashlib.sha256(extracted.read()).hexdigest()
    assert got == _digests(Path(hf["path"])) and any(n.endswith(".safetensors") for n in got), got

    response = httpx.get(base + export_link(OPERATOR, "mine", gguf["path"]), timeout=60)
    assert response.status_code == 200 and response.content == Path(gguf["path"]).read_bytes()
    with session(read_only=True) as s:
        audited = s.exec(select(AuditLog).where(AuditLog.action == "model.download").order_by(col(AuditLog.id))).all()
    assert [(a.username, a.target, a.details["path"]) for a in audited] == [
        (OPERATOR.username, "mine", hf["path"]),
        (OPERATOR.username, "mine", gguf["path"]),
    ]


def test_a_long_path_in_a_directory_export_keeps_its_name(tmp_path: Path) -> None:
    """Tar's plain header holds 100 characters of a name; the PAX header that the stream writes holds any."""
    root = tmp_path / "export"
    deep = root / ("a-rather-long-directory-name-" * 3) / ("and-a-file-name-that-goes-on-" * 3 + ".bin")
    deep.parent.mkdir(parents=True)
    deep.write_bytes(b"x" * 1000)
    (root / "config.json").write_text("{}")
    download = Download("m", root, "export.tar", "application/x-tar", _members(root))
    archive = tmp_path / "out.tar"
    archive.write_bytes(b"".join(download.chunks()))
    assert archive.stat().st_size == download.size
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(_digests(root)), tar.getnames()
        assert len(tar.getnames()[0]) > 100 or len(tar.getnames()[1]) > 100


def test_a_link_that_is_forged_altered_expired_or_outlived_its_export_is_refused(exported) -> None:  # type: ignore[no-untyped-def]
    base, hf, gguf = exported
    link = export_link(OPERATOR, "mine", gguf["path"])
    claims, signature = link.rsplit("/", 1)[1].split(".")

    def refused(path: str) -> tuple[int, str]:
        response = httpx.get(base + path, timeout=30)
        return response.status_code, response.json()["error"]["message"]

    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    assert refused(f"/v1/exports/{claims}.{flipped}") == (
        403,
        "this download link is not one the platform signed: ask the console for a new one",
    )
    assert refused(f"/v1/exports/{claims}")[0] == 403  # no signature at all
    other = export_link(OPERATOR, "mine", hf["path"]).rsplit("/", 1)[1].split(".")[0]
    assert refused(f"/v1/exports/{other}.{signature}")[0] == 403  # the claims of one link under another's signature
    status, message = refused(export_link(OPERATOR, "mine", gguf["path"], ttl_s=-1))
    assert status == 403 and "expired" in message and "Export tab" in message
    Path(gguf["path"]).unlink()  # gone from disk after the link was given
    status, message = refused(link)
    assert status == 404 and "no longer an export of model 'mine'" in message and "export the model again" in message
    with session(read_only=True) as s:
        assert not s.exec(select(AuditLog).where(AuditLog.action == "model.download")).all()  # nothing was taken


def test_a_gateway_without_exports_serves_none(platform_env: dict[str, str]) -> None:
    gateway = serve_in_thread(create_gateway_app(GatewayConfig(deployments=[])))
    try:
        response = httpx.get(gateway.base_url + "/v1/exports/abc.def", timeout=30)
    finally:
        gateway.stop()
    assert response.status_code == 404 and "serves no exports" in response.json()["error"]["message"]
