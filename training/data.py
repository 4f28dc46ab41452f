"""SFT data: chats to token ids with assistant-only labels, and sequence packing.

    example = chat_example(tokenizer, [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])
    example.labels  # -100 everywhere except the assistant's tokens ("4<|im_end|>")
    rows = pack([example, ...], max_len=512)   # several examples per row, positions restart

Assistant spans are found on the rendered text (the chat template renders the
conversation up to each assistant turn; that prefix must be a prefix of the whole) and
mapped to tokens with the tokenizer's offsets, so any chat template and any fast
tokenizer work. The trailing newline a template puts after the end-of-turn token is
not trained on. In the plain completion format (a base model's), which has no end of turn, the
last answer is ended by the end-of-sequence token, trained on too: prompt and answer as text, then
EOS, as TRL trains a non-conversational dataset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import PreTrainedTokenizerBase

from posttrain.platform.engines.chat_template import completion_end, is_completion_format
from posttrain.platform.tasks.episodes import task_messages
from posttrain.platform.verifiers.models import TaskSpec

IGNORE = -100
Message = dict[str, Any]


@dataclass(frozen=True)
class SFTExample:
    input_ids: list[int]
    labels: list[int]  # aligned with input_ids: the token itself where trained, IGNORE elsewhere

    @property
    def trained_tokens(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE)


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T), aligned with input_ids
    position_ids: torch.Tensor  # (B, T), restarting at 0 for every packed example


def reference_messages(task: TaskSpec) -> list[Message]:
    """The task's prompt followed by its reference as the assistant's answer."""
    if task.reference is None:
        raise ValueError(f"task {task.task_id or task.domain!r} has no reference answer; SFT needs one")
    return [*task_messages(task), {"role": "assistant", "content": task.reference}]


def read_chat_jsonl(path: str | Path) -> list[list[Message]]:
    """One conversation per line: ``{"messages": [{"role": ..., "content": ...}, ...]}``."""
    chats = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            messages = record["messages"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: expected a JSON object with a 'messages' list ({exc})") from None
        if not any(m.get("role") == "assistant" for m in messages):
            raise ValueError(f"{path}:{number}: the conversation has no assistant message to train on")
        chats.append(messages)
    return chats


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
    return cast(str, text)


def assistant_spans(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of each assistant turn (content + end of turn; in the
    completion format, the last answer + the end-of-sequence token)."""
    text = _render(tokenizer, messages, add_generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:i], add_generation_prompt=True)) if i else 0
        through = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not text.startswith(through) or not through.startswith(text[:start]):
            raise ValueError(
                "the chat template does not render a conversation's turns as prefixes of it; cannot locate assistant tokens"
            )
        end = len(through.rstrip("\n"))
        spans.append((start, end))
    if is_completion_format(tokenizer) and messages and messages[-1]["role"] == "assistant":
        text = completion_end(text, tokenizer)  # the answer, then stop
        spans[-1] = (spans[-1][0], len(text))
    return text, spans


def chat_example(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], max_len: int | None = None
) -> SFTExample:
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = encoded["input_ids"]
    labels = [IGNORE] * len(ids)
    for index, (token_start, token_end) in enumerate(encoded["offset_mapping"]):
        if token_end > token_start and any(s <= token_start < e for s, e in spans):
            labels[index] = ids[index]
    if max_len is not None:
        ids, labels = ids[:max_len], labels[:max_len]
    return SFTExample(ids, labels)


def episode_example(
    prompt_ids: Sequence[int], token_ids: Sequence[int], loss_mask: Sequence[int], max_len: int | None = None
) -> SFTExample:
    """A multi-turn episode (sampled, stored or demonstrated) as an SFT example, token for token: trained
    on the policy's own tokens only (``loss_mask`` 1), the same tokens GRPO's loss covers; the prompt and
    whatever the environment put between the turns (tool output, turn markers) are context."""
    if len(token_ids) != len(loss_mask):
        raise ValueError(
            f"an episode has {len(token_ids)} tokens but {len(loss_mask)} loss-mask entries; they must match"
        )
    ids = [*prompt_ids, *token_ids]
    labels = [IGNORE] * len(prompt_ids) + [t if m else IGNORE for t, m in zip(token_ids, loss_mask)]
    if max_len is not None:
        ids, labels = ids[:max_len], labels[:max_len]
    return SFTExample(ids, labels)


def task_examples(
    tokenizer: PreTrainedTokenizerBase, tasks: Iterable[TaskSpec], max_len: int | None = None
) -> list[SFTExample]:
    return [chat_example(tokenizer, reference_messages(t), max_len) for t in tasks]


def pack(examples: Sequence[SFTExample], max_len: int) -> list[list[SFTExample]]:
    """Greedy packing in order: each row holds whole examples totalling at most ``max_len`` tokens."""
    rows: list[list[SFTExample]] = []
    current: list[SFTExample] = []
    used = 0
    for example in examples:
        if len(example.input_ids) > max_len:
            raise ValueError(
                f"an example has {len(example.input_ids)} tokens, over max_len={max_len}; truncate it or raise max_len"
            )
        if used + len(example.input_ids) > max_len and current:
            rows.append(current)
            current, used = [], 0
        current.append(example)
        used += len(example.input_ids)
    if current:
        rows.append(current)
    return rows


def collate(rows: Sequence[Sequence[SFTExample]], pad_id: int) -> PackedBatch:
    """Rows of packed examples to right-padded tensors.

    Padding forms its own segment (positions restart there too), so with
    ``attention_mask=None`` the model's packed-sequence masking keeps every example,
    and the padding, attending only within itself.
    """
    width = max(sum(len(e.input_ids) for e in row) for row in rows)
    ids, labels, positions = [], [], []
    for row in rows:
        r_ids: list[int] = []
        r_labels: list[int] = []
        r_pos: list[int] = []
        for example in row:
            r_ids += example.input_ids
            r_labels += example.labels
            r_pos += list(range(len(example.input_ids)))
        pad = width - len(r_ids)
        ids.append(r_ids + [pad_id] * pad)
        labels.append(r_labels + [IGNORE] * pad)
        positions.append(r_pos + list(range(pad)))
    return PackedBatch(torch.tensor(ids), torch.tensor(labels), torch.tensor(positions))
