"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error a client caused (4xx) or the server hit (5xx), rendered the way OpenAI and vLLM do."""

    def __init__(self, status_code: int, message: str, *, type: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type or _default_type(status_code)
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status_code}}


def _default_type(status: int) -> str:
    return {
        400: "BadRequestError",
        401: "AuthenticationError",
        403: "PermissionDeniedError",
        404: "NotFoundError",
        422: "BadRequestError",
        429: "RateLimitError",
        503: "ServiceUnavailableError",
    }.get(status, "InternalServerError" if status >= 500 else "BadRequestError")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def base_model_cannot_chat(model: str) -> APIError:
    """A chat request to a base model (one with no chat template: nothing says how turns are written)."""
    return APIError(400, f"`{model}` is a base model: it has no chat template, so it cannot take chat messages. Send it a "
                         "prompt on /v1/completions, or give it a chat template: import it with `posttrain models import "
                         "SOURCE --chat-template gemma|chatml`, or post-train it with `chat_template` set in its SFT run.",
                    param="model")  # fmt: skip


def model_not_found(model: str, served: list[str], *, registered: bool = False) -> APIError:
    """404 for a model nobody serves here: one that is registered but has no deployment is told how to deploy it, and
    the models that are served are listed (or that nothing is)."""
    listed = f"Served models: {', '.join(served)}." if served else "Nothing is deployed yet."
    if registered:
        return APIError(
            404,
            f"The model `{model}` is registered but not deployed: deploy it (Deploy on the console's "
            f"Models page, or `posttrain models deploy {model}`) and ask again. {listed}",
            param="model",
        )
    return APIError(404, f"The model `{model}` does not exist. {listed}", param="model")
