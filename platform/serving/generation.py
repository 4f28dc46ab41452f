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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from posttrain.platform.models.loader import cache_keyword


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
    return model(**inputs, **{cache_keyword(model): cache}, use_cache=True)


def _mergeable(cache: DynamicCache) -> bool:
    """Rows can join a running batch only when every layer is a plain growing cache (no sliding window)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _left_pad(t: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """Pad dimension ``dim`` of ``t`` (the sequence: -2 for cache tensors, -1 for masks) on the left with zeros."""
    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class DecodeBatch:
    """A running batch that sequences can join between steps and leave as they finish (continuous batching).

    Each cache row holds one sequence's tokens left-padded to the batch width; ``mask`` marks the
    real positions and ``valid`` counts them, so a row's position ids do not depend on its
    neighbours. Joining prefills the newcomers as their own batch and splices their cache in
    (padding whichever side is shorter); leaving selects the remaining rows and trims padding
    columns that no row uses any more.
    """

    def __init__(self, model: PreTrainedModel, spec: SpeculationConfig = SpeculationConfig(), pad_token_id: int = 0) -> None:
        self.model, self.spec, self.pad_token_id = model, spec, pad_token_id
        self.device = model.device
        self.seqs: list[Sequence] = []  # one per cache row
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.valid = torch.zeros(0, dtype=torch.long)  # real tokens each row holds in the cache
        self.pending: list[int] = []  # each row's next input token (chosen, not yet in the cache)
        self._left: list[Sequence] = []  # finished rows that step() removed, for the next pop_finished

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def can_join(self) -> bool:
        """Whether sequences may join now (always when empty; else when the cache layout allows splicing)."""
        return self.cache is None or _mergeable(self.cache)

    @torch.inference_mode()
    def add(self, seqs: list[Sequence]) -> None:
        """Prefill ``seqs`` and add them to the batch; each gets its first token (and may finish at once)."""
        seqs = [s for s in seqs if not s.finished]
        if not seqs:
            return
        for seq in seqs:
            if seq.params.seed is not None and not seq.params.greedy:
                seq.generator = torch.Generator().manual_seed(seq.params.seed)
        lengths = [len(s.prompt_ids) for s in seqs]
        width = max(lengths)
        input_ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, seq in enumerate(seqs):
            input_ids[row, width - lengths[row] :] = torch.tensor(seq.prompt_ids)
            mask[row, width - lengths[row] :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = _forward(self.model, cache, input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                       position_ids=positions.to(self.device))
        pending = []
        for row, seq in enumerate(seqs):
            tok = _choose(out.logits[row, -1], seq)
            pending.append(tok)
            accept_tokens(seq, [tok])
        valid = torch.tensor(lengths)
        if self.cache is None:
            self.cache, self.mask, self.valid = cache, mask, valid
        else:
            if not (_mergeable(self.cache) and _mergeable(cache)):
                raise RuntimeError("this model's cache layout does not allow joining a running batch")
            total = max(self.mask.shape[1], width)
            for mine, theirs in zip(self.cache.layers, cache.layers):
                mine.keys = torch.cat([_left_pad(mine.keys, total), _left_pad(theirs.keys, total)], dim=0)
                mine.values = torch.cat([_left_pad(mine.values, total), _left_pad(theirs.values, total)], dim=0)
            self.mask = torch.cat([_left_pad(self.mask, total, -1), _left_pad(mask, total, -1)], dim=0)
            self.valid = torch.cat([self.valid, valid])
        self.seqs += seqs
        self.pending += pending

    def pop_finished(self) -> list[Sequence]:
        """Remove finished sequences (stopped, or aborted by their caller) from the batch and return them."""
        done, self._left = self._left + [s for s in self.seqs if s.finished], []
        keep = [i for i, s in enumerate(self.seqs) if not s.finished]
        if len(keep) == len(self.seqs):
            return done
        if not keep:
            self.seqs, self.pending, self.cache = [], [], None
            self.mask, self.valid = self.mask[:0, :0], self.valid[:0]
            return done
        index = torch.tensor(keep)
        assert self.cache is not None
        self.cache.batch_select_indices(index.to(self.device))
        self.mask, self.valid = self.mask[index], self.valid[index]
        self.seqs = [self.seqs[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]
        used = torch.nonzero(self.mask.any(dim=0))
        first = int(used[0]) if len(used) else 0
        if first and _mergeable(self.cache):  # padding columns no remaining row uses
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
            self.mask = self.mask[:, first:]
        return done

    @torch.inference_mode()
    def step(self) -> None:
        """One forward pass for every live row: its pending token plus its prompt-lookup drafts."""
        self._left = self.pop_finished()  # rows aborted since the last pop: returned by the next one
        if not self.seqs:
            return
        assert self.cache is not None
        seqs, spec = self.seqs, self.spec
        drafts = [prompt_lookup_draft(s.prompt_ids + s.generated, spec) if s.params.greedy else [] for s in seqs]
        k = max(len(d) for d in drafts)
        step_ids = torch.full((len(seqs), 1 + k), self.pad_token_id, dtype=torch.long)
        step_mask = torch.zeros((len(seqs), 1 + k), dtype=torch.long)
        for i, draft in enumerate(drafts):
            step_ids[i, : 1 + len(draft)] = torch.tensor([self.pending[i], *draft])
            step_mask[i, : 1 + len(draft)] = 1
        step_pos = self.valid[:, None] + torch.arange(1 + k)[None, :]
        mask = torch.cat([self.mask, step_mask], dim=1)
        out = _forward(self.model, self.cache, input_ids=step_ids.to(self.device), attention_mask=mask.to(self.device),
                       position_ids=step_pos.to(self.device))
        logits = out.logits
        kept_per_row: list[int] = []
        for i, seq in enumerate(seqs):
            draft = drafts[i]
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
            self.pending[i] = new_ids[-1]
            accept_tokens(seq, new_ids)
        # rejected drafts: crop what no row kept, mask out the rest
        crop = 1 + k - max(kept_per_row)
        if crop:
            self.cache.crop(-crop)  # negative: remove that many trailing positions
            mask = mask[:, : mask.shape[1] - crop]
        for i, kept in enumerate(kept_per_row):
            mask[i, mask.shape[1] - (1 + k - crop) + kept :] = 0
        self.mask = mask
        self.valid = self.valid + torch.tensor(kept_per_row)

    def abort(self) -> list[Sequence]:
        """Stop every sequence in the batch (finish reason ``abort``) and empty it."""
        for seq in self.seqs:
            if not seq.finished:
                seq.finish_reason = "abort"
        return self.pop_finished()


def generate_batch(
    model: PreTrainedModel,
    seqs: list[Sequence],
    spec: SpeculationConfig = SpeculationConfig(),
    pad_token_id: int = 0,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Decode all ``seqs`` together until each stops; results land in each Sequence."""
    batch = DecodeBatch(model, spec, pad_token_id)
    batch.add(seqs)
    batch.pop_finished()
    while len(batch) and not should_stop():
        batch.step()
        batch.pop_finished()
    batch.abort()
