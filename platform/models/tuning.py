"""A quick supervised fine-tune that makes a tiny model produce given completions.

Randomly initialised models emit noise; tests and benchmarks that need a
specific, checkable behaviour (a tool call, an answer copied from a document)
teach it in a few dozen steps here. The server then generates for real.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.platform.models.loader import load_model


@dataclass
class ChatExample:
    """Messages rendered with the model's chat template; ``completion`` is what the assistant should say."""

    messages: list[dict[str, Any]]
    completion: str
    tools: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def memorize(
    model_dir: str | os.PathLike[str], examples: list[ChatExample], *, steps: int = 60, lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Fine-tune the text model in ``model_dir`` on ``examples`` (loss on completions only) and save it back.

    Returns the loss per step. Completions end with the tokenizer's EOS token so generation stops.
    """
    loaded = load_model(model_dir)
    tok, model = loaded.tokenizer, loaded.model
    rows: list[tuple[list[int], int]] = []
    for ex in examples:
        prompt = tok.apply_chat_template(ex.messages, tools=ex.tools, add_generation_prompt=True, tokenize=False)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tok(ex.completion + tok.eos_token, add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids + answer_ids, len(prompt_ids)))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
        mask[i, : len(ids)] = 1
    torch.manual_seed(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses: list[float] = []
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    model.save_pretrained(model_dir)
    return losses
