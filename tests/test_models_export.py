"""Exports of the real model round-trip: GGUF (F16, Q8_0) back through the importer, HF with LoRA merged.

The acceptance is the transformers round trip: export, import the file again through
``import_model`` (transformers dequantises it, undoing llama.cpp's q/k permutation), and
generate greedily on the same prompts as the original.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from conftest import OPERATOR
from required_parts import require

from posttrain.platform.engines.loader import LoadedModel, load_model
from posttrain.platform.models.exporter import ExportError, export_model
from posttrain.platform.models.importer import import_model

PROMPTS = [
    "What is the capital of France?",
    "What is 12 + 35?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "Translate 'good morning' into Spanish.",
    "What is the boiling point of water in Celsius?",
    "List the first five prime numbers.",
    "Explain in one sentence what a computer is.",
]
MAX_NEW_TOKENS = 24
TOKENIZER_PROBES = [
    "Order 1234567 shipped on 2026-03-14 for $4,520.99.",
    "ünïcødé ✓ 東京 🚀 naïve café — “quotes”",
    "def square(x: int) -> int:\n    return x ** 2  # squared\n\n\tprint(square(12))",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "   leading spaces, trailing tabs\t\t\n\n",
    "I've been told he's there; 3.14159 and 3...3",
]


def greedy(loaded: LoadedModel, prompt: str) -> list[int]:
    """The new token ids of a greedy chat-template generation."""
    tok = loaded.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = loaded.model.generate(
            **ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=loaded.eos_token_ids,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else loaded.eos_token_ids[0],
        )  # fmt: skip
    return out[0, ids["input_ids"].shape[1] :].tolist()


def agreeing_prefix(reference: list[int], other: list[int]) -> int:
    """How many tokens agree position by position before the first divergence."""
    count = 0
    for a, b in zip(reference, other):
        if a != b:
            break
        count += 1
    return count


@pytest.fixture(scope="module")
def reference(real_model: LoadedModel) -> list[list[int]]:
    return [greedy(real_model, p) for p in PROMPTS]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, real_model_dir: Any) -> dict[str, Path]:
    """Both GGUF exports of the real model, written once for the module."""
    root = tmp_path_factory.mktemp("exports")
    files: dict[str, Path] = {}
    outtype: Literal["f16", "q8_0"]
    for outtype in ("f16", "q8_0"):
        steps: list[float] = []
        out = root / f"smollm2.{outtype}.gguf"
        files[outtype] = export_model(
            real_model_dir.path, out, "gguf", outtype=outtype, progress=lambda f, m: steps.append(f)
        )
        assert steps == sorted(steps) and steps[-1] == 1.0  # progress only moves forward
    return files


def reimport(path: Path, suffix: str, real_model_dir: Any, tmp_path: Path) -> LoadedModel:
    row = import_model(
        OPERATOR,
        path,
        name=f"{real_model_dir.name}-export-{suffix}",
        url=real_model_dir.url,
        dest_root=tmp_path / "models",
    )
    return load_model(row.path)


def test_gguf_f16_round_trip_generates_identically(exports: dict[str, Path], real_model: LoadedModel, real_model_dir: Any,
                                                   reference: list[list[int]], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """F16 export -> import_model -> greedy tokens identical to the original on every prompt;
    the tokenizer gives the same ids on digits, unicode, code and special tokens; same template. The import parses
    the file's metadata once, for its description and each of transformers' loads (config, tokenizer, weights)."""
    import gguf

    parsed: list[str] = []
    parse = gguf.gguf_reader.GGUFReader.__init__

    def counted(self: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        parsed.append(str(path))
        parse(self, path, *args, **kwargs)

    monkeypatch.setattr(gguf.gguf_reader.GGUFReader, "__init__", counted)
    back = reimport(exports["f16"], "f16", real_model_dir, tmp_path)
    assert [Path(p).resolve() for p in parsed] == [exports["f16"].resolve()], parsed
    monkeypatch.undo()
    generated = [greedy(back, p) for p in PROMPTS]
    same = sum(g == r for g, r in zip(generated, reference))
    assert same == len(PROMPTS), f"{same}/{len(PROMPTS)} prompts identical: {generated} vs {reference}"
    original, reread = real_model.tokenizer, back.tokenizer
    for text in TOKENIZER_PROBES:
        for special in (False, True):
            assert reread.encode(text, add_special_tokens=special) == original.encode(
                text, add_special_tokens=special
            ), text
    assert reread.encode("<|im_start|>", add_special_tokens=False) == [original.convert_tokens_to_ids("<|im_start|>")]
    assert reread.chat_template == original.chat_template
    assert back.model.config.tie_word_embeddings and back.eos_token_ids == real_model.eos_token_ids


def teacher_forced_agreement(original: LoadedModel, other: LoadedModel, prompt: str, continuation: list[int]) -> int:
    """At how many positions of the original's continuation ``other``, fed the same tokens so far,
    picks the same next token (one forward pass; a near-tie flip costs one position, not the rest)."""
    tok = original.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    with torch.inference_mode():
        picks = other.model(full).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
    return int((picks == torch.tensor(continuation)).sum())


def test_gguf_q8_0_round_trip_mostly_agrees_and_is_smaller(exports: dict[str, Path], real_model: LoadedModel, real_model_dir: Any,
                                                           reference: list[list[int]], tmp_path: Path) -> None:  # fmt: skip
    """Q8_0 export -> import_model -> greedy generation, with two measures over the original's
    greedy continuations (all prompts pooled, divided by the original's token count):

    * teacher-forced agreement, at least 95%: at each position, fed the original's tokens so far,
      does the Q8_0 model pick the same next token;
    * free-running agreement, at least 80%: per prompt, the tokens of its own greedy generation
      that equal the original's position by position up to the first divergence.

    The second compounds: one near-tie flip (the divergences seen here are at logit margins of
    0.04-0.2) discards the rest of that prompt, so it sits lower (94% on these prompts) and moves
    in steps of several percent. The file is smaller than the F16 one."""
    back = reimport(exports["q8_0"], "q8", real_model_dir, tmp_path)
    total = sum(len(r) for r in reference)
    forced = sum(teacher_forced_agreement(real_model, back, p, r) for p, r in zip(PROMPTS, reference))
    free = sum(agreeing_prefix(r, greedy(back, p)) for p, r in zip(PROMPTS, reference))
    assert forced / total >= 0.95, f"Q8_0 teacher-forced agreement {forced}/{total}"
    assert free / total >= 0.80, f"Q8_0 free-running agreement {free}/{total}"
    assert exports["q8_0"].stat().st_size < 0.6 * exports["f16"].stat().st_size


def test_hf_export_loads_and_generates_the_same(
    real_model_dir: Any, reference: list[list[int]], tmp_path: Path
) -> None:
    out = export_model(real_model_dir.path, tmp_path / "hf", "hf")
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
        "generation_config.json",
    } <= names
    loaded = load_model(out)
    assert [greedy(loaded, p) for p in PROMPTS[:3]] == reference[:3]


def _lora_adapter(base: Path, out: Path) -> Any:
    """A LoRA adapter on a fresh copy of the real model, with small random non-zero B weights."""
    from peft import LoraConfig, get_peft_model

    model = load_model(base).model
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    peft_model.save_pretrained(out)
    config_file = out / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": str(base)}))
    return peft_model.eval()


def test_hf_export_merges_a_lora_adapter(real_model: LoadedModel, real_model_dir: Any, tmp_path: Path) -> None:
    require("peft")
    peft_model = _lora_adapter(real_model_dir.path, tmp_path / "adapter")
    out = export_model(tmp_path / "adapter", tmp_path / "merged", "hf")
    names = {p.name for p in out.iterdir()}
    assert (
        not any(n.startswith("adapter_") for n in names) and "model.safetensors" in names and "tokenizer.json" in names
    )
    merged = load_model(out)
    ids = real_model.tokenizer("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        expected = peft_model(**ids).logits
        got = merged.model(**ids).logits
        base = real_model.model(**ids).logits
    assert not torch.allclose(expected, base, atol=1e-3)  # the adapter changes the model
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_of_tiny_models_reads_back_in_transformers(arch: str, tmp_path: Path) -> None:
    """A locally built model exported as F16 GGUF and read back by transformers directly: same
    logits, same token ids (its tokenizer is plain byte-level, ``tokenizer.ggml.pre`` gpt-2).
    q/k weights are scaled up so attention is sharp (at init it is nearly uniform, and a wrong
    q/k row order would change the logits by only ~5e-3; scaled, by ~0.5), and qwen2's attention
    biases are made non-zero."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    shape = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
    spec = TinyModelSpec(architecture=arch, **shape)  # type: ignore[arg-type]
    source = load_model(build_tiny_model(tmp_path / arch, spec))
    with torch.no_grad():
        for name, param in source.model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(10.0)
    source.model.save_pretrained(tmp_path / arch)
    out = export_model(tmp_path / arch, tmp_path / "gguf" / f"{arch}.gguf", "gguf", outtype="f16")
    reader = gguf.GGUFReader(str(out))
    assert reader.get_field("general.architecture").contents() == arch  # type: ignore[union-attr]
    assert reader.get_field("tokenizer.ggml.pre").contents() == "gpt-2"  # type: ignore[union-attr]
    assert ("blk.0.attn_q.bias" in {t.name for t in reader.tensors}) == (arch == "qwen2")
    back = AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name, dtype=torch.float32)
    back_tok = AutoTokenizer.from_pretrained(str(out.parent), gguf_file=out.name)
    text = 'Invoice 4520 for Paris: <tool_call>{"a": 1}</tool_call> ünïcødé. The invoice total is 42 for Paris.'
    ids = source.tokenizer(text, return_tensors="pt")["input_ids"]
    assert back_tok.encode(text) == ids[0].tolist()
    with torch.inference_mode():
        torch.testing.assert_close(back(ids).logits, source.model(ids).logits, atol=3e-3, rtol=1e-3)


