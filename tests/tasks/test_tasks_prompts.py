"""Prompt encoding: chat template when the tokenizer has one, <bos> + text otherwise."""

from __future__ import annotations

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
