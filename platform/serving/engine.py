"""The embedded engine: one model, one tier profile, a scheduler thread that batches requests.

Requests are validated and tokenised on the caller's side (errors come back as
:class:`APIError` before anything is queued). The scheduler thread runs one
:class:`~posttrain.platform.engines.generation.DecodeBatch` (continuous batching):
between decode steps, waiting requests join it up to the tier's ``max_num_seqs``,
and finished ones leave, so a new request waits for one step, not for the whole
running batch. Tokens flow back to each request's asyncio queue as they are
accepted. Vision models decode whole batches through ``generate`` instead.

Fairness bound. The batch holds at most ``B = max_num_seqs`` rows, one per sample, and one request (all
its prompts' ``n`` samples) holds at most ``rows_per_request = max(1, B // 2)`` of them: the rest of its
samples wait and join as its own rows free. Waiting requests join in arrival order, each up to that
budget, and one at its budget holds back none behind it. So beside any one request, however large its
``n`` or ``max_tokens``, another request joins at the next decode step and then decodes as it would
alone, one token a step: counted in decode steps, its latency is its latency alone plus at most one. In
time each of those steps is a wider batch's, so the multiple is a full batch's step cost over its own
rows' (about 2x for a small model on an idle CPU; ``tests/reliability/test_request_lifetime.py`` measures
both). Nothing is preempted: requests that together hold all ``B`` rows (two at their budget, or ``B``
separate ones) make a newcomer wait for a row, as any server at capacity does; the bound is against one
request starving the rest.

A request whose client leaves is aborted (:meth:`RequestHandle.cancel`): a waiting one is dropped
before the next step, a running one leaves the batch at the next decode step, and the waiting and
running counts in ``/metrics`` drop with them.
"""

from __future__ import annotations

import asyncio
import copy as _copy
import dataclasses
import functools
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from PIL import Image

from posttrain.platform.engines.generation import (
    DecodeBatch,
    SamplingParams,
    Sequence,
    SpeculationConfig,
    accept_tokens,
)
from posttrain.platform.engines.loader import LoadedModel, load_model
from posttrain.platform.engines.profiles import EngineConfig
from posttrain.platform.engines.q8 import Q8Unavailable, quantize_q8
from posttrain.platform.serving.errors import APIError, bad_request, base_model_cannot_chat
from posttrain.platform.serving.images import decode_image_url
from posttrain.platform.serving.metrics import EngineMetrics
from posttrain.platform.serving.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from posttrain.platform.serving.tool_parser import TOOL_CALL_OPEN

_ids = itertools.count()
_requests = itertools.count()
log = logging.getLogger("posttrain.engine")


@dataclass
class PreparedRequest:
    """A validated request, ready for the scheduler."""

    prompt_ids: list[int]
    params: SamplingParams
    prompt_text: str | None = None  # vision models: the processor re-tokenises with images
    images: list[Image.Image] = field(default_factory=list)
    has_tools: bool = False
    stop: list[str] = field(default_factory=list)  # stop strings: the text ends before the first one
    forced: str = ""  # the answer's start, put in the prompt (tool_choice required or named): it precedes the text


@dataclass
class TokensEvent:
    ids: list[int]


@dataclass
class DoneEvent:
    finish_reason: str


@dataclass
class ErrorEvent:
    error: APIError


Event = TokensEvent | DoneEvent | ErrorEvent


