"""Quick supervised fine-tunes that give a tiny model a specific, checkable behaviour.

Randomly initialised models emit noise; tests and benchmarks that need a
behaviour (a tool call, an answer quoted from a document) teach it here, then
the server generates for real. :func:`teach` runs the platform's one SFT loop on a
stream of batches:

- :func:`memorize` feeds it the same few examples every step (the model learns
  those exact completions);
- :func:`teach_quoting` feeds it a copy drill, then a fresh batch of random
  documents every step (:func:`quote_batches`), so the model cannot memorise
  answers and has to learn the skill itself: quoting, from the document in its
  prompt, the sentence the question names. It then quotes from documents it
  has never seen.

    path = build_tiny_model("var/models/quoter", TinyModelSpec(hidden_size=128, num_layers=2,
                                                               intermediate_size=256))
    run = teach_quoting(path)  # a few minutes of CPU
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.platform.engines.loader import load_tokenizer
from posttrain.training.data import IGNORE, SFTExample
from posttrain.training.optim import Schedule


@dataclass
class ChatExample:
    """Messages rendered with the model's chat template; ``completion`` is what the assistant should say."""

    messages: list[dict[str, Any]]
    completion: str
    tools: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenExample:
    """An already tokenised row (no chat template, no EOS added): the loss is on the ``targets`` positions."""

    ids: list[int]
    targets: list[bool]

    @classmethod
    def completion(cls, prompt_ids: list[int], completion_ids: list[int]) -> TokenExample:
        """The loss on ``completion_ids``, after ``prompt_ids``."""
        return cls(prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids))


Example = ChatExample | TokenExample


