"""The subset of the OpenAI API request schema the engines accept, validated at the edge."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
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


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64, description="what torch.Generator.manual_seed takes")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    metadata: dict[str, str] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(16, ge=1)


async def read_json_body(request: Request, max_bytes: int) -> tuple[bytes, Any]:
    """The raw body and its JSON, refused with a clear 4xx when it is larger than ``max_bytes``
    (checked on Content-Length and again while reading, so an oversized body is never held whole),
    not UTF-8 JSON, nested deeper than the JSON decoder goes, or uses NaN/Infinity."""
    too_large = APIError(413, f"request body is larger than {max_bytes} bytes; send less (fewer or smaller "
                              "images, a shorter prompt)", type="BadRequestError")
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
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(400, f"invalid request: {where}: {first['msg']}", param=where) from None
