"""The llama.cpp engine: ``llama-server`` on a model's GGUF export, for CPU serving.

On a CPU host llama.cpp's quantized kernels decode a small model several times faster than transformers
does, so a deployment with ``engine: llamacpp`` (or a tier profile that names it) runs ``llama-server``
on the model's exported GGUF (Q8_0 unless the tier says F16) with the tier's parallel slots, on loopback,
behind the gateway like the embedded engine and vLLM (same lifecycle: :class:`ServerProcess` waits for
``/health``, streams the log into the deploy job's, stops the process group on cancel).

The binary is built from the ``llama-cpp-python`` source distribution on PyPI, which vendors llama.cpp
(no model hub or GitHub needed): ``make llamacpp`` runs ``python -m posttrain.platform.engines.llamacpp
build``, which compiles the ``llama-server`` target with cmake (minutes on two cores) into a cache under
``~/.cache/posttrain`` keyed by the version, this CPU's instruction set and the build's options, and links
it into the virtual environment's ``bin``; later builds find the cache. Rollouts for training never use this
engine: they need exact log-probs of the weights being trained.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from posttrain.platform.engines.profiles import TierProfile
from posttrain.platform.settings import get_settings

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendored llama.cpp is built
BINARY = "llama-server"
BUILD_TARGET = "make llamacpp"


class LlamaCppMissing(FileNotFoundError):
    """No ``llama-server`` binary: the message names the make target that builds it."""


class LlamaCppProfile(BaseModel):
    """One ``llama-server`` deployment."""

    gguf_path: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    parallel: int = Field(4, ge=1, le=256, description="slots: requests decoded together")
    ctx_per_slot: int = Field(4096, ge=64, description="prompt + completion tokens of one request")
    threads: int | None = Field(None, ge=1, description="compute threads; default: llama.cpp's (the cores)")
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list)

    @classmethod
    def for_tier(cls, gguf_path: str | os.PathLike[str], tier: TierProfile, **overrides: object) -> LlamaCppProfile:
        """The deployment of a speed tier: its batch size as llama-server's parallel slots."""
        return cls.model_validate({"gguf_path": str(gguf_path), "parallel": tier.embedded.max_num_seqs, **overrides})

    def to_args(self, executable: str | os.PathLike[str]) -> list[str]:
        args = [str(executable), "--model", self.gguf_path, "--host", self.host, "--port", str(self.port),
                "--parallel", str(self.parallel), "--ctx-size", str(self.ctx_per_slot * self.parallel),
                "--seed", str(self.seed), "--jinja",  # the GGUF's own chat template, tool calls included
                "--no-webui", "--metrics"]  # fmt: skip
        if self.served_model_name:
            args += ["--alias", self.served_model_name]
        if self.threads:
            args += ["--threads", str(self.threads)]
        return args + list(self.extra_args)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags (x86 ``flags``, Arm ``Features``) from /proc/cpuinfo; empty where unreadable."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cmake_options() -> list[str]:
    """How ``llama-server`` is configured: a static release build for this CPU (``GGML_NATIVE``), without ggml's
    AMX kernels on x86. Those are compiled in wherever ``-march=native`` finds AMX, and on a Sapphire Rapids VM
    here their Q8_0 matmul crashed llama-server on its warm-up decode (SIGSEGV in ``ggml_backend_amx_mul_mat``);
    an explicit ``-mno-amx-*`` wins over ``-march=native`` whatever the order, and AVX-512 stays on."""
    options = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_SERVER=ON",
               "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]  # fmt: skip
    if platform.machine() in ("x86_64", "AMD64"):
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        options += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    return options


def build_key() -> str:
    """The CPU's architecture and instruction-set flags and the build's options, hashed: a binary built with
    ``GGML_NATIVE`` on one machine may not run on another, and a change of options must not find an old build,
    so the cache keeps one build per key."""
    cpu = f"{platform.machine()} {' '.join(sorted(cpu_flags()))}"
    return hashlib.sha256(f"{cpu} {' '.join(cmake_options())}".encode()).hexdigest()[:12]


def cache_root() -> Path:
    """Where posttrain keeps what it builds for this machine (llama-server, the Q8_0 kernel)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posttrain"


def cache_dir() -> Path:
    return cache_root() / f"llama-server-{LLAMA_CPP_PYTHON}-{build_key()}"


def find_server(configured: str | os.PathLike[str] | None = None) -> Path:
    """The ``llama-server`` to run: ``configured`` (the ``llama_server`` setting), else the one in this
    environment's ``bin`` (where ``make llamacpp`` links it), else the built cache, else one on PATH."""
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaCppMissing(f"llama_server setting {path} is not an executable file; point it at a llama-server "
                                  f"binary or unset it and run `{BUILD_TARGET}`")  # fmt: skip
        return path
    for candidate in (Path(sys.prefix) / "bin" / BINARY, cache_dir() / BINARY):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(BINARY)
    if found:
        return Path(found)
    raise LlamaCppMissing(f"the llamacpp engine needs {BINARY}, which is not built: run `{BUILD_TARGET}` (compiles it "
                          f"from the llama-cpp-python {LLAMA_CPP_PYTHON} source distribution, a few minutes once), or "
                          "set POSTTRAIN_LLAMA_SERVER to a llama-server binary")  # fmt: skip


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    """Run one build step, its output both on stdout (minutes of compiling show their progress) and in ``log``."""
    print("+", " ".join(cmd), flush=True)
    with log.open("a") as out, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True, errors="replace") as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            print(line, end="", flush=True)
    if proc.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{cmd[0]} failed with code {proc.returncode}; the end of {log}:\n{tail}")


def build(jobs: int | None = None) -> Path:
    """Compile ``llama-server`` from the llama-cpp-python sdist into :func:`cache_dir` (once) and return it."""
    target = cache_dir() / BINARY
    if target.is_file():
        return target
    for tool in ("cmake", "c++"):
        if not shutil.which(tool):
            raise RuntimeError(f"building {BINARY} needs {tool}: install Debian's cmake and g++ (or build-essential)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-build-") as tmp:
        work, log = Path(tmp), target.parent / "build.log"
        log.write_text("")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", "--dest", str(work),
              f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], log)  # fmt: skip
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build_dir = work / "build"
        _run(["cmake", "-S", str(source), "-B", str(build_dir), *cmake_options()], log)
        _run(["cmake", "--build", str(build_dir), "--target", BINARY, "-j", str(jobs or os.cpu_count() or 1)], log)
        built = build_dir / "bin" / BINARY
        staged = target.with_name(BINARY + ".tmp")
        shutil.copy2(built, staged)
        staged.replace(target)  # whole or absent: an interrupted build leaves no binary behind
    return target


def install(prefix: Path) -> Path:
    """Build (or find in the cache) and link ``llama-server`` into ``prefix/bin``."""
    built = build()
    link = prefix / "bin" / BINARY
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(built)
    return link


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posttrain.platform.engines.llamacpp")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help=f"build {BINARY} (cached) and link it into this environment's bin")
    sub.add_parser("where", help=f"print the {BINARY} a deployment would run")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(install(Path(sys.prefix)))
    else:
        try:
            print(find_server(get_settings().llama_server))
        except LlamaCppMissing as exc:
            raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    main()
