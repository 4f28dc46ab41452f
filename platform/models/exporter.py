"""Export a model directory: as an ordinary Hugging Face directory, or as one GGUF file for llama.cpp.

    from posttrain.platform.models.exporter import export_model
    export_model("var/models/my-sft", "out/my-sft", "hf")                            # full weights, LoRA merged
    export_model("var/models/my-sft", "out/my-sft.Q8_0.gguf", "gguf")                 # 8-bit, about half of F16
    export_model("var/models/my-sft", "out/my-sft.F16.gguf", "gguf", outtype="f16")

``model_dir`` is a Hugging Face model directory or a peft LoRA adapter directory (one with
``adapter_config.json``, whose ``base_model_name_or_path`` names the local base directory); an
adapter is merged into its base first, so both formats always hold full weights.

GGUF export speaks llama.cpp's conventions (those of its ``convert_hf_to_gguf.py``): tensor
names from gguf-py's tensor map, the attention q/k rows of a ``llama`` model permuted the way
llama.cpp expects (transformers undoes exactly that permutation when it reads a llama GGUF),
Gemma 3's norms stored as the ``1 + w`` they apply, its sliding window written layer by layer
with the local layers' RoPE base, norms and biases in F32, the tokenizer (a byte-level BPE one
as ``gpt2`` with the ``tokenizer.ggml.pre`` name llama.cpp uses for its pre-tokenizer; a
SentencePiece-style one, spaces as ``▁`` and byte fallback, as ``llama`` with scores from its
merge order) and the chat template. Only ``llama``, ``qwen2`` and Gemma 3 text models can be
exported to GGUF; anything else is refused before any weights are read.

Every export is written next to ``out`` under a temporary name and renamed into place, so a
failed export leaves nothing at ``out``. Bad input fails with an :class:`ExportError` that
names the input and what to do.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from posttrain.platform.engines.inspect import ModelDirError, inspect_model_dir

ExportFormat = Literal["hf", "gguf"]
GgufType = Literal["f16", "q8_0"]
Progress = Callable[[float, str], None]

ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
Q8_0_BLOCK = 32

# llama.cpp's name for the split regex of Llama-3-style tokenizers (``llama-bpe``).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class ExportError(ValueError):
    """An export that cannot be done; the message names the input and the fix."""


@dataclass(frozen=True)
class GgufArch:
    """How one Hugging Face ``model_type`` is written as GGUF."""

    name: str  # general.architecture, as llama.cpp spells it
    permute_qk: bool  # llama.cpp's llama kernels expect q/k rows interleaved per head
    activation: str = "silu"  # the MLP's activation, the one llama.cpp's graph for the architecture applies
    norm_shift: float = 0.0  # added to every norm weight: Gemma's RMSNorm scales by 1 + w, llama.cpp's by w


GGUF_ARCHITECTURES: dict[str, GgufArch] = {
    "llama": GgufArch("llama", permute_qk=True),
    "qwen2": GgufArch("qwen2", permute_qk=False),
    "gemma3_text": GgufArch("gemma3", permute_qk=False, activation="gelu_pytorch_tanh", norm_shift=1.0),
}


# --- reading the source ------------------------------------------------------------------
def is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def adapter_base(path: Path) -> Path:
    """The local base model directory an adapter names (absolute, or relative to the adapter)."""
    config = json.loads((path / ADAPTER_CONFIG).read_text())
    named = config.get("base_model_name_or_path")
    if not named:
        raise ExportError(
            f"{path / ADAPTER_CONFIG} names no base_model_name_or_path; set it to the base model's directory"
        )
    base = Path(named).expanduser()
    base = base if base.is_absolute() else (path / base)
    if not (base / "config.json").is_file():
        raise ExportError(
            f"{path / ADAPTER_CONFIG} names base model {named!r}, which is not a local model directory "
            "(no config.json there); set base_model_name_or_path to the base model's directory"
        )
    return base.resolve()


def model_config_dir(model_dir: Path) -> Path:
    """The directory whose config.json describes the exported weights (an adapter's base)."""
    if not model_dir.is_dir():
        raise ExportError(f"{model_dir} does not exist; give a model directory or a LoRA adapter directory")
    if is_adapter_dir(model_dir):
        return adapter_base(model_dir)
    try:
        inspect_model_dir(model_dir)
    except ModelDirError as exc:
        raise ExportError(str(exc)) from None
    return model_dir


def _declared_dtype(config_dir: Path) -> Any:
    import torch  # heavy: this module stays light for the CLI and the job registry

    config = json.loads((config_dir / "config.json").read_text())
    declared = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return getattr(torch, declared, torch.float32)


def load_tokenizer_for(model_dir: Path) -> Any:
    """The adapter's own tokenizer when it saved one, else the model's (or base's)."""
    from posttrain.platform.engines.loader import load_tokenizer  # torch, transformers

    if is_adapter_dir(model_dir) and not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        return load_tokenizer(adapter_base(model_dir))
    return load_tokenizer(model_dir)


def load_full_model(model_dir: Path, report: Progress) -> Any:
    """The model with full weights in its declared dtype: an adapter is merged into its base."""
    from posttrain.platform.engines.loader import load_model  # torch, transformers

    config_dir = model_config_dir(model_dir)
    if inspect_model_dir(config_dir).is_vision:
        raise ExportError(
            f"{model_dir} is a vision-language model; exporting those (processor included) is not supported yet; "
            "copy the directory as it is"
        )
    dtype = _declared_dtype(config_dir)
    report(0.05, f"loading {config_dir.name} ({str(dtype).removeprefix('torch.')})")
    model = load_model(config_dir, dtype=dtype).model
    if config_dir != model_dir:
        from peft import PeftModel  # heavy: only to merge an adapter

        report(0.2, f"merging the LoRA adapter {model_dir.name}")
        model = PeftModel.from_pretrained(model, str(model_dir)).merge_and_unload()
    return model.eval()


# --- writing atomically ------------------------------------------------------------------
def _check_out(out: Path) -> None:
    if out.exists():
        raise ExportError(f"{out} exists already; remove it or choose another output path")


@contextmanager
def staged_path(out: Path, *, directory: bool) -> Iterator[Path]:
    """A temporary file or directory next to ``out``, renamed to ``out`` when the block succeeds."""
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        work = Path(name)
    try:
        yield work
        work.chmod(0o755 if directory else 0o644)
        os.replace(work, out)
    except BaseException:
        if work.is_dir():
            shutil.rmtree(work, ignore_errors=True)
        else:
            work.unlink(missing_ok=True)
        raise


# --- Hugging Face ----------------------------------------------------------------------------
def export_hf(model_dir: Path, out: Path, report: Progress) -> Path:
    """Weights as safetensors, the tokenizer, chat template and generation config."""
    _check_out(out)
    model = load_full_model(model_dir, report)
    tokenizer = load_tokenizer_for(model_dir)
    with staged_path(out, directory=True) as work:
        report(0.6, "writing the Hugging Face directory")
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
    return out


# --- GGUF: metadata ----------------------------------------------------------------------------
def gguf_arch(model_dir: Path, config_dir: Path) -> GgufArch:
    """The architecture's GGUF spelling, refusing what this exporter cannot write correctly."""
    config = json.loads((config_dir / "config.json").read_text())
    model_type = str(config.get("model_type", ""))
    arch = GGUF_ARCHITECTURES.get(model_type)
    declared = ", ".join(config.get("architectures") or []) or "no architectures listed"
    if arch is None or "vision_config" in config:
        raise ExportError(
            f"{model_dir} holds a {model_type or 'untyped'!r} model ({declared}); GGUF export supports "
            f"{', '.join(GGUF_ARCHITECTURES)} text models only; export it with fmt='hf' instead"
        )
    activation = config.get("hidden_activation") or config.get("hidden_act") or "silu"
    if activation != arch.activation:
        raise ExportError(
            f"{model_dir}: its MLP activation is {activation!r}; llama.cpp's {arch.name} applies "
            f"{arch.activation}; use fmt='hf'"
        )
    if model_type in ("llama", "gemma3_text") and (config.get("attention_bias") or config.get("mlp_bias")):
        raise ExportError(
            f"{model_dir}: a {model_type} model with attention/MLP biases does not round-trip through GGUF; use fmt='hf'"
        )
    if model_type == "gemma3_text":
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        scalar = config.get("query_pre_attn_scalar") or head_dim
        unlike = [what for what, differs in (
            (f"query_pre_attn_scalar={scalar} (llama.cpp scales queries by 1/sqrt(head_dim={head_dim}))", scalar != head_dim),
            ("attn_logit_softcapping (llama.cpp's gemma3 has none)", bool(config.get("attn_logit_softcapping"))),
            ("use_bidirectional_attention (llama.cpp's gemma3 is causal)", bool(config.get("use_bidirectional_attention"))),
        ) if differs]  # fmt: skip
        if unlike:
            raise ExportError(
                f"{model_dir}: a gemma3 model with {'; '.join(unlike)} does not run in llama.cpp as it does "
                "here; use fmt='hf'"
            )
    return arch


def rope_metadata(model_dir: Path, config: Any, layer_type: str = "full_attention") -> tuple[float, float | None]:
    """(rope theta, linear scaling factor or None) of one kind of layer (a model with sliding-window layers keeps
    RoPE parameters per kind); other RoPE scalings are refused."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if isinstance(params.get("full_attention"), dict):  # per kind of layer
        params = dict(params.get(layer_type) or {})
    theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind == "linear" and layer_type == "full_attention":
        return theta, float(params["factor"])
    raise ExportError(
        f"{model_dir}: RoPE scaling {kind!r} of its {layer_type} layers cannot be written to GGUF by this "
        "exporter; use fmt='hf'"
    )


def add_sliding_window(writer: Any, model_dir: Path, config: Any) -> None:
    """Which layers attend through the sliding window, layer by layer (llama.cpp would otherwise assume the family's
    usual pattern), its width, and those layers' own RoPE base."""
    layer_types = list(getattr(config, "layer_types", None) or [])
    sliding = [kind == "sliding_attention" for kind in layer_types]
    if not any(sliding) or not getattr(config, "sliding_window", None):
        return
    writer.add_sliding_window(int(config.sliding_window))
    writer.add_sliding_window_pattern(sliding)
    writer.add_rope_freq_base_swa(rope_metadata(model_dir, config, "sliding_attention")[0])


def add_hparams(writer: Any, model_dir: Path, config: Any) -> None:
    import gguf  # heavy (numpy): only for GGUF exports

    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    theta, linear = rope_metadata(model_dir, config)
    add_sliding_window(writer, model_dir, config)
    if softcap := getattr(config, "final_logit_softcapping", None):
        writer.add_final_logit_softcapping(float(softcap))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(getattr(config, "num_key_value_heads", None) or heads))
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    # always stated: a reader's default is not always hidden/heads (transformers' gemma3 config assumes 256)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if linear is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(linear)


