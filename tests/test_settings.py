from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.platform.settings import SettingsError, load_settings


def test_defaults_are_the_embedded_setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("POSTTRAIN_DATABASE_URL", "POSTTRAIN_DATA_DIR", "POSTTRAIN_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings()
    assert s.data_dir == Path("var")
    assert s.resolved_database_url == f"sqlite:///{(tmp_path / 'var' / 'posttrain.db').resolve()}"
    assert s.console_port == 8501 and s.worker_cpu_slots >= 1


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTTRAIN_WORKER_CPU_SLOTS", "7")
    monkeypatch.setenv("POSTTRAIN_DATABASE_URL", "postgresql://u:pw@db:5432/x")
    s = load_settings()
    assert s.worker_cpu_slots == 7
    assert s.resolved_database_url == "postgresql+psycopg://u:pw@db:5432/x"


def test_toml_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "pt.toml"
    cfg.write_text("worker_cpu_slots = 5\nconsole_port = 9000\n")
    monkeypatch.setenv("POSTTRAIN_CONFIG", str(cfg))
    monkeypatch.setenv("POSTTRAIN_CONSOLE_PORT", "9100")  # the environment wins over the file
    s = load_settings()
    assert s.worker_cpu_slots == 5 and s.console_port == 9100


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("POSTTRAIN_WORKER_CPU_SLOTS", "lots", "POSTTRAIN_WORKER_CPU_SLOTS='lots'"),
        ("POSTTRAIN_CONSOLE_PORT", "70000", "POSTTRAIN_CONSOLE_PORT"),
        ("POSTTRAIN_DATABASE_URL", "mysql://x", "must start with sqlite:/// or postgresql+psycopg://"),
        ("POSTTRAIN_LOG_LEVEL", "LOUD", "POSTTRAIN_LOG_LEVEL"),
    ],
)
def test_invalid_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, var: str, value: str, named: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert named in message and "\n" not in message
