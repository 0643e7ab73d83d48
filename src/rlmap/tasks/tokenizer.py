"""A character-level Hugging Face tokenizer for the embedded model.

Built with the ``tokenizers`` library and wrapped as ``PreTrainedTokenizerFast``,
so ``AutoTokenizer.from_pretrained`` loads it from a checkpoint directory with
nothing of rlmap installed.
"""

from __future__ import annotations

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
    """
    tokens = (*SPECIALS, *dict.fromkeys(characters), *dict.fromkeys(extra_tokens))
    vocab = {token: i for i, token in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
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
    ours = [vocab.get(t) for t in SPECIALS] == [0, 1, 2, 3] and all(c in vocab for c in CHARACTERS)
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
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(CHAT_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    core.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|endoftext|>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"], padding_side="left",
    )  # fmt: skip
    tokenizer.chat_template = CHATML
    return tokenizer