# --- GGUF: tokenizer ----------------------------------------------------------------------------
def _steps(pre: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not pre:
        return []
    return list(pre["pretokenizers"]) if pre.get("type") == "Sequence" else [pre]


def _split_regex(step: dict[str, Any]) -> str | None:
    pattern = step.get("pattern") or {}
    return pattern.get("Regex") if step.get("type") == "Split" else None


def pre_tokenizer_name(model_dir: Path, backend: dict[str, Any]) -> str:
    """llama.cpp's ``tokenizer.ggml.pre`` for this pre-tokenizer, read from its structure.

    llama.cpp's converter recognises a tokenizer by the hash of one test string's ids, which
    only works for the exact published vocabularies; the structure names the same split for
    those and for locally trained tokenizers alike."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_SPLIT  # heavy: transformers

    steps = _steps(backend.get("pre_tokenizer"))
    kinds = [s.get("type") for s in steps]
    byte_level = steps[-1] if kinds and kinds[-1] == "ByteLevel" else None
    if byte_level is not None and not byte_level.get("add_prefix_space", False):
        regex = bool(byte_level.get("use_regex", True))
        if kinds == ["ByteLevel"] and regex:
            return "gpt-2"
        if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and regex:
            return "smollm"
        if kinds == ["Split", "ByteLevel"] and not regex:
            named = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama-bpe"}.get(_split_regex(steps[0]) or "")
            if named:
                return named
    raise ExportError(
        f"{model_dir}: its tokenizer's pre-tokenizer ({' + '.join(map(str, kinds)) or 'none'}) is not one llama.cpp "
        "knows (gpt-2, smollm, qwen2, llama-bpe); use fmt='hf'"
    )


def bpe_merges(model_dir: Path, backend: dict[str, Any]) -> list[str]:
    """Merges as "a b" strings; a space inside a piece is written as U+0120, as gguf-py does."""
    model = backend.get("model") or {}
    if model.get("type") != "BPE":
        raise ExportError(
            f"{model_dir}: its tokenizer is {model.get('type')!r}; GGUF export writes byte-level BPE "
            "tokenizers only; use fmt='hf'"
        )
    merges = model.get("merges") or []
    if merges and isinstance(merges[0], str):
        return list(merges)
    return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair) for pair in merges]


def _normalizers(backend: dict[str, Any]) -> list[dict[str, Any]]:
    norm = backend.get("normalizer")
    if not norm:
        return []
    return list(norm["normalizers"]) if norm.get("type") == "Sequence" else [norm]


def spm_space_prefix(model_dir: Path, backend: dict[str, Any]) -> bool | None:
    """Whether a SentencePiece-style tokenizer (BPE over the whole text with its spaces written ``▁``, bytes it cannot
    spell as ``<0xNN>`` tokens), which llama.cpp runs as its ``llama`` tokenizer, prepends a ``▁`` to the text; None
    for a tokenizer that is not one (byte-level BPE goes as ``gpt2``)."""
    model = backend.get("model") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        return None
    kinds = [
        (n.get("type"), n.get("prepend") or (n.get("pattern") or {}).get("String"), n.get("content"))
        for n in _normalizers(backend)
    ]
    pre = backend.get("pre_tokenizer")
    # Gemma's split on " " finds nothing once the normalizer has replaced every space
    pre_noop = pre is None or (pre.get("type") == "Split" and (pre.get("pattern") or {}).get("String") == " ")
    if pre_noop and kinds == [("Replace", " ", "▁")]:
        return False
    if pre_noop and kinds == [("Prepend", "▁", None), ("Replace", " ", "▁")]:
        return True
    raise ExportError(
        f"{model_dir}: its tokenizer is byte-fallback BPE with normalizer {[k[0] for k in kinds]} and pre-tokenizer "
        f"{(pre or {}).get('type')}, not a SentencePiece layout llama.cpp runs (spaces replaced by '▁', optionally "
        "prepended); use fmt='hf'"
    )


def spm_scores(backend: dict[str, Any], tokens: list[str]) -> list[float]:
    """llama.cpp's ``llama`` tokenizer merges the adjacent pair whose joined token scores highest: each token scored by
    the rank of the first merge that makes it, so that it merges in the order the model's own tokenizer does; a token
    no merge makes scores below every merge (one character long, it is never the join of two)."""
    first: dict[str, int] = {}
    for rank, pair in enumerate((backend.get("model") or {}).get("merges") or []):
        left, right = pair.split(" ", 1) if isinstance(pair, str) else pair
        first.setdefault(left + right, rank)
    unmade = len(first) + 1
    return [-float(first[t]) if t in first else -float(unmade + i) for i, t in enumerate(tokens)]


def _looks_special(token: str) -> bool:
    return (token.startswith("<|") and token.endswith("|>")) or token in ("<pad>", "<mask>")


def token_table(
    model_dir: Path, tokenizer: Any, vocab_size: int, byte_fallback: bool = False
) -> tuple[list[str], list[int]]:
    """Every id's token and type: control for special added tokens, user-defined for other
    added ones, byte for a byte-fallback tokenizer's ``<0xNN>``, unused ``[PADn]`` for ids the
    model has but the tokenizer does not."""
    import gguf  # gguf: only for GGUF exports

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    if reverse and max(reverse) >= vocab_size:
        raise ExportError(
            f"{model_dir}: the tokenizer has id {max(reverse)} but the model only {vocab_size} embeddings; "
            "fix vocab_size in config.json"
        )
    added = tokenizer.added_tokens_decoder
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            control = added[i].special or _looks_special(reverse[i])
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            byte = byte_fallback and re.fullmatch(r"<0x[0-9A-F]{2}>", reverse[i])
            types.append(gguf.TokenType.BYTE if byte else gguf.TokenType.NORMAL)
    return tokens, types


def _first_id(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def special_ids(tokenizer: Any, config: Any) -> dict[str, int | None]:
    """bos/eos/unk/pad ids, from the tokenizer first and the model config where it has none."""

    def pick(kind: str) -> int | None:
        own = getattr(tokenizer, f"{kind}_token_id", None)
        return _first_id(own if own is not None else getattr(config, f"{kind}_token_id", None))

    return {kind: pick(kind) for kind in ("bos", "eos", "unk", "pad")}


def add_tokenizer(writer: Any, model_dir: Path, tokenizer: Any, config: Any) -> None:
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    space_prefix = spm_space_prefix(model_dir, backend)
    tokens, types = token_table(model_dir, tokenizer, int(config.vocab_size), byte_fallback=space_prefix is not None)
    if space_prefix is None:  # byte-level BPE: its merges
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre_tokenizer_name(model_dir, backend))
        writer.add_token_merges(bpe_merges(model_dir, backend))
    else:  # SentencePiece-style: scores from the merge order
        writer.add_tokenizer_model("llama")
        writer.add_token_scores(spm_scores(backend, tokens))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    ids = special_ids(tokenizer, config)
    for kind, token_id in ids.items():
        if token_id is not None:
            getattr(writer, f"add_{kind}_token_id")(token_id)
    plain, marked = tokenizer.encode("a", add_special_tokens=False), tokenizer.encode("a", add_special_tokens=True)
    extra = len(marked) > len(plain)  # what encoding adds around the text, as llama.cpp must
    writer.add_add_bos_token(extra and ids["bos"] is not None and marked[0] == ids["bos"])
    writer.add_add_eos_token(extra and ids["eos"] is not None and marked[-1] == ids["eos"])
    writer.add_add_space_prefix(bool(space_prefix))
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = [{"name": k, "template": v} for k, v in template.items()]
    if template:
        writer.add_chat_template(template)


# --- GGUF: tensors ------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedTensor:
    hf_name: str
    name: str
    shape: tuple[int, ...]
    qtype: Any  # gguf.GGMLQuantizationType


def tensor_qtype(name: str, shape: tuple[int, ...], outtype: GgufType) -> Any:
    """F32 for norms and biases; F16 or Q8_0 for matrices (Q8_0 rows must be whole 32-blocks)."""
    from gguf import GGMLQuantizationType as Q  # gguf: only for GGUF exports

    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return Q.F32
    if outtype == "q8_0" and shape[-1] % Q8_0_BLOCK == 0:
        return Q.Q8_0
    return Q.F16


def plan_tensors(
    model_dir: Path, state: dict[str, Any], config: Any, arch: GgufArch, outtype: GgufType
) -> list[PlannedTensor]:
    import gguf  # gguf: only for GGUF exports

    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch.name)
    names = gguf.get_tensor_name_map(arch_enum, int(config.num_hidden_layers))
    tied = bool(getattr(config, "tie_word_embeddings", False))
    planned: list[PlannedTensor] = []
    for hf_name, tensor in state.items():
        if hf_name.endswith("rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(
                f"{model_dir}: tensor {hf_name!r} has no GGUF name for {arch.name}; "
                f"this is not a plain {arch.name} model; use fmt='hf'"
            )
        shape = tuple(int(d) for d in tensor.shape)
        planned.append(PlannedTensor(hf_name, name, shape, tensor_qtype(name, shape, outtype)))
    return planned


def permute_for_llama(weights: Any, n_head: int) -> Any:
    """llama.cpp's q/k row order for ``llama``: each head's rotary halves interleaved."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def tensor_data(planned: PlannedTensor, state: dict[str, Any], config: Any, arch: GgufArch) -> Any:
    import gguf  # gguf: only for GGUF exports

    array = state[planned.hf_name].detach().to("cpu").float().numpy()
    if arch.norm_shift and planned.name.endswith("_norm.weight"):
        array = array + arch.norm_shift
    if arch.permute_qk and ".attn_q." in planned.name:
        array = permute_for_llama(array, int(config.num_attention_heads))
    elif arch.permute_qk and ".attn_k." in planned.name:
        array = permute_for_llama(
            array, int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        )
    return gguf.quants.quantize(array, planned.qtype)


def declare_tensor(writer: Any, planned: PlannedTensor) -> None:
    """Tensor info ahead of the data, so tensors can be converted and written one at a time."""
    import numpy as np  # with gguf: only for GGUF exports
    from gguf import GGMLQuantizationType as Q
    from gguf import quant_shape_to_byte_shape

    if planned.qtype == Q.Q8_0:
        byte_shape = quant_shape_to_byte_shape(planned.shape, planned.qtype)
        writer.add_tensor_info(
            planned.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=planned.qtype
        )
    else:
        dtype = np.dtype(np.float32 if planned.qtype == Q.F32 else np.float16)
        writer.add_tensor_info(planned.name, planned.shape, dtype, int(np.prod(planned.shape)) * dtype.itemsize)


# --- GGUF: the file ------------------------------------------------------------------------------
@dataclass(frozen=True)
class GgufSource:
    """What one GGUF file is written from: the full model's config, state and tokenizer."""

    model_dir: Path
    arch: GgufArch
    config: Any
    state: dict[str, Any]
    tokenizer: Any


def add_metadata(writer: Any, source: GgufSource, outtype: GgufType) -> None:
    import gguf  # gguf: only for GGUF exports

    file_type = gguf.LlamaFileType.MOSTLY_Q8_0 if outtype == "q8_0" else gguf.LlamaFileType.MOSTLY_F16
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(source.model_dir.name)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_hparams(writer, source.model_dir, source.config)
    add_tokenizer(writer, source.model_dir, source.tokenizer, source.config)


def write_gguf(
    path: Path, source: GgufSource, planned: list[PlannedTensor], outtype: GgufType, report: Progress
) -> None:
    """Metadata and tensor infos first, then each tensor converted and written on its own."""
    import gguf  # gguf, torch: only for GGUF exports
    import torch

    writer = gguf.GGUFWriter(path, source.arch.name)
    try:
        add_metadata(writer, source, outtype)
        for item in planned:
            declare_tensor(writer, item)
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with torch.inference_mode():
            for index, item in enumerate(planned):
                writer.write_tensor_data(tensor_data(item, source.state, source.config, source.arch))
                report(0.3 + 0.65 * (index + 1) / len(planned), f"wrote {item.name} ({item.qtype.name})")
    finally:
        writer.close()


def export_gguf(model_dir: Path, out: Path, outtype: GgufType, report: Progress) -> Path:
    _check_out(out)
    arch = gguf_arch(model_dir, model_config_dir(model_dir))  # refuses before any weights are read
    model = load_full_model(model_dir, report)
    source = GgufSource(model_dir, arch, model.config, model.state_dict(), load_tokenizer_for(model_dir))
    planned = plan_tensors(model_dir, source.state, source.config, arch, outtype)
    with staged_path(out, directory=False) as work:
        write_gguf(work, source, planned, outtype, report)
    return out


# --- the one entry point ---------------------------------------------------------------------------
def export_model(
    model_dir: str | Path,
    out: str | Path,
    fmt: ExportFormat,
    *,
    outtype: GgufType = "q8_0",
    progress: Progress | None = None,
) -> Path:
    """Export ``model_dir`` (a model or a LoRA adapter directory) to ``out``; returns ``out``."""
    report: Progress = progress or (lambda fraction, message: None)
    source, target = Path(model_dir).expanduser(), Path(out).expanduser()
    if fmt not in get_args(ExportFormat):
        raise ExportError(
            f"unknown export format {fmt!r} for {source}; choose one of: {', '.join(get_args(ExportFormat))}"
        )
    if outtype not in get_args(GgufType):
        raise ExportError(f"unknown GGUF type {outtype!r} for {source}; choose one of: {', '.join(get_args(GgufType))}")
    if fmt == "hf":
        result = export_hf(source, target, report)
    else:
        result = export_gguf(source, target, outtype, report)
    report(1.0, f"exported {source.name} to {result}")
    return result


def serve_elsewhere(name: str, fmt: str, path: str) -> dict[str, str]:
    """How to serve an export outside posttrain: one shell snippet per runtime, keyed by the runtime's name
    (GGUF: llama.cpp's ``llama-server`` and Ollama; a Hugging Face directory: vLLM and transformers)."""
    quoted = shlex.quote(path)
    if fmt == "gguf":
        tag = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "model"
        return {
            "llama.cpp": f"llama-server -m {quoted} --host 127.0.0.1 --port 8080   # OpenAI API at http://127.0.0.1:8080/v1",
            "Ollama": f"printf 'FROM %s\\n' {quoted} > Modelfile && ollama create {tag} -f Modelfile && ollama run {tag}",
        }
    return {
        "vLLM": f"vllm serve {quoted} --served-model-name {shlex.quote(name)}   # OpenAI API at http://127.0.0.1:8000/v1",
        "transformers": f"python -c \"from transformers import pipeline; print(pipeline('text-generation', {path!r})"
        f"([{{'role': 'user', 'content': 'Hello'}}], max_new_tokens=32))\"",
    }
