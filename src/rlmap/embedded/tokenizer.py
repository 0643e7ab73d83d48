"""The embedded models' Hugging Face tokenizers: one token per character, and a byte-level BPE.

Built with the ``tokenizers`` library and wrapped as ``PreTrainedTokenizerFast``,
so ``AutoTokenizer.from_pretrained`` loads it from a checkpoint directory with
nothing of rlmap installed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = "0123456789+-*=() abcdefghijklmnopqrstuvwxyz.,:?"


def build_tokenizer(
    characters: str = CHARACTERS, extra_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """One token per character, plus pad/bos/eos/unk (ids 0..3); encoding adds ``<bos>``.

    ``extra_tokens`` (e.g. a tool task's ``<calc>``) get one id each after the characters.
    They are ordinary, not special, tokens: decoding keeps them, so a response that
    contains a tool marker never reads as a bare answer.

    A byte-level BPE without merges under Qwen2's rules (its pre-tokenizer, byte-level
    alphabet and decoder; a space is the token ``Ġ``, a newline ``Ċ``): ``AutoTokenizer``
    loads a ``qwen2`` checkpoint's tokenizer as ``Qwen2Tokenizer``, which rebuilds those
    rules from the vocabulary, so only a tokenizer with them reads back with the ids it was
    trained with (a word-level one lost every space and newline that way).
    """
    if any(ord(c) > 127 for c in characters):
        raise ValueError("build_tokenizer: characters must be ASCII (one byte, one token)")
    symbols = [byte_symbol(c) for c in dict.fromkeys(characters)]
    tokens = (*SPECIALS, *symbols, *dict.fromkeys(extra_tokens))
    vocab = {token: i for i, token in enumerate(tokens)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    _qwen2_rules(core)
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra_tokens])
    # The tokenizer adds <bos> itself, so plain ``AutoTokenizer.from_pretrained(ckpt)(text)``
    # encodes a prompt exactly as training did (without it a checkpoint answered "4" to
    # "12+34=" when used with transformers alone: its prompts had always begun with <bos>).
    core.post_processor = _adds_bos(vocab["<bos>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's map from a byte to the printable character that stands for it (the
    byte-level BPE alphabet): printable Latin-1 stands for itself, the rest shifts to 256+."""
    kept = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    out, shift = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in out:
            out[b], shift = chr(256 + shift), shift + 1
    return out


def byte_symbol(character: str) -> str:
    """The byte-level token of an ASCII character (``" "`` → ``"Ġ"``, ``"\\n"`` → ``"Ċ"``)."""
    return _byte_alphabet()[ord(character)]


def _qwen2_rules(core: Tokenizer) -> None:
    """Qwen2's normaliser, pre-tokenizer and decoder (what ``Qwen2Tokenizer`` rebuilds)."""
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()


def _adds_bos(bos: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )


def restore_bos(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """An embedded tokenizer saved before it added ``<bos>`` itself gets that back.

    Checkpoints written by older rlmap versions have the character vocabulary without the
    post-processor; encoded as-is, their prompts would lose the ``<bos>`` they were trained
    with. A tokenizer is recognised as rlmap's by its special tokens (pad/bos/eos/unk at
    ids 0-3) and its characters; any other tokenizer is returned unchanged.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = tokenizer.get_vocab()
    specials = [vocab.get(t) for t in SPECIALS] == [0, 1, 2, 3]
    characters = all(c in vocab or byte_symbol(c) in vocab for c in CHARACTERS)
    ours = specials and characters  # a word-level one of older rlmap, or this one
    if backend is None or not ours or tokenizer("1")["input_ids"][:1] == [1]:
        return tokenizer
    backend.post_processor = _adds_bos(1)
    return tokenizer


CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""A ChatML template (Qwen's layout) over system/user/assistant/tool messages."""
CHAT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""pad, turn start, turn end (= EOS: an assistant turn ends with it); ids 0-2."""


QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenizer pattern (digits one by one)."""


def build_bpe_tokenizer(corpus: Sequence[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus`` with ``tokenizers``, with the ChatML
    special tokens and template: a real chat model's tokenizer in miniature, whose tags
    (``<tool_call>``) are several tokens and whose text has more than one spelling in
    tokens. Deterministic for one corpus; ``vocab_size`` counts the 256 bytes.

    Its normaliser, pre-tokenizer and decoder are Qwen2's (``Qwen2Tokenizer``), because
    ``AutoTokenizer`` loads a checkpoint of a ``qwen2`` model as that class, rebuilding
    the rules from the vocabulary and merges: with other rules the model would be read
    back with other ids than it was trained on."""
    core = Tokenizer(models.BPE())
    _qwen2_rules(core)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    tokenizer.chat_template = CHATML
    return tokenizer
