"""Batched decoding for causal LMs with optional prompt-lookup (n-gram) speculation.

One loop serves both speed tiers. Each step feeds every live row its last
token plus up to ``num_speculative_tokens`` draft tokens copied from the
earliest earlier occurrence of its trailing n-gram (prompt lookup decoding).
A greedy row keeps the drafts the model itself would have produced and one
more token, so the output equals plain greedy decoding; rejected drafts are
cropped from the KV cache (or masked out when other rows kept more). Rows that
sample never draft.

Rollouts use the same loop: sequences can record the log-prob of every token they accept
(``SamplingParams.logprobs``: log-softmax of the logits over the temperature, the untruncated
distribution; off by default, so serving computes nothing extra), and :meth:`DecodeBatch.add_groups`
adds groups of sequences that share a prompt, prefilled once with the KV cache repeated for each
member. Sampling rows that share a generator and settings draw their tokens in one batched call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from posttrain.platform.engines.loader import cache_keyword, forward_parameters
from posttrain.platform.engines.q8 import FusedLayers

log = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = False  # record each accepted token's log-prob in Sequence.logprobs
    # the API's log-probs: of the model's own distribution (before the temperature), as vLLM reports them; with
    # top_logprobs > 0 also the most likely tokens at each position (Sequence.top_logprobs)
    raw_logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False  # also score the prompt's tokens (Sequence.prompt_logprobs; the first has none)
    # OpenAI's logits processing, as vLLM applies it: over the tokens generated so far, minus presence_penalty once
    # for each token that occurred and frequency_penalty for each time; logit_bias added by token id
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    # the answer starts with one of these token sequences (a guided choice: tool_choice required picks a function's
    # name so); free after it
    starts: list[list[int]] | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def processed(self) -> bool:
        """Whether the logits are changed before choosing (such a row draws no speculative drafts)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias or self.starts)


