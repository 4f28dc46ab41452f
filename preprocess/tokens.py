"""Token counting for any tokenizer: a Hugging Face tokenizer, a `tokenizers.Tokenizer`,
or a plain callable returning a count or a list of ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TokenizerLike = Any  # HF PreTrainedTokenizer(Fast) | tokenizers.Tokenizer | Callable[[str], int | list]
TokenCounter = Callable[[str], int]


def as_token_counter(tokenizer: TokenizerLike) -> TokenCounter:
    """Return ``count(text) -> int`` for ``tokenizer`` (no special tokens added)."""
    if getattr(tokenizer, "_posttrain_counter", False):
        return tokenizer
    encode = getattr(tokenizer, "encode", None)
    if encode is not None:
        try:  # transformers tokenizers
            encode("a", add_special_tokens=False)

            def count(text: str) -> int:
                out = encode(text, add_special_tokens=False)
                return len(getattr(out, "ids", out))

        except (
            TypeError
        ):  # tokenizers.Tokenizer.encode(sequence, pair=None, is_pretokenized=False, add_special_tokens=True)

            def count(text: str) -> int:
                out = encode(text)
                return len(getattr(out, "ids", out))

    elif callable(tokenizer):

        def count(text: str) -> int:
            out = tokenizer(text)
            if isinstance(out, int):
                return out
            ids: Any = out.get("input_ids") if isinstance(out, dict) else getattr(out, "input_ids", out)
            return len(ids)

    else:
        raise TypeError(
            f"{type(tokenizer).__name__} is not a tokenizer: pass a Hugging Face tokenizer, "
            "a tokenizers.Tokenizer or a callable text -> int"
        )
    count._posttrain_counter = True  # type: ignore[attr-defined]
    return count
