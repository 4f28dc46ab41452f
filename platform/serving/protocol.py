"""The subset of the OpenAI API request schema the engines accept, validated at the edge.

Nothing a client sends is dropped silently: an OpenAI parameter the embedded engine does not implement is refused
with a 400 naming it unless it has its neutral value (``presence_penalty: 0``, ``logprobs: false``, ...: what the
parameter's absence means); any other field is ignored, as vLLM ignores it, and named in the response's
``x-posttrain-ignored-fields`` header (:attr:`SamplingFields.ignored_fields`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.requests import ClientDisconnect, Request

from posttrain.platform.serving.errors import APIError, bad_request


class ImageURL(BaseModel):
    url: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url", "input_image"]
    text: str | None = None
    image_url: ImageURL | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @property
    def text_chars(self) -> int:
        """Characters of text the message carries (content and tool-call arguments; images not counted)."""
        if isinstance(self.content, str):
            chars = len(self.content)
        else:
            chars = sum(len(p.text or "") for p in self.content or [] if p.type == "text")
        return chars + sum(len(c.function.arguments or "") for c in self.tool_calls or [])


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolDef(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(BaseModel):
    include_usage: bool = False


# OpenAI parameters the embedded engine does not implement, with the values that mean "not used": accepted as such
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "response_format": (None, {"type": "text"}),
    "suffix": (None, ""),
    "parallel_tool_calls": (None, True),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "prediction": (None,),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
MAX_STOP_STRINGS = 16
MAX_CHOICES = 64  # n per prompt, times the prompts of a completion request
MAX_TOP_LOGPROBS = 20  # as OpenAI's and vLLM's default limit
IGNORED_HEADER = "x-posttrain-ignored-fields"  # the request's fields the engine neither knows nor refuses


class UnsupportedParameter(ValueError):
    def __init__(self, name: str, value: Any, why: str | None = None) -> None:
        super().__init__(
            f"`{name}`: {why}" if why else f"`{name}` is not supported by this engine (got {value!r}); leave it out"
        )
        self.name = name


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64, description="what torch.Generator.manual_seed takes")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(
        1, ge=1, le=MAX_CHOICES, description="completions per prompt, sampled together, the prompt prefilled once"
    )
    best_of: int | None = Field(None, ge=1, description="accepted when it equals n (no candidates are drawn beyond n)")
    presence_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="minus this for each token generated so far"
    )
    frequency_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="minus this times each token's count so far"
    )
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (as a string) -> added to its logit, -100..100"
    )

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdigit() or not -100 <= bias <= 100:
                raise ValueError(f"logit_bias maps token ids to biases from -100 to 100; got {key!r}: {bias!r}")
        if value and len(value) > 300:
            raise ValueError(f"logit_bias may bias at most 300 tokens, got {len(value)}")
        return value

    @property
    def processing(self) -> dict[str, Any]:
        """The request's logits processing as :class:`SamplingParams` takes it."""
        return {
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "logit_bias": {int(k): float(v) for k, v in self.logit_bias.items()} if self.logit_bias else None,
        }

    stop: str | list[str] | None = Field(None, description="the text ends before the first of these (not included)")
    user: str | None = Field(None, max_length=256, description="the caller's end user, for the caller's records")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS or any(not s or len(s) > 256 for s in stops):
            raise ValueError(f"give at most {MAX_STOP_STRINGS} stop strings, each 1 to 256 characters")
        return value

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> SamplingFields:
        if self.best_of is not None and self.best_of != self.n:
            raise UnsupportedParameter(
                "best_of",
                self.best_of,
                f"best_of other than n ({self.n}) is not supported: "
                "leave it out, or ask for n completions and choose among them",
            )
        for name, neutral in UNSUPPORTED.items():
            value = (self.model_extra or {}).get(name)
            if not any(value == v and type(value) is not bool or value is v for v in neutral):
                raise UnsupportedParameter(name, value)
        return self

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def ignored_fields(self) -> list[str]:
        """Fields this engine neither knows nor refuses (named back to the client in a response header)."""
        return sorted(k for k in self.model_extra or {} if k not in UNSUPPORTED)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    logprobs: bool | None = Field(None, description="each answer token's log-prob (of the model's distribution)")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="and this many likeliest tokens")

    @model_validator(mode="after")
    def _chat_fields(self) -> ChatCompletionRequest:
        choice = self.tool_choice
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if not isinstance(name, str) or not name:
                raise ValueError('tool_choice names a function as {"type": "function", "function": {"name": ...}}')
            if name not in {t.function.name for t in self.tools or []}:
                raise ValueError(f"tool_choice names the function {name!r}, which is not among the request's tools")
        elif choice not in (None, "none", "auto", "required"):
            raise ValueError(f"tool_choice is none, auto, required or a named function; got {choice!r}")
        elif choice == "required" and not self.tools:
            raise ValueError("tool_choice required needs tools: give the functions the model may call")
        if self.top_logprobs and not self.logprobs:
            raise UnsupportedParameter("top_logprobs", self.top_logprobs, "top_logprobs needs logprobs: true")
        return self

    @property
    def forced_function(self) -> str | None:
        """The function a named ``tool_choice`` asks for."""
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    @property
    def top_k_logprobs(self) -> int | None:
        """None: no log-probs; else how many likeliest tokens to list beside each answer token's."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(description="a prompt, prompts, or token ids")
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="each token's log-prob and this many likeliest tokens at each position (legacy format)",
    )
    echo: bool = Field(False, description="the prompt precedes the completion; with logprobs, scored too")

    @model_validator(mode="after")
    def _completion_fields(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is an empty list: give a prompt, a list of prompts, or token ids")
        if len(self.prompts) * self.n > MAX_CHOICES:
            raise ValueError(
                f"{len(self.prompts)} prompts x n={self.n} is over {MAX_CHOICES} completions a request: "
                "send fewer prompts a request"
            )
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The request's prompts, each text or token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]  # type: ignore[arg-type]
        return list(self.prompt)  # type: ignore[arg-type]

    @property
    def top_k_logprobs(self) -> int | None:
        return self.logprobs


async def read_json_body(request: Request, max_bytes: int) -> tuple[bytes, Any]:
    """The raw body and its JSON, refused with a clear 4xx when it is larger than ``max_bytes``
    (checked on Content-Length and again while reading, so an oversized body is never held whole),
    not UTF-8 JSON, nested deeper than the JSON decoder goes, or uses NaN/Infinity."""
    too_large = APIError(
        413,
        f"request body is larger than {max_bytes} bytes; send less (fewer or smaller images, a shorter prompt)",
        type="BadRequestError",
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise bad_request("the client disconnected before the request body was complete") from None
    raw = b"".join(chunks)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON; send a number")

    try:
        return raw, json.loads(raw, parse_constant=no_constant)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("request body nests JSON too deeply; send flatter JSON") from None


def parse_request(model: type[SamplingFields], body: Any) -> Any:
    """Validate a JSON body, turning pydantic's errors into one 400 with the offending field named."""
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, UnsupportedParameter):
            raise APIError(400, str(cause), param=cause.name) from None
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise APIError(
            400, f"invalid request: {where}: {message}" if where else f"invalid request: {message}", param=where or None
        ) from None
