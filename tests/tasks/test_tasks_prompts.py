"""Prompt encoding: chat template when the tokenizer has one, the tokenizer's own encoding
(<bos> + text for the embedded one) otherwise."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from rlmap.tasks.prompts import decode_response, encode_prompt, encode_response
from rlmap.tasks.tokenizer import build_tokenizer


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
