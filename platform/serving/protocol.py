"""The subset of the OpenAI API request schema the engines accept, validated at the edge."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    seed: int | None = None
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