class RequestHandle:
    """One sample of a submitted request: its sequence state and the queue its events arrive on. ``request``
    numbers the request it belongs to (its samples share the request's budget of rows); ``steps`` reads the
    engine's decode step count (an abort records when it was asked for)."""

    def __init__(
        self,
        prepared: PreparedRequest,
        stop_ids: frozenset[int],
        loop: asyncio.AbstractEventLoop,
        seed: int | None = None,
        *,
        request: int,
        steps: Callable[[], int],
    ) -> None:
        self.id = f"{next(_ids)}-{uuid.uuid4().hex[:12]}"
        self.request = request
        self._steps = steps
        self.aborted_at_step: int | None = None  # the engine's decode steps when the request was aborted
        self.created = int(time.time())
        self.prepared = prepared
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        params = prepared.params if seed == prepared.params.seed else dataclasses.replace(prepared.params, seed=seed)
        self.seq = Sequence(prompt_ids=prepared.prompt_ids, params=params, stop_token_ids=stop_ids, emit=self._emit)
        self._stopped_at: int | None = None

    def _push(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def _emit(self, ids: list[int]) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self._push(TokensEvent(list(ids)))

    @property
    def completion_tokens(self) -> int:
        """Tokens generated for the answer: up to a stop string when one ended it, else all."""
        return self._stopped_at if self._stopped_at is not None else len(self.seq.generated)

    def stop_early(self, tokens: int) -> None:
        """A stop string ended the answer after ``tokens`` generated tokens: the engine stops the sequence."""
        self._stopped_at = min(tokens, len(self.seq.generated))
        if self.seq.finish_reason is None:
            self.seq.finish_reason = "stop"

    def cancel(self) -> None:
        """Abort the sample unless it has finished: the engine drops it before its next decode step."""
        if self.seq.finish_reason is None:
            self.aborted_at_step = self._steps()
            self.seq.finish_reason = "abort"

    async def stream(self) -> AsyncIterator[Event]:
        while True:
            event = await self.events.get()
            yield event
            if isinstance(event, (DoneEvent, ErrorEvent)):
                return


def _template_messages(
    messages: list[ChatMessage], vision: bool, max_images: int, max_bytes: int, max_pixels: int
) -> tuple[list[dict[str, Any]], list[Image.Image]]:
    """Messages as chat-template dicts, plus the decoded images in order."""
    out: list[dict[str, Any]] = []
    images: list[Image.Image] = []
    for i, msg in enumerate(messages):
        role = "system" if msg.role == "developer" else msg.role
        if msg.role == "assistant" and msg.content is None and not msg.tool_calls:
            raise bad_request(f"messages[{i}]: an assistant message needs content or tool_calls", param="messages")
        if msg.role in ("user", "system", "developer", "tool") and msg.content is None:
            raise bad_request(f"messages[{i}]: a {msg.role} message needs content", param="messages")
        content: Any = msg.content
        if isinstance(msg.content, list):
            content = []
            for part in msg.content:
                if part.type == "text":
                    if part.text is None:
                        raise bad_request(f"messages[{i}]: a text part needs 'text'", param="messages")
                    content.append({"type": "text", "text": part.text})
                    continue
                if not vision:
                    raise bad_request(f"messages[{i}]: this model takes no images; send text only", param="messages")
                if part.image_url is None:
                    raise bad_request(f"messages[{i}]: an image_url part needs image_url.url", param="messages")
                if len(images) >= max_images:
                    raise bad_request(
                        f"too many images: at most {max_images} per prompt are allowed by this deployment "
                        f"(limit_mm_per_prompt)",
                        param="messages",
                    )
                images.append(decode_image_url(part.image_url.url, len(images), max_bytes, max_pixels))
                content.append({"type": "image"})
        item: dict[str, Any] = {"role": role, "content": content}
        if msg.tool_calls:
            item["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in msg.tool_calls
            ]
        if msg.tool_call_id:
            item["tool_call_id"] = msg.tool_call_id
        out.append(item)
    return out, images


def _quantized(loaded: LoadedModel, copy: bool) -> LoadedModel:
    """``loaded`` with Q8_0 weights (:mod:`~posttrain.platform.engines.q8`); a copy when the caller keeps the original."""
    if loaded.info.is_vision:
        raise ValueError("q8_0 weights serve text models only; serve a vision model with weights 'model'")
    model = _copy.deepcopy(loaded.model) if copy else loaded.model
    try:
        quantize_q8(model)
    except Q8Unavailable as exc:
        raise ValueError(str(exc)) from None
    return dataclasses.replace(loaded, model=model)


class EmbeddedEngine:
    """Serve one model directory with one tier profile on CPU (or a single torch device)."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded or load_model(config.model_path)
        if config.tier.weights_for("embedded") == "q8_0":
            self.loaded = _quantized(self.loaded, copy=loaded is not None)
        self.name = config.name
        model_max = self.loaded.info.max_position_embeddings or 2048
        self.max_model_len = min(config.max_model_len or model_max, model_max)
        self.is_vision = self.loaded.info.is_vision
        self.tokenizer = self.loaded.tokenizer
        self.stop_ids = frozenset(self.loaded.eos_token_ids)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.spec = SpeculationConfig(
            num_speculative_tokens=config.tier.embedded.prompt_lookup_num_tokens,
            max_ngram=config.tier.embedded.prompt_lookup_max_ngram,
            min_ngram=config.tier.embedded.prompt_lookup_min_ngram,
        )
        gen = self.loaded.model.generation_config
        self.default_temperature = float(gen.temperature or 1.0) if gen.do_sample else 0.0
        self.metrics = EngineMetrics(self.name)
        self._queue: queue.Queue[list[RequestHandle]] = queue.Queue()  # a request's samples, together
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.largest_batch = 0  # most samples decoded together so far
        self.decode_steps = 0  # decode steps taken so far
        self.rows_per_request = max(
            1, config.tier.embedded.max_num_seqs // 2
        )  # one request's budget (the fairness bound)
        self._waiting: list[list[RequestHandle]] = []  # the scheduler's: each request's samples yet to join

    # lifecycle -----------------------------------------------------------
    def start(self) -> EmbeddedEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # request preparation (caller's thread) ------------------------------
    def _params(
        self,
        prompt_len: int,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float,
        seed: int | None,
        top_logprobs: int | None = None,
        echo: bool = False,
        processing: dict[str, Any] | None = None,
    ) -> SamplingParams:
        """``top_logprobs``: None for no log-probs, else how many likeliest tokens beside each one's; ``echo``
        with log-probs scores the prompt's tokens too."""
        if prompt_len >= self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        if max_tokens is None:
            max_tokens = self.max_model_len - prompt_len
        elif prompt_len + max_tokens > self.max_model_len:
            raise bad_request(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
                f"length is {self.max_model_len} tokens and your request has {prompt_len} input tokens "
                f"({max_tokens} > {self.max_model_len} - {prompt_len}).",
                param="max_tokens",
            )
        temp = self.default_temperature if temperature is None else temperature
        processing = processing or {}
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for t in processing.get("logit_bias") or {}):  # the request's; starts are ours
            raise bad_request(f"logit_bias token ids must lie in [0, {vocab})", param="logit_bias")
        scored = top_logprobs is not None
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=temp,
            top_p=top_p,
            seed=seed,
            logprobs=scored,
            raw_logprobs=scored,
            top_logprobs=top_logprobs or 0,
            prompt_logprobs=scored and echo,
            **processing,
        )

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (its vocabulary string is at least as long)."""
        return max((len(t) for t in self.tokenizer.get_vocab()), default=1) or 1

    def refuse_long_text(self, chars: int) -> None:
        """Refuse text that cannot fit ``max_model_len`` however it tokenises, before tokenising it:
        work proportional to a prompt's size is done only for prompts that may fit."""
        at_least = chars // self.max_token_chars
        if at_least >= self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request has at "
                f"least {at_least} input tokens ({chars} characters). Please reduce the length of the input messages.",
                param="messages")  # fmt: skip

    def prepare_chat(self, req: ChatCompletionRequest) -> PreparedRequest:
        """Render and tokenise a chat request (call it off the event loop: it is proportional to the prompt)."""
        if self.is_vision and (req.logprobs or req.n > 1 or any(req.processing.values())):
            raise bad_request(
                "this vision model's engine returns one answer, without log-probs, penalties or logit "
                "bias: leave out n, logprobs, presence_penalty, frequency_penalty and logit_bias",
                param="n" if req.n > 1 else "logprobs" if req.logprobs else "logit_bias",
            )
        if not self.is_vision and self.tokenizer.chat_template is None:
            raise base_model_cannot_chat(self.name)
        self.refuse_long_text(sum(m.text_chars for m in req.messages))
        messages, images = _template_messages(
            req.messages,
            self.is_vision,
            self.config.max_images_per_prompt,
            self.config.max_image_bytes,
            self.config.max_image_pixels,
        )
        tools = [t.model_dump() for t in req.tools] if req.tools and req.tool_choice != "none" else None
        renderer: Any = self.loaded.processor if self.is_vision else self.tokenizer  # a vision model has a processor
        try:
            text = renderer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # jinja errors: the messages do not fit the template
            raise bad_request(
                f"messages could not be rendered with the model's chat template: {exc}", param="messages"
            ) from None
        # tool_choice required or named: the answer starts as a call (and names the function), the model goes on
        forced, starts = "", None
        if req.tool_choice == "required" or req.forced_function:
            names = [req.forced_function] if req.forced_function else [t.function.name for t in req.tools or []]
            forced = TOOL_CALL_OPEN + '\n{"name": "'
            if len(names) == 1:
                forced += f'{names[0]}", "arguments": '
            else:  # the model chooses among the functions' names, and only among them
                starts = [
                    self.tokenizer(f'{name}", "arguments": ', add_special_tokens=False)["input_ids"] for name in names
                ]
            text += forced
        if self.is_vision:
            processor: Any = self.loaded.processor  # a vision model's, never None
            batch = processor(text=[text], images=images or None, return_tensors="pt")
            prompt_ids = batch["input_ids"][0].tolist()
        else:
            prompt_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        max_tokens = req.max_completion_tokens or req.max_tokens
        params = self._params(
            len(prompt_ids),
            max_tokens,
            req.temperature,
            req.top_p,
            req.seed,
            req.top_k_logprobs,
            processing={**req.processing, "starts": starts},
        )
        return PreparedRequest(
            prompt_ids=prompt_ids,
            params=params,
            prompt_text=text if self.is_vision else None,
            images=images,
            has_tools=tools is not None,
            stop=req.stop_strings,
            forced=forced,
        )

    def prepare_completion(self, req: CompletionRequest) -> list[PreparedRequest]:
        """Tokenise each prompt of a completion request (off the event loop, like :meth:`prepare_chat`)."""
        if self.is_vision and (
            req.logprobs is not None or req.n > 1 or len(req.prompts) > 1 or any(req.processing.values())
        ):
            raise bad_request(
                "this vision model's engine completes one prompt once without log-probs: send one prompt, "
                "without n and logprobs",
                param="prompt",
            )
        prepared = []
        for index, prompt in enumerate(req.prompts):
            where = "prompt" if isinstance(req.prompt, str) or len(req.prompts) == 1 else f"prompt.{index}"
            if isinstance(prompt, str):
                self.refuse_long_text(len(prompt))
                prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
                text = prompt
            else:
                vocab = len(self.tokenizer)
                if any(not 0 <= t < vocab for t in prompt):
                    raise bad_request(f"prompt token ids must lie in [0, {vocab})", param=where)
                prompt_ids, text = list(prompt), cast(str, self.tokenizer.decode(prompt))  # one id list: one string
            if not prompt_ids:
                raise bad_request("prompt is empty", param=where)
            params = self._params(
                len(prompt_ids),
                req.max_tokens,
                req.temperature,
                req.top_p,
                req.seed,
                req.top_k_logprobs,
                req.echo,
                req.processing,
            )
            prepared.append(
                PreparedRequest(prompt_ids=prompt_ids, params=params, prompt_text=text, stop=req.stop_strings)
            )
        return prepared

    def submit(self, prompts: list[PreparedRequest], n: int = 1) -> list[RequestHandle]:
        """Queue one request: ``n`` completions of each prepared prompt, handle ``i`` answering prompt ``i // n``
        (the samples that join the batch together share one prefill of their prompt; seeded, sample ``j`` draws
        from seed + ``j``); call from a running event loop."""
        if self._thread is None or self._stopping.is_set():
            raise APIError(503, f"engine for {self.name} is not running")
        loop, request = asyncio.get_running_loop(), next(_requests)

        def sample(prepared: PreparedRequest, j: int) -> RequestHandle:
            seed = prepared.params.seed
            return RequestHandle(
                prepared,
                self.stop_ids,
                loop,
                None if seed is None else (seed + j) % 2**64,
                request=request,
                steps=lambda: self.decode_steps,
            )

        handles = [sample(prepared, j) for prepared in prompts for j in range(n)]
        with self.metrics._lock:
            self.metrics.waiting += len(handles)
        self._queue.put(list(handles))  # the scheduler's copy: it takes samples off it as they join
        return handles

    # scheduler thread -----------------------------------------------------
    def _collect(self, room: int, wait: bool) -> None:
        """Move submitted requests to the waiting line. With ``wait`` (nothing running or waiting) block briefly
        for the first, then give the tier's ``batch_wait_ms`` for others to arrive while their samples fit in
        ``room`` rows; else take whatever is queued, at once."""
        try:
            self._waiting.append(self._queue.get(timeout=0.05) if wait else self._queue.get_nowait())
        except queue.Empty:
            return
        deadline = time.perf_counter() + (self.config.tier.embedded.batch_wait_ms / 1000 if wait else 0.0)
        while not wait or sum(map(len, self._waiting)) < room:
            remaining = deadline - time.perf_counter()
            try:
                self._waiting.append(self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait())
            except queue.Empty:
                return

    def _drop_aborted(self) -> None:
        """Finish the waiting samples whose request was aborted: they never join the batch."""
        gone = [h for waiting in self._waiting for h in waiting if h.seq.finished]
        if not gone:
            return
        self._waiting = [kept for waiting in self._waiting if (kept := [h for h in waiting if not h.seq.finished])]
        self._admit(gone)
        for h in gone:
            self._finish(h)

    def _admissions(self, room: int, held: Counter[int]) -> list[list[RequestHandle]]:
        """The waiting samples that join the batch now, admitted, in groups that share a prefill (one prompt's
        samples): requests in arrival order, each up to its budget of rows (``held``: each request's rows in
        the batch), until ``room`` rows are taken. A request at its budget holds back none behind it."""
        joining: list[RequestHandle] = []
        for waiting in self._waiting:
            take = min(room - len(joining), self.rows_per_request - held[waiting[0].request], len(waiting))
            if take > 0:
                joining += waiting[:take]
                del waiting[:take]
        self._waiting = [waiting for waiting in self._waiting if waiting]
        self._admit(joining)
        return [list(group) for _, group in itertools.groupby(joining, key=lambda h: id(h.prepared))]

    def _admit(self, handles: list[RequestHandle]) -> None:
        if not handles:
            return
        with self.metrics._lock:
            self.metrics.waiting -= len(handles)
            self.metrics.running += len(handles)

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.is_vision:
            self._run_static()
            return
        # continuous batching: requests join the running batch between decode steps, up to
        # max_num_seqs, and leave it as they finish
        batch = DecodeBatch(self.loaded.model, self.spec, self.pad_id)
        running: dict[int, RequestHandle] = {}  # id(Sequence) -> its request
        while not self._stopping.is_set():
            try:
                if batch.can_join:
                    self._join(batch, running)
                if len(batch):
                    batch.step()
                    self.decode_steps += 1
                for seq in batch.pop_finished():
                    self._finish(running.pop(id(seq)))
            except Exception as exc:  # noqa: BLE001 - report to every running client, keep serving
                error = APIError(500, f"engine error while generating: {type(exc).__name__}: {exc}")
                for h in running.values():
                    self._fail(h, error)
                running.clear()
                batch = DecodeBatch(self.loaded.model, self.spec, self.pad_id)
        for seq in batch.abort():
            self._finish(running.pop(id(seq)))
        for h in running.values():
            self._finish(h)

    def _join(self, batch: DecodeBatch, running: dict[int, RequestHandle]) -> None:
        """Between decode steps: drop aborted waiting samples, then add the admitted ones to ``batch`` and
        ``running`` (one aborted meanwhile, which the batch leaves out, is finished at once)."""
        room = self.config.tier.embedded.max_num_seqs - len(batch)
        self._collect(room, wait=not running and not self._waiting)
        self._drop_aborted()
        groups = self._admissions(room, Counter(h.request for h in running.values()))
        batch.add_groups([[h.seq for h in group] for group in groups])
        joined = {id(seq) for seq in batch.seqs}
        for h in (h for group in groups for h in group):
            if id(h.seq) in joined:
                running[id(h.seq)] = h
            else:
                self._finish(h)
        self.largest_batch = max(self.largest_batch, len(running))

    def _run_static(self) -> None:
        """Vision models: decode whole batches with ``generate`` (images make rows hard to splice)."""
        while not self._stopping.is_set():
            self._collect(self.config.tier.embedded.max_num_seqs, wait=not self._waiting)
            self._drop_aborted()
            batch = [h for g in self._admissions(self.config.tier.embedded.max_num_seqs, Counter()) for h in g]
            if not batch:
                continue
            self.largest_batch = max(self.largest_batch, len(batch))
            try:
                live = [h for h in batch if not h.seq.finished]
                if live:
                    self._run_vision(live)
                for h in batch:
                    self._finish(h)
            except Exception as exc:  # noqa: BLE001 - report to every waiting client, keep serving
                error = APIError(500, f"engine error while generating: {type(exc).__name__}: {exc}")
                for h in batch:
                    self._fail(h, error)

    def _fail(self, h: RequestHandle, error: APIError) -> None:
        with self.metrics._lock:
            self.metrics.running -= 1
        h._push(ErrorEvent(error))

    def _finish(self, h: RequestHandle) -> None:
        reason = h.seq.finish_reason or "abort"
        now = time.perf_counter()
        if h.aborted_at_step is not None:
            log.info(
                "request %s aborted: it left %d decode step(s) after the abort",
                h.id,
                self.decode_steps - h.aborted_at_step,
            )
        with self.metrics._lock:
            self.metrics.running -= 1
        self.metrics.request_finished(
            reason,
            len(h.seq.prompt_ids),
            len(h.seq.generated),
            None if h.first_token_at is None else h.first_token_at - h.submitted_at,
            now - h.submitted_at,
            h.seq.draft_tokens,
            h.seq.accepted_draft_tokens,
        )
        h._push(DoneEvent(reason))

    def _run_vision(self, batch: list[RequestHandle]) -> None:
        greedy = [h for h in batch if h.seq.params.greedy]
        groups = ([greedy] if greedy else []) + [[h] for h in batch if not h.seq.params.greedy]
        for group in groups:
            self._generate_vision(group)

    def _generate_vision(self, group: list[RequestHandle]) -> None:
        processor: Any = self.loaded.processor  # a vision model's, never None
        images = [img for h in group for img in h.prepared.images]
        inputs = processor(
            text=[h.prepared.prompt_text for h in group], images=images or None, padding=True, return_tensors="pt"
        ).to(self.loaded.model.device)
        first = group[0].seq.params
        sampling: dict[str, Any] = {"do_sample": False}
        if not first.greedy:
            sampling = {"do_sample": True, "temperature": first.temperature, "top_p": first.top_p}
            if first.seed is not None:
                torch.manual_seed(first.seed)
        streamer = _RowStreamer([h.seq for h in group])
        self.loaded.model.generate(  # type: ignore[operator]  # the vision model's GenerationMixin method
            **inputs,
            max_new_tokens=max(h.seq.params.max_new_tokens for h in group),
            streamer=streamer,
            eos_token_id=sorted(self.stop_ids),
            pad_token_id=self.pad_id,
            **sampling,
        )


class _RowStreamer:
    """A generate() streamer that routes each row's new token to its Sequence."""

    def __init__(self, seqs: list[Sequence]) -> None:
        self.seqs = seqs
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        tokens = value.reshape(len(self.seqs), -1).tolist()
        for seq, row in zip(self.seqs, tokens):
            if not seq.finished:
                accept_tokens(seq, row)

    def end(self) -> None:
        for seq in self.seqs:
            if not seq.finished:
                seq.finish_reason = "length"
