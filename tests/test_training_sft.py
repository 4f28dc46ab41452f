"""SFT: assistant-only labels, packing without cross-talk, gradient accumulation, LoRA, resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from required_parts import require
from test_training_tiny import char_tokenizer, tiny_policy_dir

from posttrain.training.config import LoRAConfig, SFTConfig
from posttrain.training.data import IGNORE, chat_example, collate, pack, read_chat_jsonl
from posttrain.training.modeling import load_policy, token_logprobs
from posttrain.training.sft import sft_tasks, train_sft

CHAT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "B2"},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_policy_dir(tmp_path_factory.mktemp("sft") / "tiny")


def test_exactly_the_assistant_tokens_are_labelled() -> None:
    tokenizer = char_tokenizer()
    example = chat_example(tokenizer, CHAT)
    # <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nq<|im_end|>\n
    # <|im_start|>assistant\nB2<|im_end|>\n, one token per char: A=21 1=22 end=23, B=45 2=46 end=47
    trained = [i for i, label in enumerate(example.labels) if label != IGNORE]
    assert trained == [21, 22, 23, 45, 46, 47]
    assert len(example.input_ids) == 49
    assert tokenizer.decode([example.input_ids[i] for i in trained]) == "A1<|im_end|>B2<|im_end|>"
    assert all(example.labels[i] == example.input_ids[i] for i in trained)


def test_chat_jsonl_is_read_and_bad_lines_are_named(tmp_path: Path) -> None:
    good = tmp_path / "chats.jsonl"
    good.write_text('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}\n\n')
    assert len(read_chat_jsonl(good)) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: .*no assistant"):
        read_chat_jsonl(bad)


def test_each_domain_s_tasks_come_at_its_own_difficulty_and_unknown_domains_are_named() -> None:
    """``difficulties`` sets a domain's own level, as the evaluation that holds out its prompts does (units at 3: a
    unit conversion at level 2 is another prompt space); a level for a domain the run does not train on is refused."""
    from posttrain.platform.tasks.domains import generate

    config = SFTConfig(
        domains=["arith.add.int", "units.kg_to_g"], difficulty=2, difficulties={"units.kg_to_g": 3}, tasks_per_domain=4
    )
    tasks = sft_tasks(config)
    made = {domain: [t.prompt for t in tasks if t.domain == domain] for domain in config.domains}
    assert [t.prompt for t in generate("units.kg_to_g", 4, seed=1, difficulty=3)] == made["units.kg_to_g"]
    assert [t.prompt for t in generate("arith.add.int", 4, seed=0, difficulty=2)] == made["arith.add.int"]
    assert made["units.kg_to_g"] != [t.prompt for t in generate("units.kg_to_g", 4, seed=1, difficulty=2)]
    with pytest.raises(ValueError, match=r"difficulties names \['units.h_to_min'\], which domains does not list"):
        SFTConfig(domains=["arith.add.int"], difficulties={"units.h_to_min": 3})


def test_packed_rows_score_each_example_as_if_alone(tiny_dir: Path) -> None:
    model, tokenizer = load_policy(tiny_dir)
    first = chat_example(tokenizer, CHAT)
    second = chat_example(
        tokenizer, [{"role": "user", "content": "Copy: abc"}, {"role": "assistant", "content": "abc"}]
    )
    rows = pack([first, second, first], max_len=100)
    assert [len(r) for r in rows] == [2, 1]  # 49 + 39 fit in 100, the third does not
    batch = collate(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        packed = token_logprobs(model, batch.input_ids, None, position_ids=batch.position_ids)
        alone_1 = token_logprobs(model, torch.tensor([first.input_ids]))
        alone_2 = token_logprobs(model, torch.tensor([second.input_ids]))
    n1, n2 = len(first.input_ids), len(second.input_ids)
    torch.testing.assert_close(packed[0, : n1 - 1], alone_1[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[0, n1 : n1 + n2 - 1], alone_2[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1, : n1 - 1], alone_1[0], atol=1e-5, rtol=1e-5)  # padded row
    # the boundary token (first of example 2) is never a label
    assert batch.labels[0, n1].item() == IGNORE


def _params_after_one_step(tiny_dir: Path, micro: int, accum: int) -> tuple[float, dict[str, torch.Tensor]]:
    model, tokenizer = load_policy(tiny_dir)
    examples = [
        chat_example(tokenizer, [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}])
        for w in ("ab", "xyz1", "q", "hello")
    ]
    config = SFTConfig(
        max_steps=1, lr=1e-2, micro_batch_size=micro, grad_accum_steps=accum, packing=False, device="cpu"
    )
    result = train_sft(config, (model, tokenizer), examples)
    assert result.model is not None
    return result.metrics[0]["train/loss"], {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def test_gradient_accumulation_matches_one_big_batch(tiny_dir: Path) -> None:
    big_loss, big = _params_after_one_step(tiny_dir, micro=4, accum=1)
    accumulated_loss, accumulated = _params_after_one_step(tiny_dir, micro=1, accum=4)
    # examples of 1-4 answer tokens: per-micro-batch means would weigh them differently
    assert accumulated_loss == pytest.approx(big_loss, rel=1e-6)
    untouched, _ = load_policy(tiny_dir)
    moved = max((big[k] - v).abs().max().item() for k, v in untouched.state_dict().items())
    assert moved > 1e-3  # the step did something
    for name, value in big.items():
        # Adam's first step is ~lr * sign(grad): allow 1% of the 1e-2 step where a gradient is ~0
        torch.testing.assert_close(accumulated[name], value, atol=1e-4, rtol=1e-4)


def test_sft_learns_a_domain_and_resumes_to_the_same_losses(tiny_dir: Path, tmp_path: Path) -> None:
    base = dict(
        model=str(tiny_dir),
        domains=["str.copy.letters"],
        tasks_per_domain=64,
        lr=3e-3,
        micro_batch_size=4,
        max_seq_len=256,
        device="cpu",
    )
    straight = train_sft(SFTConfig(**base, max_steps=12, output_dir=str(tmp_path / "a")))
    losses = [m["train/loss"] for m in straight.metrics]
    assert losses[-1] < 0.8 * losses[0]
    assert straight.checkpoint is not None and straight.checkpoint.name == "step_00000012"

    train_sft(
        SFTConfig(**base, max_steps=12, output_dir=str(tmp_path / "b"), checkpoint_every=8), should_stop=_stop_after(8)
    )
    resumed = train_sft(SFTConfig(**base, max_steps=12, output_dir=str(tmp_path / "b")))
    assert resumed.steps == 12 and len(resumed.metrics) == 4
    assert [m["train/loss"] for m in resumed.metrics] == pytest.approx(losses[8:], rel=1e-5)


def _stop_after(n: int):  # type: ignore[no-untyped-def]
    calls = iter(range(10**6))
    return lambda: next(calls) >= n


def test_lora_trains_only_the_adapters(tiny_dir: Path) -> None:
    require("peft")
    base_model, tokenizer = load_policy(tiny_dir)
    before = {k: v.clone() for k, v in base_model.state_dict().items()}
    examples = [chat_example(tokenizer, CHAT)] * 4
    config = SFTConfig(max_steps=3, lr=1e-2, lora=LoRAConfig(r=4, alpha=8), device="cpu")
    result = train_sft(config, (base_model, tokenizer), examples)
    model = result.model
    assert model is not None
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    merged = model.merge_and_unload()  # type: ignore[operator]
    changed = [k for k, v in merged.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert changed and all(("proj" in k) for k in changed)  # only linear layers with adapters moved


@pytest.mark.parametrize("checkpointing", [False, True])
def test_rows_sharing_a_prefix_run_it_once_with_the_same_loss_and_gradients(
    tiny_dir: Path, checkpointing: bool
) -> None:
    """A pass's demonstrations that begin alike (a multi-turn episode's system prompt and tools) run the shared
    prefix once: the same summed loss and gradients as every row whole, with activation checkpointing or without;
    the prefix ends at the first token any row is trained on, and rows with nothing in common run whole."""
    from posttrain.training.data import SFTExample
    from posttrain.training.learner import MIN_SHARED_PREFIX, sft_loss_sum, sft_pass_loss, shared_prefix

    model, tokenizer = load_policy(tiny_dir)
    common = [int(t) for t in torch.randint(5, len(tokenizer), (24,), generator=torch.Generator().manual_seed(1))]

    def example(tail: list[int], trained_from: int) -> SFTExample:
        ids = common + tail
        return SFTExample(ids, [IGNORE if i < trained_from else t for i, t in enumerate(ids)])

    rows = [[example([7, 8, 9, 10], 26)], [example([11, 12], 25)], [example([13, 14, 15], 27)]]
    assert shared_prefix([r[0] for r in rows]) == 24 >= MIN_SHARED_PREFIX
    assert shared_prefix([example([7, 8], 20), example([9, 10], 26)]) == 20  # never past a trained token
    assert shared_prefix([example([7], 30), SFTExample([3] + common[1:] + [4], [IGNORE] * 25)]) == 0
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    model.train()
    cpu, found = torch.device("cpu"), []
    for loss_of in (
        lambda: sft_loss_sum(model, collate(rows, tokenizer.pad_token_id), cpu),
        lambda: sft_pass_loss(model, rows, tokenizer.pad_token_id, cpu),
    ):
        model.zero_grad()
        loss = loss_of()
        loss.backward()
        found.append((loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    (whole, whole_grad), (shared, shared_grad) = found
    assert whole > 0 and whole_grad.norm() > 0
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_grad, whole_grad, atol=1e-6, rtol=1e-4)
