"""A character-level Hugging Face tokenizer for the embedded model.

Built with the ``tokenizers`` library and wrapped as ``PreTrainedTokenizerFast``,
so ``AutoTokenizer.from_pretrained`` loads it from a checkpoint directory with
nothing of rlmap installed.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

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
    bos = vocab["<bos>"]
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
