"""A character-level Hugging Face tokenizer for the embedded model.

Built with the ``tokenizers`` library and wrapped as ``PreTrainedTokenizerFast``,
so ``AutoTokenizer.from_pretrained`` loads it from a checkpoint directory with
nothing of rlmap installed.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = "0123456789+-*=() abcdefghijklmnopqrstuvwxyz.,:?"


def build_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    """One token per character, plus pad/bos/eos/unk (ids 0..3)."""
    vocab = {token: i for i, token in enumerate((*SPECIALS, *dict.fromkeys(characters)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
