"""Turning task text into token ids, the same way for every model.

A tokenizer with a chat template gets the prompt as one user turn with the
generation prompt appended; one without gets the raw text with the tokenizer's own
special tokens (the embedded character-level model's adds ``<bos>``), so that plain
``tokenizer(prompt)`` from a checkpoint gives exactly the ids training used.
Responses are the answer's tokens + ``<eos>``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


Messages = tuple[tuple[str, str], ...]
"""A chat-format prompt: (role, content) pairs."""

ToolSchemas = tuple[dict[str, Any], ...]
"""The JSON schemas of the tools a chat model may call (``tools=`` of its chat template)."""


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, text: str | Messages, tools: ToolSchemas = ()
) -> list[int]:
    """Token ids of a prompt — a text (one user turn) or chat messages —, chat-templated
    when the tokenizer has a template, else as ``tokenizer(text)`` encodes it (never a
    special token the tokenizer would not add); messages without a template are their
    contents, one per line. ``tools`` go to the template, which shows them as it was
    written to (Qwen's, in the system turn; one that ignores them, not at all)."""
    if getattr(tokenizer, "chat_template", None):
        messages = (
            [{"role": "user", "content": text}]
            if isinstance(text, str)
            else [{"role": role, "content": content} for role, content in text]
        )
        out: Any = tokenizer.apply_chat_template(
            messages, tools=list(tools) or None, add_generation_prompt=True, tokenize=True
        )
        ids = out["input_ids"] if hasattr(out, "keys") else out  # a BatchEncoding in newer versions
        return [int(i) for i in ids]
    if not isinstance(text, str):
        text = "\n".join(content for _, content in text)
    ids = [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]
    ends = {tokenizer.eos_token_id, tokenizer.sep_token_id} - {None}
    while ids and ids[-1] in ends:  # T5/BERT-style tokenizers close every text; a prompt is open
        ids.pop()
    return ids


class PromptEncoder:
    """:func:`encode_prompt` for one tokenizer, remembering the prompts it encoded last.

    The G environments of a group reset to the same prompt, and one call of a Hugging
    Face tokenizer costs 50-70 µs: encoding 64 prompts one by one took a tenth of the
    embedded default's ``generate``. With it a round of P × G episodes encodes its P
    texts once each. The ids are ``encode_prompt``'s (a fresh list each call); ``memo``
    texts at most are kept.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, memo: int = 4096, tools: ToolSchemas = ()
    ) -> None:
        self.tokenizer, self.tools = tokenizer, tools
        self._ids = lru_cache(maxsize=memo)(self._encode)  # thread-safe: async workers share it

    def _encode(self, text: str | Messages) -> tuple[int, ...]:
        return tuple(encode_prompt(self.tokenizer, text, self.tools))

    def __call__(self, text: str | Messages) -> list[int]:
        return list(self._ids(text))


def encode_response(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of a demonstration response: the text, then EOS."""
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    return [*ids, int(tokenizer.eos_token_id)]


def decode_response(tokenizer: PreTrainedTokenizerBase, ids: list[int] | tuple[int, ...]) -> str:
    """The response text without special tokens."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))