def sft_example(tok: Any, example: Example) -> SFTExample:
    """``example`` as the SFT loop's row: prompt + completion (+ EOS for a chat example), labels on the completion."""
    if isinstance(example, TokenExample):
        return SFTExample(example.ids, [i if t else IGNORE for i, t in zip(example.ids, example.targets)])
    prompt = tok.apply_chat_template(example.messages, tools=example.tools, add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tok(example.completion + tok.eos_token, add_special_tokens=False)["input_ids"]
    return SFTExample(prompt_ids + answer_ids, [IGNORE] * len(prompt_ids) + answer_ids)


def teach(
    model_dir: str | os.PathLike[str],
    batches: Iterable[Sequence[Example]],
    *,
    steps: int,
    lr: float = 2e-3,
    warmup_steps: int = 0,
    schedule: Schedule = "cosine",
    max_grad_norm: float | None = 1.0,
    weight_decay: float = 0.0,
    seed: int = 0,
    num_threads: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
    stop_when: Callable[[list[float]], bool] | None = None,
) -> list[float]:
    """Fine-tune the text model in ``model_dir`` on ``steps`` batches from ``batches`` and save it back.

    The platform's one SFT loop (:func:`posttrain.training.sft.train_sft`), one batch a step, loss on
    completions only; each chat completion ends with the tokenizer's EOS token so that generation
    stops. ``batches`` may repeat the same examples (:func:`memorize`) or draw new ones every step
    (:func:`quote_batches`). Returns the loss per step; ``on_step(step, loss)`` (0-based) reports
    progress, and ``stop_when(losses)``, asked after every step, may end training early (a skill
    learned). A decaying ``schedule`` ends at a tenth of ``lr``. ``num_threads`` sets torch's
    intra-op threads for the duration (restored after): a small model's many small operations run
    several times faster on one thread than on two cores shared with other work.
    """
    from posttrain.training.config import SFTConfig
    from posttrain.training.sft import train_sft

    if steps < 1:
        raise ValueError(f"steps={steps}: teach needs at least one step")
    tok = load_tokenizer(model_dir)
    rows = ([[sft_example(tok, ex)] for ex in batch] for batch in batches)
    config = SFTConfig(
        model=str(model_dir),
        max_steps=steps,
        lr=lr,
        warmup_steps=warmup_steps,
        lr_schedule=schedule,
        min_lr_ratio=0.1,
        max_grad_norm=max_grad_norm,
        weight_decay=weight_decay,
        seed=seed,
        micro_batch_size=1 << 20,
        packing=False,
        device="cpu",
        resume=False,
    )
    losses: list[float] = []

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        losses.append(metrics["train/loss"])
        if on_step is not None:
            on_step(step - 1, losses[-1])

    with _intra_op_threads(num_threads):
        result = train_sft(
            config,
            batches=rows,
            on_metrics=on_metrics,
            should_stop=lambda: bool(losses) and stop_when is not None and stop_when(losses),
        )
    assert result.model is not None
    result.model.eval()
    result.model.save_pretrained(model_dir)
    return losses


@contextlib.contextmanager
def _intra_op_threads(n: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def memorize(
    model_dir: str | os.PathLike[str],
    examples: list[Example],
    *,
    steps: int = 60,
    lr: float = 3e-3,
    seed: int = 0,
    until_said: bool = True,
) -> list[float]:
    """Fine-tune the text model in ``model_dir`` on ``examples`` (all of them every step) and save it back.

    Constant learning rate, no clipping: a few dozen steps make a tiny model say exactly these completions. With
    ``until_said`` it stops once it says them: when a step's summed loss over every completion token is under half
    of ln 2, each of those tokens had a probability over 0.7, so greedy decoding gives each completion whole (at
    most ``steps`` steps; False: all of them). Returns the loss per step.
    """
    tok = load_tokenizer(model_dir)
    rows = [sft_example(tok, ex) for ex in examples]  # tokenised once, not again every step
    fixed = [TokenExample(r.input_ids, [label != IGNORE for label in r.labels]) for r in rows]
    tokens = sum(sum(label != IGNORE for label in r.labels[1:]) for r in rows)
    return teach(
        model_dir,
        itertools.repeat(fixed),
        steps=steps,
        lr=lr,
        schedule="constant",
        max_grad_norm=None,
        seed=seed,
        stop_when=(lambda losses: losses[-1] * tokens < math.log(2) / 2) if until_said else None,
    )


# --- quoting from a document: a stream of fresh examples --------------------------------------------

ITEMS = ("invoice", "contract", "order", "report", "account", "payment")
CITIES = ("Paris", "London", "Berlin", "Tokyo", "Madrid", "Rome")
# Each document uses each template at most once, so the words before a value (the context an induction
# head matches on) mostly occur once per document: quoting is copying, not guessing between sentences.
_SENTENCES = (
    "for the {city} customer has a total amount of {amount} euros.",
    "was signed in {city} on 2026-{month:02d}-{day:02d} by the sales team.",
    "lists {qty} items at a rate of {pct} percent.",
    "from the {city} office is due in {days} days with a cost of {amount} dollars.",
    "shows a balance of {amount} and a profit of {pct} percent in quarter {quarter}.",
)


@dataclass(frozen=True)
class QuoteCase:
    """A document, the question that names one of its sentences, and that sentence (the answer)."""

    document: str
    question: str
    answer: str

    @property
    def prompt(self) -> str:
        return f"Document:\n{self.document}\n\nQuestion: {self.question}"

    def example(self) -> ChatExample:
        return ChatExample([{"role": "user", "content": self.prompt}], self.answer, extra={"document": self.document})


def quote_case(rng: random.Random, sentences: int | tuple[int, int] = (3, 5)) -> QuoteCase:
    """A random document of several sentences, each opening with a distinct "The <item> <number>"."""
    n = sentences if isinstance(sentences, int) else rng.randint(*sentences)
    if not 1 <= n <= len(_SENTENCES):
        raise ValueError(f"sentences={sentences}: a document holds 1 to {len(_SENTENCES)} sentences")
    keys: set[tuple[str, int]] = set()
    while len(keys) < n:
        keys.add((rng.choice(ITEMS), rng.randint(100, 999)))
    lines = []
    for (item, number), template in zip(sorted(keys, key=lambda _: rng.random()), rng.sample(_SENTENCES, n)):
        body = template.format(
            city=rng.choice(CITIES),
            amount=rng.randint(1000, 99999),
            qty=rng.randint(2, 99),
            pct=rng.randint(1, 30),
            month=rng.randint(1, 12),
            day=rng.randint(1, 28),
            days=rng.randint(5, 90),
            quarter=rng.randint(1, 4),
        )
        lines.append(f"The {item} {number} {body}")
    target = rng.randrange(n)
    opening = " ".join(lines[target].split()[:3])
    return QuoteCase(" ".join(lines), f'quote the sentence that begins with "{opening}".', lines[target])


def quote_cases(n: int, seed: int, sentences: int | tuple[int, int] = (3, 5)) -> list[QuoteCase]:
    rng = random.Random(seed)
    return [quote_case(rng, sentences) for _ in range(n)]


def quote_batches(seed: int, batch_size: int, sentences: int | tuple[int, int] = (3, 5)) -> Iterator[list[ChatExample]]:
    """An endless stream of fresh batches (a new random document per example, never repeated on purpose)."""
    rng = random.Random(seed)
    while True:
        yield [quote_case(rng, sentences).example() for _ in range(batch_size)]


def copy_drill_batches(
    vocab: Sequence[int],
    seed: int,
    batch_size: int,
    span: tuple[int, int] = (12, 24),
    noise: int = 20,
    lookback_steps: int = 200,
) -> Iterator[list[TokenExample]]:
    """Random token spans that recur later in the same row: predicting the recurrence needs an induction head.

    The first ``lookback_steps`` batches are rows of ``u v u`` triples, the loss on each third token: a
    previous-token head, half of an induction circuit, forms from them within a couple of hundred steps. Then
    each row is ``noise, span, noise, span`` with random lengths, the loss on the second ``span``. Nothing
    about the tokens can be memorised, only the skill of continuing a sequence seen earlier in the context,
    which a hidden-128, 2-layer model picks up in about a thousand steps of this drill (document questions
    alone, where most answer tokens are predictable without looking back, had not taught it in 800).
    """
    rng = random.Random(seed)
    ids = list(vocab)

    def draw(n: int) -> list[int]:
        return [rng.choice(ids) for _ in range(n)]

    for _ in range(lookback_steps):  # u v u: the third token repeats the one before the last
        yield [
            TokenExample([t for u, v in (draw(2) for _ in range(15)) for t in (u, v, u)], [False, False, True] * 15)
            for _ in range(batch_size)
        ]
    while True:
        batch = []
        for _ in range(batch_size):
            x = draw(rng.randint(*span))
            batch.append(TokenExample.completion(draw(rng.randint(0, noise)) + x + draw(rng.randint(0, noise)), x))
        yield batch


@dataclass
class QuotingRecipe:
    """How :func:`teach_quoting` trains: a copy drill that forms induction heads, then document questions.

    The drill runs until its loss shows that the model copies (the mean of the last ``drill_window`` losses
    below ``drill_mastered_loss``: what remains is mostly each span's unpredictable first token), at most
    ``max_drill_steps``; when that happens varies with the seed (about 700 to 1,100 steps here). Then
    ``quote_steps`` of document questions, the learning rate constant after warm-up and decaying over the
    last quarter. The defaults take a hidden-128, 2-layer model from random weights to quoting unseen
    documents in two to four minutes of a 2-core CPU.
    """

    max_drill_steps: int = 1400
    drill_batch_size: int = 16
    drill_mastered_loss: float = 1.5
    drill_window: int = 10
    lookback_steps: int = 200
    quote_steps: int = 500
    quote_batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 30
    sentences: tuple[int, int] = (3, 5)
    seed: int = 0
    num_threads: int | None = 1  # see teach(): one thread is the fast choice for a model this small


@dataclass
class QuotingRun:
    """What :func:`teach_quoting` did: the loss per step of each phase, and whether the drill was mastered."""

    drill_losses: list[float]
    quote_losses: list[float]
    drill_mastered: bool

    @property
    def losses(self) -> list[float]:
        return self.drill_losses + self.quote_losses


def teach_quoting(
    model_dir: str | os.PathLike[str],
    recipe: QuotingRecipe | None = None,
    *,
    on_step: Callable[[int, float], None] | None = None,
    seen_documents: set[str] | None = None,
) -> QuotingRun:
    """Teach the model in ``model_dir`` to answer "quote the sentence that begins with ..." from its document.

    First the copy drill (:func:`copy_drill_batches`: random tokens, the model learns to continue what it saw
    earlier in its context), then ``quote_steps`` batches of fresh random documents (:func:`quote_batches`).
    Every training document is added to ``seen_documents`` when given, so that an evaluation can show its
    documents were never trained on. ``on_step(step, loss)`` counts steps across both phases.
    """
    recipe = recipe or QuotingRecipe()
    if recipe.quote_steps < 1 or recipe.max_drill_steps <= recipe.lookback_steps + recipe.drill_window:
        raise ValueError(
            f"quote_steps={recipe.quote_steps} must be at least 1 and max_drill_steps="
            f"{recipe.max_drill_steps} above lookback_steps + drill_window"
        )
    tok = load_tokenizer(model_dir)
    reserved = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
    vocab = [i for i in range(len(tok)) if i not in reserved]

    def mastered(losses: list[float]) -> bool:
        return (
            len(losses) > recipe.lookback_steps + recipe.drill_window
            and statistics.fmean(losses[-recipe.drill_window :]) < recipe.drill_mastered_loss
        )

    drill = teach(
        model_dir,
        copy_drill_batches(vocab, recipe.seed, recipe.drill_batch_size, lookback_steps=recipe.lookback_steps),
        steps=recipe.max_drill_steps,
        lr=recipe.lr,
        warmup_steps=recipe.warmup_steps,
        schedule="constant",
        seed=recipe.seed,
        num_threads=recipe.num_threads,
        on_step=on_step,
        stop_when=mastered,
    )
    quotes: Iterable[list[ChatExample]] = quote_batches(recipe.seed + 1, recipe.quote_batch_size, recipe.sentences)
    if seen_documents is not None:
        quotes = _recording(quotes, seen_documents)

    def on_quote_step(step: int, loss: float) -> None:
        if on_step is not None:
            on_step(len(drill) + step, loss)

    quote = teach(
        model_dir,
        quotes,
        steps=recipe.quote_steps,
        lr=recipe.lr,
        warmup_steps=10,
        schedule="wsd",
        seed=recipe.seed,
        num_threads=recipe.num_threads,
        on_step=on_quote_step,
    )
    return QuotingRun(drill, quote, mastered(drill))


def _recording(batches: Iterable[list[ChatExample]], documents: set[str]) -> Iterator[list[ChatExample]]:
    for batch in batches:
        documents.update(ex.extra["document"] for ex in batch)
        yield batch
