"""Batched decoding for causal LMs with optional prompt-lookup (n-gram) speculation.

One loop serves both speed tiers. Each step feeds every live row its last
token plus up to ``num_speculative_tokens`` draft tokens copied from the
earliest earlier occurrence of its trailing n-gram (prompt lookup decoding).
A greedy row keeps the drafts the model itself would have produced and one
more token, so the output equals plain greedy decoding; rejected drafts are
cropped from the KV cache (or masked out when other rows kept more). Rows that
sample never draft.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Sequence:
    """One request's tokens; ``emit`` gets each batch of newly accepted token ids."""

    prompt_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int]
    emit: Callable[[list[int]], None] = lambda ids: None
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    generator: torch.Generator | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class SpeculationConfig:
    """Prompt-lookup drafting: 0 tokens disables it."""

    num_speculative_tokens: int = 0
    max_ngram: int = 3
    min_ngram: int = 1


def prompt_lookup_draft(tokens: list[int], cfg: SpeculationConfig) -> list[int]:
    """Find the longest trailing n-gram earlier in ``tokens``; return the tokens that followed it."""
    if cfg.num_speculative_tokens <= 0:
        return []
    n_tokens = len(tokens)
    for n in range(min(cfg.max_ngram, n_tokens - 1), cfg.min_ngram - 1, -1):
        tail = tokens[n_tokens - n :]
        # earliest match first: document text copied into the answer continues there
        for start in range(0, n_tokens - n):
            if tokens[start : start + n] == tail:
                follow = tokens[start + n : start + n + cfg.num_speculative_tokens]
                if follow:
                    return follow
    return []


def _choose(logits: torch.Tensor, seq: Sequence) -> int:
    if seq.params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / seq.params.temperature, dim=-1)
    if seq.params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < seq.params.top_p
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=seq.generator))


def accept_tokens(seq: Sequence, new_ids: list[int]) -> None:
    """Append tokens up to a stop token or the length limit and emit them."""
    kept: list[int] = []
    for tok in new_ids:
        kept.append(tok)
        if tok in seq.stop_token_ids:
            seq.finish_reason = "stop"
            break
        if len(seq.generated) + len(kept) >= seq.params.max_new_tokens:
            seq.finish_reason = "length"
            break
    seq.generated.extend(kept)
    if kept:
        seq.emit(kept)


def _forward(model: PreTrainedModel, cache: DynamicCache, **inputs: torch.Tensor) -> Any:
    """Call the model with its KV cache under whichever keyword this transformers version names it."""
    params = inspect.signature(model.forward).parameters
    key = "cache" if "cache" in params else "past_key_values"
    return model(**inputs, **{key: cache}, use_cache=True)


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel,
    seqs: list[Sequence],
    spec: SpeculationConfig = SpeculationConfig(),
    pad_token_id: int = 0,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Decode all ``seqs`` together until each stops; results land in each Sequence."""
    for seq in seqs:
        if seq.params.seed is not None and not seq.params.greedy:
            seq.generator = torch.Generator().manual_seed(seq.params.seed)
    device = model.device
    lengths = [len(s.prompt_ids) for s in seqs]
    width = max(lengths)
    input_ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        input_ids[row, width - lengths[row] :] = torch.tensor(seq.prompt_ids)
        mask[row, width - lengths[row] :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = _forward(
        model, cache, input_ids=input_ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device)
    )
    valid = torch.tensor(lengths)  # real tokens each row holds in the cache
    pending: list[int] = []  # each row's next input token (sampled, not yet in the cache)
    for row, seq in enumerate(seqs):
        tok = _choose(out.logits[row, -1], seq)
        pending.append(tok)
        accept_tokens(seq, [tok])
    live = [r for r, s in enumerate(seqs) if not s.finished]
    rows = list(range(len(seqs)))  # cache row -> seqs index

    while live and not should_stop():
        if len(live) < len(rows):  # drop finished rows from the cache
            keep = [rows.index(r) for r in live]
            index = torch.tensor(keep)
            cache.batch_select_indices(index.to(device))
            mask, valid = mask[index], valid[index]
            pending = [pending[i] for i in keep]
            rows = list(live)
        drafts = [
            prompt_lookup_draft(seqs[r].prompt_ids + seqs[r].generated, spec) if seqs[r].params.greedy else []
            for r in rows
        ]
        k = max(len(d) for d in drafts)
        step_ids = torch.full((len(rows), 1 + k), pad_token_id, dtype=torch.long)
        step_mask = torch.zeros((len(rows), 1 + k), dtype=torch.long)
        for i, draft in enumerate(drafts):
            step_ids[i, : 1 + len(draft)] = torch.tensor([pending[i], *draft])
            step_mask[i, : 1 + len(draft)] = 1
        step_pos = valid[:, None] + torch.arange(1 + k)[None, :]
        mask = torch.cat([mask, step_mask], dim=1)
        out = _forward(
            model, cache, input_ids=step_ids.to(device), attention_mask=mask.to(device), position_ids=step_pos.to(device)
        )
        logits = out.logits
        kept_per_row: list[int] = []
        for i, r in enumerate(rows):
            seq, draft = seqs[r], drafts[i]
            if seq.params.greedy:
                preds = torch.argmax(logits[i, : 1 + len(draft)], dim=-1).tolist()
                n = 0
                while n < len(draft) and draft[n] == preds[n]:
                    n += 1
                new_ids = draft[:n] + [preds[n]]
            else:
                n, new_ids = 0, [_choose(logits[i, 0], seq)]
            seq.draft_tokens += len(draft)
            seq.accepted_draft_tokens += n
            kept_per_row.append(1 + n)  # last input token + accepted drafts now valid in the cache
            pending[i] = new_ids[-1]
            accept_tokens(seq, new_ids)
        # rejected drafts: crop what no row kept, mask out the rest
        crop = 1 + k - max(kept_per_row)
        if crop:
            cache.crop(-crop)  # negative: remove that many trailing positions
            mask = mask[:, : mask.shape[1] - crop]
        for i, kept in enumerate(kept_per_row):
            mask[i, mask.shape[1] - (1 + k - crop) + kept :] = 0
        valid = valid + torch.tensor(kept_per_row)
        live = [r for r in rows if not seqs[r].finished]
    for seq in seqs:
        if not seq.finished:
            seq.finish_reason = "abort"
