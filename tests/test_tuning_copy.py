"""Teaching a tiny model from a stream of fresh examples: the loop, the loss, the curricula, the schedule.

The whole quoting curriculum (``teach_quoting``: a few minutes of CPU) is exercised by
``bench/serving.py``, which reports how many unseen documents the taught model quotes verbatim.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from drills import (
    ChatExample,
    QuotingRecipe,
    TokenExample,
    copy_drill_batches,
    memorize,
    quote_batches,
    quote_cases,
    sft_example,
    teach,
    teach_quoting,
)

from posttrain.platform.engines import load_model
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.training.data import collate
from posttrain.training.learner import sft_loss_sum
from posttrain.training.optim import lr_at

SPEC = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return build_tiny_model(tmp_path / "tiny", SPEC)


def test_completion_loss_equals_the_model_loss(tiny: Path) -> None:
    """The SFT loop's loss (the output projection only where there is a label) is the model's own loss."""
    loaded = load_model(tiny)
    examples = [*next(quote_batches(seed=3, batch_size=2)), TokenExample.completion([5, 9, 11], [12, 13])]
    rows = [[sft_example(loaded.tokenizer, ex)] for ex in examples]
    batch = collate(rows, loaded.tokenizer.pad_token_id)
    mask = torch.tensor(
        [[1] * len(r[0].input_ids) + [0] * (batch.input_ids.shape[1] - len(r[0].input_ids)) for r in rows]
    )
    tokens = int((batch.labels[:, 1:] != -100).sum())
    with torch.no_grad():
        expected = loaded.model(input_ids=batch.input_ids, attention_mask=mask, labels=batch.labels).loss
        got = sft_loss_sum(loaded.model, batch, torch.device("cpu")) / tokens
    assert torch.allclose(got, expected, rtol=1e-5), (float(got), float(expected))
    # labels only on the completions: the prompt of every row is masked
    assert int((batch.labels != -100).sum()) < int(mask.sum()) // 3


def test_quote_cases_quote_one_sentence_of_their_own_document() -> None:
    for case in quote_cases(50, seed=11):
        sentences = [s + "." for s in case.document.split(". ") if s]
        sentences[-1] = sentences[-1].removesuffix(".")
        assert case.answer in sentences
        openings = [" ".join(s.split()[:3]) for s in sentences]
        assert len(set(openings)) == len(openings)  # the question names exactly one sentence
        assert f'"{" ".join(case.answer.split()[:3])}"' in case.question
        assert 3 <= len(sentences) <= 5


def test_training_stream_never_repeats_and_never_holds_the_evaluation_documents() -> None:
    stream = itertools.islice(quote_batches(seed=1, batch_size=16), 200)
    trained = [ex.extra["document"] for batch in stream for ex in batch]
    assert len(set(trained)) == len(trained) == 3200
    evaluated = {c.document for c in quote_cases(50, seed=1_000_003)}
    assert not evaluated & set(trained)
    # the same seed gives the same stream: a run can be reproduced
    again = next(quote_batches(seed=1, batch_size=16))
    assert [ex.extra["document"] for ex in again] == trained[:16]


def test_copy_drill_rows_repeat_a_span_seen_earlier() -> None:
    vocab = list(range(10, 1000))
    batches = copy_drill_batches(vocab, seed=0, batch_size=8, lookback_steps=2)
    for row in next(batches):  # look-back rows: u v u, the loss on every third token
        assert row.ids[0::3] == row.ids[2::3] and row.targets == [False, False, True] * 15
    next(batches)
    for row in next(batches):
        n = sum(row.targets)
        assert 12 <= n <= 24 and row.targets[-n:] == [True] * n  # the loss on the recurrence, at the end
        span, before = row.ids[-n:], row.ids[:-n]
        assert any(before[i : i + n] == span for i in range(len(before) - n + 1))


def test_stream_teaching_lowers_the_loss_on_documents_it_never_saw_twice(tiny: Path) -> None:
    before = load_model(tiny).model.state_dict()["model.embed_tokens.weight"].clone()
    losses = teach(tiny, quote_batches(seed=5, batch_size=4), steps=40, lr=3e-3, warmup_steps=5)
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.6 * losses[0], losses
    after = load_model(tiny).model.state_dict()["model.embed_tokens.weight"]
    assert not torch.equal(before, after)  # saved back to the directory


def test_memorize_is_the_same_loop_on_fixed_examples(tiny: Path) -> None:
    examples = [
        ChatExample([{"role": "user", "content": "Say the code."}], "The code is 4417."),
        ChatExample([{"role": "user", "content": "Say the city."}], "The city is Rome."),
    ]
    losses = memorize(tiny, examples, steps=40)
    assert losses[-1] < 0.1 * losses[0], losses


def test_teach_refuses_a_stream_that_runs_dry_and_a_recipe_without_quoting(tiny: Path) -> None:
    with pytest.raises(ValueError, match="ended after 3 of 5 steps"):
        teach(tiny, [next(quote_batches(seed=0, batch_size=2))] * 3, steps=5)
    with pytest.raises(ValueError, match="quote_steps=0 must be at least 1"):
        teach_quoting(tiny, QuotingRecipe(quote_steps=0))


def test_teach_stops_when_asked(tiny: Path) -> None:
    losses = teach(tiny, quote_batches(seed=0, batch_size=2), steps=50, stop_when=lambda seen: len(seen) == 3)
    assert len(losses) == 3


def test_learning_rate_warms_up_holds_then_decays() -> None:
    lrs = [lr_at(s, 100, 1.0, 10, "wsd") for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(lr == 1.0 for lr in lrs[10:75])
    assert all(a >= b for a, b in zip(lrs[75:], lrs[76:])) and lrs[-1] < 0.15
    cosine = [lr_at(s, 100, 1.0, 10, "cosine") for s in range(100)]
    assert cosine[50] < 0.8 and cosine[-1] < 0.15
    assert [lr_at(s, 100, 1.0, 0, "constant") for s in (0, 99)] == [1.0, 1.0]
