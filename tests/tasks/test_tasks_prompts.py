"""Prompt encoding: chat template when the tokenizer has one, the tokenizer's own encoding
(<bos> + text for the embedded one) otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.tasks.prompts import decode_response, encode_prompt, encode_response


def test_plain_tokenizer_gets_bos_and_characters() -> None:
    tok = build_tokenizer()
    ids = encode_prompt(tok, "1+2=")
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == "1+2="
    response = encode_response(tok, "3")
    assert response[-1] == tok.eos_token_id and decode_response(tok, response) == "3"


def test_chat_template_is_used_when_present() -> None:
    tok = build_tokenizer()
    tok.chat_template = "{% for m in messages %}q:{{ m['content'] }}{% endfor %}a:"
    ids = encode_prompt(tok, "1+2=")
    assert tok.decode(ids) == "q:1+2=a:"


def test_a_saved_tokenizer_encodes_a_prompt_as_training_does_in_plain_transformers(
    tmp_path: Path,
) -> None:
    build_tokenizer().save_pretrained(tmp_path)
    plain = AutoTokenizer.from_pretrained(tmp_path)
    # <bos>=1, '1'=5, '2'=6, '+'=14, '='=17 (ids: 4 specials, then "0123456789+-*=...")
    assert plain("12+2=")["input_ids"] == [1, 5, 6, 14, 6, 17]
    assert plain("12+2=")["input_ids"] == encode_prompt(plain, "12+2=")
    assert plain.decode(plain("12+2=")["input_ids"], skip_special_tokens=True) == "12+2="


def test_an_embedded_tokenizer_saved_before_it_added_bos_gets_it_back(tmp_path: Path) -> None:
    # Checkpoints of older rlmap versions have no post-processor: without this their prompts
    # lost the <bos> they were trained with (and answered "4" to "12+34=").
    from rlmap.assembly.models import load_tokenizer

    old = build_tokenizer()
    old.backend_tokenizer.post_processor = None
    old.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("1+2=")["input_ids"][0] != 1  # as saved
    assert encode_prompt(load_tokenizer(tmp_path), "1+2=") == [1, 5, 14, 6, 17]


def test_a_tokenizer_that_closes_every_text_does_not_close_a_prompt() -> None:
    tok = build_tokenizer()  # make it append <eos> as T5/BERT-style tokenizers do
    from tokenizers import processors

    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 1), ("<eos>", 2)]
    )
    assert tok("1+2=")["input_ids"][-1] == 2
    assert encode_prompt(tok, "1+2=") == [1, 5, 14, 6, 17]  # <bos> 1 + 2 =, no <eos>


def test_a_prompt_encoder_gives_encode_prompts_ids_encoding_each_text_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.tasks import prompts

    tok = build_tokenizer()
    encoded: list[str] = []

    def counted(tokenizer: PreTrainedTokenizerBase, text: str, tools: Any = ()) -> list[int]:
        encoded.append(text)
        return encode_prompt(tokenizer, text, tools)

    monkeypatch.setattr(prompts, "encode_prompt", counted)
    encoder = prompts.PromptEncoder(tok)
    texts = ["1+2=", "37+85=", "1+2=", "1+2="]  # a group's environments reset to one prompt
    assert [encoder(t) for t in texts] == [encode_prompt(tok, t) for t in texts]
    assert encoded == ["1+2=", "37+85="]
    mine = encoder("1+2=")
    mine.append(99)  # each caller gets its own list: changing it leaves the memo alone
    assert encoder("1+2=") == encode_prompt(tok, "1+2=")


def test_a_word_level_embedded_tokenizer_of_older_rlmap_still_gets_its_bos(tmp_path: Path) -> None:
    # before byte-level symbols, a space was the token " ": such a checkpoint is still ours
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlmap.assembly.models import load_tokenizer
    from rlmap.embedded.tokenizer import CHARACTERS, SPECIALS

    vocab = {t: i for i, t in enumerate((*SPECIALS, *CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    names = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
    PreTrainedTokenizerFast(tokenizer_object=core, **names).save_pretrained(tmp_path)
    assert load_tokenizer(tmp_path)("1 a")["input_ids"] == [1, 5, 20, 21]


def test_the_character_tokens_are_byte_level_symbols() -> None:
    from rlmap.embedded.tokenizer import byte_symbol

    # GPT-2's byte alphabet: printable ASCII stands for itself; space (0x20) is the 33rd
    # byte that does not, so 256 + 32 = 288 = "Ġ"; newline (0x0a), the 11th: 266 = "Ċ"
    assert [byte_symbol(c) for c in "a= \n"] == ["a", "=", "Ġ", "Ċ"]
    vocab = build_tokenizer().get_vocab()
    assert vocab["Ġ"] == 4 + 16 and " " not in vocab  # after the 4 specials; " " is CHARACTERS[16]
    with pytest.raises(ValueError, match="ASCII"):
        build_tokenizer(characters="aé")
