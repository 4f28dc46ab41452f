"""Train a small byte-level BPE tokenizer locally and wrap it for transformers."""

from __future__ import annotations

import random
from collections.abc import Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from posttrain.platform.engines.chat_template import CHAT_TEMPLATE

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    "<|im_start|>",
    EOS_TOKEN,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Added but not special: they survive skip_special_tokens, as in Qwen2.5.
TOOL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

_WORDS = (
    "the a an of to in and or is are was were be been for on with as by at from that this these those it its "
    "document page section table figure total amount date invoice contract party clause term payment "
    "answer question user assistant system tool function name arguments result value weather city "
    "temperature unit celsius fahrenheit get search query report year month day number price cost "
    "model data text image describe what which who where when how why yes no true false null "
    "revenue profit loss quarter customer order item quantity account balance rate percent "
    "Paris London Berlin Tokyo Madrid Rome summary title author"
).split()


def synthetic_corpus(num_lines: int, seed: int) -> Iterator[str]:
    """Deterministic training text: prose, numbers, JSON tool calls, chat markup."""
    rng = random.Random(seed)
    for i in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 20))]
        line = " ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ","])
        if i % 5 == 0:
            line += (
                f' {{"name": "{rng.choice(_WORDS)}", "arguments": {{"{rng.choice(_WORDS)}": {rng.randint(0, 9999)}}}}}'
            )
        if i % 7 == 0:
            line += (
                f" {rng.randint(0, 10**6)} {rng.random():.3f} 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            )
        yield line


def train_tokenizer(vocab_size: int = 1024, seed: int = 0, num_lines: int = 4000) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text encodes) with chat and vision tokens and a tool-aware chat template."""
    if vocab_size < 300:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs at least 300 (256 bytes + specials)"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(num_lines, seed), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=1 << 20,
    )
    wrapped.add_tokens(list(TOOL_TOKENS))
    return wrapped