class Cancelled(Exception):
    pass


def test_bad_input_is_refused_and_failures_leave_nothing(real_model_dir: Any, tmp_path: Path) -> None:
    other = tmp_path / "neox"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(real_model_dir.path / name, other / name)
    config = json.loads((real_model_dir.path / "config.json").read_text())
    (other / "config.json").write_text(
        json.dumps({**config, "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]})
    )
    out = tmp_path / "out" / "neox.gguf"
    with pytest.raises(ExportError, match=r"neox.*'gpt_neox' model \(GPTNeoXForCausalLM\).*llama, qwen2.*fmt='hf'"):
        export_model(other, out, "gguf")
    assert not out.exists()

    adapter = tmp_path / "orphan-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(ExportError, match="base_model_name_or_path"):
        export_model(adapter, tmp_path / "out" / "orphan", "hf")
    with pytest.raises(ExportError, match="choose one of: f16, q8_0"):
        export_model(real_model_dir.path, out, "gguf", outtype="q4_k")  # type: ignore[arg-type]

    def cancel_midway(fraction: float, message: str) -> None:
        if fraction > 0.5:
            raise Cancelled(message)

    with pytest.raises(Cancelled):
        export_model(real_model_dir.path, out, "gguf", progress=cancel_midway)
    assert list(out.parent.iterdir()) == []  # neither the file nor its temporary

    out.write_bytes(b"keep me")
    with pytest.raises(ExportError, match="exists already"):
        export_model(real_model_dir.path, out, "gguf")
    assert out.read_bytes() == b"keep me"
