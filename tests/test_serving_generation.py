"""The decode loop: prompt-lookup speculation and batching never change greedy output."""

from __future__ import annotations

import pytest
import torch

from posttrain.platform.engines import LoadedModel, load_model
from posttrain.platform.engines.generation import (
    DecodeBatch,
    SamplingParams,
    Sequence,
    SpeculationConfig,
    generate_batch,
    prompt_lookup_draft,
)
from posttrain.platform.models import TinyModelSpec, build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    spec = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, seed=3)
    return load_model(build_tiny_model(tmp_path_factory.mktemp("g") / "m", spec))


def test_prompt_lookup_draft_copies_what_followed_the_ngram() -> None:
    cfg = SpeculationConfig(num_speculative_tokens=3, max_ngram=2)
    assert prompt_lookup_draft([5, 6, 7, 8, 9, 1, 5, 6], cfg) == [7, 8, 9]
    assert prompt_lookup_draft([1, 2, 3], cfg) == []
    assert prompt_lookup_draft([5, 6, 7, 8, 9, 1, 5, 6], SpeculationConfig(0)) == []


def _prompts(m: LoadedModel) -> list[list[int]]:
    doc = "The invoice total amount for the Paris customer is 4520 and the payment date is 2026-03-14. "
    qs = ["What is the total?", "Who is the customer?", "When is the payment date for the order?"]
    texts = [
        m.tokenizer.apply_chat_template(
            [{"role": "user", "content": doc * (i + 1) + q}], add_generation_prompt=True, tokenize=False
        )
        for i, q in enumerate(qs)
    ]
    return [m.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _run(m: LoadedModel, prompts: list[list[int]], spec: SpeculationConfig, together: bool) -> list[Sequence]:
    seqs = [Sequence(p, SamplingParams(max_new_tokens=40), frozenset(m.eos_token_ids)) for p in prompts]
    groups = [seqs] if together else [[s] for s in seqs]
    for g in groups:
        generate_batch(m.model, g, spec, pad_token_id=m.tokenizer.pad_token_id)
    return seqs


def test_every_mode_matches_transformers_greedy(tiny: LoadedModel) -> None:
    prompts = _prompts(tiny)
    reference = []
    for p in prompts:
        out = tiny.model.generate(
            torch.tensor([p]),
            max_new_tokens=40,
            do_sample=False,
            eos_token_id=tiny.eos_token_ids,
            pad_token_id=tiny.tokenizer.pad_token_id,
        )
        reference.append(out[0, len(p) :].tolist())
    for spec in (SpeculationConfig(0), SpeculationConfig(6)):
        for together in (False, True):
            seqs = _run(tiny, prompts, spec, together)
            assert [s.generated for s in seqs] == reference, (spec, together)
            if spec.num_speculative_tokens:
                assert sum(s.accepted_draft_tokens for s in seqs) > 0


def test_a_common_prefix_is_prefilled_once_and_gives_what_whole_prompts_give(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts that start alike (the chat template, the same document): that start runs once for one row, and
    every row's logits and cache of real tokens equal those of prefilling its whole prompt."""
    from posttrain.platform.engines import generation

    prompts = _prompts(tiny)
    shared = generation._common_prefix(prompts)
    assert shared >= generation.SHARED_PREFIX_MIN
    batch = DecodeBatch(tiny.model, pad_token_id=tiny.tokenizer.pad_token_id)
    seen: list[tuple[int, int]] = []
    hook = tiny.model.get_input_embeddings().register_forward_pre_hook(
        lambda _m, args: seen.append(tuple(args[0].shape))
    )
    with torch.inference_mode():
        cache, mask, logits = batch._prefill(prompts)
        hook.remove()
        monkeypatch.setattr(generation, "SHARED_PREFIX_MIN", 10**9)
        whole_cache, whole_mask, whole_logits = batch._prefill(prompts)
    longest_rest = max(len(p) for p in prompts) - shared
    assert seen == [(1, shared), (3, longest_rest)] and bool(mask[:, :shared].all())
    torch.testing.assert_close(logits[:, -1], whole_logits[:, -1], rtol=1e-4, atol=1e-4)
    for ours, theirs in zip(cache.layers, whole_cache.layers):
        for row in range(len(prompts)):
            for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
                torch.testing.assert_close(
                    a[row][:, mask[row].bool()], b[row][:, whole_mask[row].bool()], rtol=1e-4, atol=1e-4
                )


def test_sampling_is_reproducible_with_a_seed(tiny: LoadedModel) -> None:
    p = _prompts(tiny)[0]
    runs = []
    for _ in range(2):
        seq = Sequence(p, SamplingParams(max_new_tokens=12, temperature=1.0, seed=7), frozenset())
        generate_batch(tiny.model, [seq], SpeculationConfig(4))
        runs.append(seq.generated)
        assert seq.draft_tokens == 0 and seq.finish_reason == "length"
    assert runs[0] == runs[1]


@pytest.mark.parametrize("draft_tokens", [0, 6])
def test_sequences_joining_and_leaving_a_running_batch_keep_greedy_output(tiny: LoadedModel, draft_tokens: int) -> None:
    """Continuous batching: rows join mid-decode (longer and shorter than the running ones) and
    leave early (short max_new_tokens, so padding columns get trimmed); every row's output is the
    one it gets decoded alone."""
    prompts = _prompts(tiny)
    budgets = [40, 8, 20, 30]
    prompts = [prompts[1], prompts[0], prompts[2], prompts[0][:-3]]
    alone = []
    for p, n in zip(prompts, budgets):
        seq = Sequence(p, SamplingParams(max_new_tokens=n), frozenset(tiny.eos_token_ids))
        generate_batch(tiny.model, [seq], SpeculationConfig(draft_tokens), pad_token_id=tiny.tokenizer.pad_token_id)
        alone.append(seq.generated)

    batch = DecodeBatch(tiny.model, SpeculationConfig(draft_tokens), pad_token_id=tiny.tokenizer.pad_token_id)
    seqs = [
        Sequence(p, SamplingParams(max_new_tokens=n), frozenset(tiny.eos_token_ids)) for p, n in zip(prompts, budgets)
    ]
    joins = {0: [seqs[0]], 2: [seqs[1]], 5: [seqs[2]], 12: [seqs[3]]}  # step -> sequences joining before it
    finished, step = [], 0
    while step in joins or step < max(joins) or len(batch):
        batch.add(joins.get(step, []))
        finished += batch.pop_finished()
        batch.step()
        finished += batch.pop_finished()
        # padding that no remaining row uses is trimmed (the longest row leaves before the others)
        assert not len(batch) or bool(batch.mask[:, 0].any()), step
        step += 1
    assert [s.generated for s in seqs] == alone
    assert {id(s) for s in finished} == {id(s) for s in seqs}
    assert all(s.finish_reason in ("stop", "length") for s in seqs)
    assert len(batch) == 0 and batch.cache is None