def allowed_next(starts: list[list[int]], generated: list[int]) -> list[int] | None:
    """The tokens that keep ``generated`` on one of ``starts``; None once one of them is complete (or none fits)."""
    n = len(generated)
    if any(len(start) <= n and start == generated[: len(start)] for start in starts):
        return None
    allowed = sorted({start[n] for start in starts if len(start) > n and start[:n] == generated})
    return allowed or None


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
    logprobs: list[float] = field(default_factory=list)  # one per generated token when params.logprobs
    top_logprobs: list[list[tuple[int, float]]] = field(
        default_factory=list
    )  # per generated token, params.top_logprobs
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]] | None] = field(
        default_factory=list
    )  # per prompt token
    prefix: KVPrefix | None = None  # the KV cache of a start of prompt_ids, computed before: only the rest is prefilled
    keep_kv: bool = (
        False  # leave this sequence's KV cache in ``kv`` when it finishes (for a prompt that goes on from it)
    )
    kv: KVPrefix | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class KVPrefix:
    """The KV cache of one sequence's tokens ``token_ids``, a row per layer (keys, values; heads, tokens, dim): what
    a finished sequence leaves for a later prompt that starts with those tokens, such as the next turn of an
    episode (its earlier turns, the policy's last reply, then what the environment added)."""

    token_ids: tuple[int, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return sum(k.nelement() * k.element_size() + v.nelement() * v.element_size() for k, v in self.layers)


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


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row of ``probs`` beyond the smallest head whose mass reaches ``top_p``
    (the nucleus ``generate``'s top-p warper keeps: a token stays when the mass before it is below ``top_p``)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)


def _choose(logits: torch.Tensor, seq: Sequence) -> int:
    if seq.params.greedy:
        return int(torch.argmax(logits))
    probs = _top_p_filter(torch.softmax(logits.float() / seq.params.temperature, dim=-1), seq.params.top_p)
    return int(torch.multinomial(probs, 1, generator=seq.generator))


def processed_logits(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """``logits`` (rows, vocab) after each row's penalties and logit bias (:attr:`SamplingParams.processed`); the
    same tensor when no row has any."""
    rows = [i for i, s in enumerate(seqs) if s.params.processed]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        params, generated = seqs[i].params, seqs[i].generated
        if generated and (params.presence_penalty or params.frequency_penalty):
            ids, counts = torch.tensor(generated, device=logits.device).unique(return_counts=True)
            logits[i, ids] -= params.presence_penalty + params.frequency_penalty * counts.to(logits.dtype)
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=logits.device)
            logits[i, ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=logits.device)
        if params.starts and (allowed := allowed_next(params.starts, generated)) is not None:
            keep = torch.full_like(logits[i], float("-inf"))
            keep[allowed] = 0.0
            logits[i] += keep
    return logits


def choose_tokens(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """The next token of each sequence from its row of ``logits`` (rows, vocab), after its penalties and bias:
    argmax for greedy rows; sampled rows that share a generator, temperature and top-p draw in one batched call."""
    logits = processed_logits(logits, seqs)
    chosen = [0] * len(seqs)
    together: dict[tuple[int, float, float], list[int]] = {}
    for row, seq in enumerate(seqs):
        if seq.params.greedy:
            chosen[row] = int(torch.argmax(logits[row]))
        else:
            together.setdefault((id(seq.generator), seq.params.temperature, seq.params.top_p), []).append(row)
    for rows in together.values():
        first = seqs[rows[0]]
        if len(rows) == 1:
            chosen[rows[0]] = _choose(logits[rows[0]], first)
            continue
        probs = _top_p_filter(
            torch.softmax(logits[rows].float() / first.params.temperature, dim=-1), first.params.top_p
        )
        for row, tok in zip(rows, _draw(probs, first.generator)):
            chosen[row] = tok
    return chosen


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    """One index per row of ``probs`` (unnormalised), drawn in proportion to it by inverse-CDF
    sampling: one uniform per row against the row's float64 running sums (a zero-probability index
    is never picked). Drawing one number per row instead of one per vocabulary entry makes this a
    fraction of ``torch.multinomial``'s cost on CPU for a large vocabulary."""
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device, generator=generator)
    index = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return index.clamp(max=probs.shape[-1] - 1).squeeze(-1).tolist()


def _scored(
    logits: torch.Tensor, ids: list[int], seqs: list[Sequence]
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """For row ``j`` of ``logits`` (rows, vocab): the log-prob of ``ids[j]`` under ``seqs[j]``'s distribution (its
    temperature's, the untruncated sampling distribution; temperature 1 for greedy rows and raw log-probs), and its
    ``top_logprobs`` most likely tokens with theirs."""
    scale = torch.tensor([s.params.temperature if s.params.temperature > 0 and not s.params.raw_logprobs else 1.0
                          for s in seqs], device=logits.device)[:, None]  # fmt: skip
    logprobs = torch.log_softmax(logits.float() / scale, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(ids, device=logits.device)[:, None]).squeeze(1).tolist()
    k = max(s.params.top_logprobs for s in seqs)
    if not k:
        return chosen, [[] for _ in seqs]
    values, indices = torch.topk(logprobs, k, dim=-1)
    return chosen, [list(zip(indices[j, : s.params.top_logprobs].tolist(), values[j, : s.params.top_logprobs].tolist()))
                    for j, s in enumerate(seqs)]  # fmt: skip


Scores = tuple[list[float], list[list[tuple[int, float]]]]


def _logprobs_of(logits: torch.Tensor, new_ids: list[list[int]], seqs: list[Sequence]) -> list[Scores | None]:
    """The log-probs (and top log-probs) of ``new_ids[i]`` (token ``j`` scored by ``logits[i, j]``; logits are rows,
    positions, vocab) for each sequence that records them; None for the others."""
    out: list[Scores | None] = [None] * len(seqs)
    wanted = [i for i, s in enumerate(seqs) if s.params.logprobs]
    if not wanted:
        return out
    rows = [i for i in wanted for _ in new_ids[i]]
    cols = [j for i in wanted for j in range(len(new_ids[i]))]
    chosen, tops = _scored(logits[rows, cols], [t for i in wanted for t in new_ids[i]], [seqs[r] for r in rows])
    for i in wanted:
        n = len(new_ids[i])
        out[i], chosen, tops = (chosen[:n], tops[:n]), chosen[n:], tops[n:]
    return out


def _prompt_logprobs(
    logits: torch.Tensor, mask: torch.Tensor, prompts: list[list[int]], seqs: list[Sequence]
) -> list[list[tuple[float, list[tuple[int, float]]] | None]]:
    """Each prompt's tokens scored by the prefill's logits (rows, positions, vocab; rows left-padded as ``mask``
    says): token ``i`` by the position before it, the first token by none (None), as the legacy ``echo`` returns."""
    out: list[list[tuple[float, list[tuple[int, float]]] | None]] = []
    for row, (prompt, seq) in enumerate(zip(prompts, seqs)):
        start = int(mask.shape[1] - mask[row].sum())
        if len(prompt) < 2:
            out.append([None] * len(prompt))
            continue
        chosen, tops = _scored(logits[row, start : start + len(prompt) - 1], prompt[1:], [seq] * (len(prompt) - 1))
        out.append([None, *zip(chosen, tops)])
    return out


def accept_tokens(seq: Sequence, new_ids: list[int], logprobs: list[float] | Scores | None = None) -> None:
    """Append tokens up to a stop token or the length limit and emit them (and their log-probs, when given: a list,
    or the pair of lists :func:`_logprobs_of` gives)."""
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
    if isinstance(logprobs, tuple):
        logprobs, tops = logprobs
        if seq.params.top_logprobs:
            seq.top_logprobs.extend(tops[: len(kept)])
    if logprobs is not None:
        seq.logprobs.extend(logprobs[: len(kept)])
    if kept:
        seq.emit(kept)


def _forward(model: PreTrainedModel, cache: DynamicCache, **inputs: torch.Tensor | int) -> Any:
    """Call the model with its KV cache under whichever keyword this transformers version names it."""
    return model(**inputs, **{cache_keyword(model): cache}, use_cache=True)


def _rms(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    rms: Any = norm  # an RMSNorm: its weight and variance_epsilon, which torch's stubs type as Tensor | Module
    if x.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), rms.weight, rms.variance_epsilon)
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), None, rms.variance_epsilon).to(x.dtype) * rms.weight


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanDecoder:
    """The decode step of a Llama or Qwen2 model in a few dozen tensor operations per layer.

    Calling transformers' ``forward`` costs a small model more than its arithmetic on a CPU: module hooks, mask
    building, output classes and dtype round trips came to about 20 ms of a 46 ms step for SmolLM2-135M here.
    This computes what it computes (same modules, so LoRA layers and :class:`~posttrain.platform.engines.q8.Q8Linear`
    work; RMSNorm in fp32; rotary embeddings from the model's own ``rotary_emb``; the model's KV cache updated
    through ``cache.update``) for any batch of rows, left padding and several tokens per row (speculation) included.
    Prefill stays on ``forward``.
    """

    ARCHITECTURES = ("llama", "qwen2")

    def __init__(self, model: PreTrainedModel) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
        self.inner, self.lm_head = base.model, base.get_output_embeddings()
        self.heads = base.config.num_attention_heads
        self.kv_heads = base.config.num_key_value_heads

        self.fused = FusedLayers.of(self.inner, self.heads, self.kv_heads)  # a quantized model's layers in C

    @classmethod
    def unsupported(cls, model: PreTrainedModel) -> str | None:
        """Why this step cannot run ``model`` exactly (None: it can); the model then decodes through ``forward``."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
        config = base.config
        if config.model_type not in cls.ARCHITECTURES:
            return f"the lean decode step knows {' and '.join(cls.ARCHITECTURES)} layers, not {config.model_type!r}"
        if getattr(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"]
        ):
            return "the model has sliding-window attention layers, which the lean decode step does not mask"
        if getattr(config, "hidden_act", "silu") != "silu":
            return f"the model's activation is {config.hidden_act!r}; the lean decode step computes silu"
        return None

    @classmethod
    def supports(cls, model: PreTrainedModel) -> bool:
        return cls.unsupported(model) is None

    def __call__(
        self, cache: DynamicCache, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        rows, width = input_ids.shape
        total = attention_mask.shape[1]
        h = self.inner.embed_tokens(input_ids)
        cos, sin = self.inner.rotary_emb(h, position_ids=position_ids)
        cos, sin = cos[:, None], sin[:, None]
        mask = None
        if width > 1 or not bool(attention_mask.all()):
            mask = attention_mask.bool()[:, None, None, :]
            if width > 1:  # the step's own tokens see those before them
                mask = mask & torch.ones(width, total, dtype=torch.bool, device=h.device).tril(total - width)
        fused = self.fused if width == 1 and h.dtype == torch.float32 else None
        for index, layer in enumerate(self.inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            if fused is not None:
                qkv = fused.attention_in(index, h, cos, sin)
                q, k, v = (
                    qkv[:, : self.heads],
                    qkv[:, self.heads : self.heads + self.kv_heads],
                    qkv[:, self.heads + self.kv_heads :],
                )
                k, v = cache.update(k, v, index)
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=self.kv_heads != self.heads
                )
                fused.attention_out_mlp(index, h, o.reshape(rows, -1))
                continue
            x = _rms(h, layer.input_layernorm)
            if (
                qkv_proj := getattr(attn, "qkv_proj", None)
            ) is not None:  # stacked (q8.quantize_q8): rotate q, k at once
                qkv = qkv_proj(x).view(rows, width, self.heads + 2 * self.kv_heads, -1).transpose(1, 2)
                qk, v = _rotated(qkv[:, : self.heads + self.kv_heads], cos, sin), qkv[:, self.heads + self.kv_heads :]
                q, k = qk[:, : self.heads], qk[:, self.heads :]
            else:
                q = _rotated(attn.q_proj(x).view(rows, width, self.heads, -1).transpose(1, 2), cos, sin)
                k = _rotated(attn.k_proj(x).view(rows, width, self.kv_heads, -1).transpose(1, 2), cos, sin)
                v = attn.v_proj(x).view(rows, width, self.kv_heads, -1).transpose(1, 2)
            k, v = cache.update(k, v, index)
            o = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=self.kv_heads != self.heads
            )
            h = h + attn.o_proj(o.transpose(1, 2).reshape(rows, width, -1))
            x = _rms(h, layer.post_attention_layernorm)
            if (gate_up_proj := getattr(mlp, "gate_up_proj", None)) is not None:
                gate, up = gate_up_proj(x).chunk(2, dim=-1)
            else:
                gate, up = mlp.gate_proj(x), mlp.up_proj(x)
            h = h + mlp.down_proj(torch.nn.functional.silu(gate) * up)
        return self.lm_head(_rms(h, self.inner.norm))


SHARED_PREFIX_MIN = 16  # tokens all prompts of a prefill must start with before they share one run of them


def _common_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt has in common, leaving each at least one token of its own (its last
    position's logits pick its first token)."""
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def _records_past(cache: DynamicCache) -> bool:
    """Whether a sliding-window layer of ``cache`` keeps its past for a crop (set when drafts were first verified)."""
    return any(getattr(layer, "record_past", False) for layer in cache.layers)


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
    columns that no row uses any more. A sequence finished from outside (aborted: its client left)
    leaves at the start of the next :meth:`step`, before that step computes anything for it. Who
    joins, and when, is the caller's policy: the serving engine's fairness bound is stated in
    :mod:`posttrain.platform.serving.engine`.
    """

    def __init__(
        self, model: PreTrainedModel, spec: SpeculationConfig = SpeculationConfig(), pad_token_id: int = 0
    ) -> None:
        self.model, self.spec, self.pad_token_id = model, spec, pad_token_id
        self.device = model.device
        self.seqs: list[Sequence] = []  # one per cache row
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.valid = torch.zeros(0, dtype=torch.long)  # real tokens each row holds in the cache
        self.pending: list[int] = []  # each row's next input token (chosen, not yet in the cache)
        self._left: list[Sequence] = []  # finished rows that step() removed, for the next pop_finished
        self._keeps_logits = "logits_to_keep" in forward_parameters(model)
        self._lean = LeanDecoder(model) if (why := LeanDecoder.unsupported(model)) is None else None
        if why is not None:
            log.info("%s: every decode step goes through the model's forward (the same tokens, slower)", why)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def can_join(self) -> bool:
        """Whether sequences may join now (always when empty; else when the cache layout allows splicing)."""
        return self.cache is None or _mergeable(self.cache)

    @torch.inference_mode()
    def add(self, seqs: list[Sequence]) -> None:
        """Prefill ``seqs`` and add them to the batch; each gets its first token (and may finish at once)."""
        self.add_groups([[s] for s in seqs])

    @torch.inference_mode()
    def add_groups(self, groups: list[list[Sequence]]) -> None:
        """Add groups of sequences whose members share one prompt (the samples of a rollout group):
        each group's prompt is prefilled once and its KV cache repeated for every member, which then
        draws its own first token from the shared logits."""
        groups = [live for g in groups if (live := [s for s in g if not s.finished])]
        for group in groups:
            if any(s.prompt_ids != group[0].prompt_ids or s.prefix is not group[0].prefix for s in group[1:]):
                raise ValueError("add_groups: every sequence of a group must have the same prompt_ids and prefix")
        plain = [g for g in groups if g[0].prefix is None or g[0].params.prompt_logprobs]
        if plain:
            self._join(plain, None)
        for group in groups:  # a group that goes on from a cached prefix: its own prefill, from that cache
            if not (group[0].prefix is None or group[0].params.prompt_logprobs):
                self._join([group], group[0].prefix)

    def _join(self, groups: list[list[Sequence]], prefix: KVPrefix | None) -> None:
        seqs = [s for g in groups for s in g]
        for seq in seqs:
            if seq.params.seed is not None and not seq.params.greedy:
                seq.generator = torch.Generator().manual_seed(seq.params.seed)
        prompts = [g[0].prompt_ids for g in groups]
        if prefix is not None:
            cache, mask, every = self._prefill_after(prefix, prompts[0])
            for seq in seqs:  # the batch holds a copy of it from here on: its own tensors may go
                seq.prefix = None
        else:
            cache, mask, every = self._prefill(prompts, every=any(s.params.prompt_logprobs for s in seqs))
        logits = every[:, -1]
        if every.shape[1] > 1 and any(s.params.prompt_logprobs for s in seqs):
            for group, scored in zip(groups, _prompt_logprobs(every, mask, prompts, [g[0] for g in groups])):
                for seq in group:
                    if seq.params.prompt_logprobs:
                        seq.prompt_logprobs = scored
        valid = mask.sum(-1)
        if len(seqs) > len(groups):  # repeat each group's prefilled row for its members
            index = torch.tensor([i for i, g in enumerate(groups) for _ in g])
            cache.batch_select_indices(index.to(self.device))
            mask, valid, logits = mask[index], valid[index], logits[index.to(logits.device)]
        pending = choose_tokens(logits, seqs)
        for seq, tok, logprobs in zip(seqs, pending, _logprobs_of(logits[:, None], [[t] for t in pending], seqs)):
            accept_tokens(seq, [tok], logprobs)
        self._splice(cache, mask, valid)
        self.seqs += seqs
        self.pending += pending

    def _prefill(
        self, prompts: list[list[int]], every: bool = False
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """Run the prompts through the model: their cache, mask and logits (rows, positions, vocab) at the last
        position, or at ``every`` position (scoring the prompts). A prefix every prompt starts with (a system
        prompt, a worked example: most of an evaluation's or a rollout step's tokens) runs once, for one row,
        and its cache is repeated for the others; the rest of each prompt follows it, left-padded, so a row's
        cache is [shared prefix | padding | its own tokens] with the padding masked and positions counted
        over real tokens only."""
        cache = DynamicCache(config=self.model.config)
        keep = {} if every or not self._keeps_logits else {"logits_to_keep": 1}  # the vocab projection: last row only
        shared = 0 if every or len(prompts) < 2 else _common_prefix(prompts)
        if shared < SHARED_PREFIX_MIN:
            shared = 0
        else:
            _forward(self.model, cache, input_ids=torch.tensor([prompts[0][:shared]], device=self.device),
                     attention_mask=torch.ones((1, shared), dtype=torch.long, device=self.device),
                     position_ids=torch.arange(shared, device=self.device)[None], **keep)  # fmt: skip
            if _mergeable(cache):
                cache.batch_repeat_interleave(len(prompts))
            else:  # a cache this layout cannot repeat (sliding windows): the whole prompts after all
                cache, shared = DynamicCache(config=self.model.config), 0
        rest = [p[shared:] for p in prompts]
        lengths = [len(p) for p in rest]
        width = max(lengths)
        input_ids = torch.full((len(rest), width), self.pad_token_id, dtype=torch.long)
        own = torch.zeros((len(rest), width), dtype=torch.long)
        for row, prompt in enumerate(rest):
            input_ids[row, width - lengths[row] :] = torch.tensor(prompt)
            own[row, width - lengths[row] :] = 1
        positions = shared + (own.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([torch.ones((len(rest), shared), dtype=torch.long), own], dim=1)
        out = _forward(
            self.model,
            cache,
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            **keep,
        )
        return cache, mask, out.logits

    def _prefill_after(self, prefix: KVPrefix, prompt: list[int]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """One prompt that starts with ``prefix``'s tokens: its cache is the prefix's, and only the rest of the prompt
        (at least its last token, whose logits pick the first token) runs through the model."""
        shared = len(prefix.token_ids)
        if not 0 < shared < len(prompt) or tuple(prompt[:shared]) != prefix.token_ids:
            raise ValueError("a KV prefix must be a proper start of the prompt it is used for")
        cache = DynamicCache(config=self.model.config)
        for index, (keys, values) in enumerate(prefix.layers):
            cache.update(keys[None].to(self.device), values[None].to(self.device), index)
        mask = torch.ones((1, len(prompt)), dtype=torch.long)
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}
        out = _forward(self.model, cache, input_ids=torch.tensor([prompt[shared:]], device=self.device),
                       attention_mask=mask.to(self.device), position_ids=torch.arange(shared, len(prompt), device=self.device)[None],
                       **keep)  # fmt: skip
        return cache, mask, out.logits

    def _splice(self, cache: DynamicCache, mask: torch.Tensor, valid: torch.Tensor) -> None:
        """Append newly prefilled rows to the running batch, left-padding whichever side is shorter."""
        if self.cache is None:
            self.cache, self.mask, self.valid = cache, mask, valid
            return
        if not (_mergeable(self.cache) and _mergeable(cache)):
            raise RuntimeError("this model's cache layout does not allow joining a running batch")
        total = max(self.mask.shape[1], mask.shape[1])
        # plain DynamicLayers (_mergeable) holding keys and values, which transformers types as optional
        ours, new = cast(list[Any], self.cache.layers), cast(list[Any], cache.layers)
        for mine, theirs in zip(ours, new):
            mine.keys = torch.cat([_left_pad(mine.keys, total), _left_pad(theirs.keys, total)], dim=0)
            mine.values = torch.cat([_left_pad(mine.values, total), _left_pad(theirs.values, total)], dim=0)
        self.mask = torch.cat([_left_pad(self.mask, total, -1), _left_pad(mask, total, -1)], dim=0)
        self.valid = torch.cat([self.valid, valid])

    def pop_finished(self) -> list[Sequence]:
        """Remove finished sequences (stopped, or aborted by their caller) from the batch and return them."""
        done, self._left = self._left + [s for s in self.seqs if s.finished], []
        keep = [i for i, s in enumerate(self.seqs) if not s.finished]
        if len(keep) == len(self.seqs):
            return done
        for i, seq in enumerate(self.seqs):
            if seq.finished and seq.keep_kv and self.cache is not None and _mergeable(self.cache):
                seq.kv = self._row_kv(i, seq)
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
            for layer in cast(list[Any], self.cache.layers):  # DynamicLayers: keys and values set
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
            self.mask = self.mask[:, first:]
        return done

    def _row_kv(self, row: int, seq: Sequence) -> KVPrefix | None:
        """Row ``row``'s cache over its real positions: the KV of every token it holds (all but the last chosen)."""
        assert self.cache is not None
        columns = torch.nonzero(self.mask[row]).flatten()
        tokens = (seq.prompt_ids + seq.generated)[: len(columns)]
        if len(columns) != int(self.valid[row]) or len(columns) != len(seq.prompt_ids) + len(seq.generated) - 1:
            return None  # not a plain run of its tokens (an abort between steps): nothing to go on from
        at = columns.to(self.device)
        layers = tuple(
            (layer.keys[row][:, at].clone(), layer.values[row][:, at].clone())
            for layer in cast(list[Any], self.cache.layers)  # DynamicLayers (the caller checked): keys and values set
        )
        return KVPrefix(tuple(tokens), layers)

    @torch.inference_mode()
    def step(self) -> None:
        """One forward pass for every live row: its pending token plus its prompt-lookup drafts."""
        self._left = self.pop_finished()  # rows aborted since the last pop: returned by the next one
        if not self.seqs:
            return
        assert self.cache is not None
        seqs, spec = self.seqs, self.spec
        drafts = [prompt_lookup_draft(s.prompt_ids + s.generated, spec) if s.params.greedy and not s.params.processed
                  else [] for s in seqs]  # fmt: skip
        k = max(len(d) for d in drafts)
        step_ids = torch.full((len(seqs), 1 + k), self.pad_token_id, dtype=torch.long)
        step_mask = torch.zeros((len(seqs), 1 + k), dtype=torch.long)
        for i, draft in enumerate(drafts):
            step_ids[i, : 1 + len(draft)] = torch.tensor([self.pending[i], *draft])
            step_mask[i, : 1 + len(draft)] = 1
        step_pos = self.valid[:, None] + torch.arange(1 + k)[None, :]
        mask = torch.cat([self.mask, step_mask], dim=1)
        if k:  # a rejected draft is cropped: a sliding-window layer must keep what it would drop until the crop decides
            self.cache.activate_past_recording()
        inputs = {
            "input_ids": step_ids.to(self.device),
            "attention_mask": mask.to(self.device),
            "position_ids": step_pos.to(self.device),
        }
        logits = self._lean(self.cache, **inputs) if self._lean else _forward(self.model, self.cache, **inputs).logits
        sampling = [i for i, s in enumerate(seqs) if not s.params.greedy or s.params.processed]  # chosen one at a time
        sampled = (
            dict(zip(sampling, choose_tokens(logits[sampling, 0], [seqs[i] for i in sampling]))) if sampling else {}
        )
        kept_per_row: list[int] = []
        new_per_row: list[list[int]] = []
        for i, seq in enumerate(seqs):
            draft = drafts[i]
            if i not in sampled:
                preds = torch.argmax(logits[i, : 1 + len(draft)], dim=-1).tolist()
                n = 0
                while n < len(draft) and draft[n] == preds[n]:
                    n += 1
                new_ids = draft[:n] + [preds[n]]
            else:
                n, new_ids = 0, [sampled[i]]
            seq.draft_tokens += len(draft)
            seq.accepted_draft_tokens += n
            kept_per_row.append(1 + n)  # last input token + accepted drafts now valid in the cache
            self.pending[i] = new_ids[-1]
            new_per_row.append(new_ids)
        for seq, new_ids, logprobs in zip(seqs, new_per_row, _logprobs_of(logits, new_per_row, seqs)):
            accept_tokens(seq, new_ids, logprobs)
        # rejected drafts: crop what no row kept, mask out the rest
        crop = 1 + k - max(kept_per_row)
        if crop or _records_past(self.cache):  # a recording sliding-window layer goes back to its window, even by 0
            self.cache.crop(-crop)  # negative: remove that many trailing positions
        if crop:
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


def decode_groups(
    model: PreTrainedModel,
    groups: list[list[Sequence]],
    pad_token_id: int = 0,
    max_num_seqs: int | None = None,
) -> None:
    """Decode groups of sequences that share a prompt (see :meth:`DecodeBatch.add_groups`) until each
    stops. Rows leave the batch as they finish; waiting groups join, in order, while the batch has
    room for a whole group (``max_num_seqs`` rows; None: every group at once; a group larger than
    that joins an empty batch alone)."""
    batch = DecodeBatch(model, SpeculationConfig(0), pad_token_id)
    waiting = list(groups)
    while waiting or len(batch):
        room = max_num_seqs - len(batch) if max_num_seqs else sum(len(g) for g in waiting)
        joining: list[list[Sequence]] = []
        while waiting and batch.can_join and (len(waiting[0]) <= room or not (len(batch) or joining)):
            room -= len(waiting[0])
            joining.append(waiting.pop(0))
        batch.add_groups(joining)
        batch.pop_finished()
        batch.step()
        batch.pop_finished()
