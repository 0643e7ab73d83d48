"""Reference answers out of the solutions that public datasets store (``data.answer_format``).

GSM8K and MATH do not store a bare answer: their answer field is a worked solution that
ends in the answer, marked. Training compares a response with the answer alone, so the
reference is cut out of the solution once, when the row is read:

- ``gsm8k``: the text after the last ``####`` (GSM8K writes ``... #### 72``), stripped,
  with thousands separators removed (``#### 1,000`` → ``1000``);
- ``math``: the content of the last ``\\boxed{...}``, braces balanced
  (``\\boxed{\\frac{1}{2}}`` → ``\\frac{1}{2}``);
- ``plain``: the field as it is (rlmap's own files, and any that store bare answers).

The prompt is never touched: it is the question, as the row has it. A solution without
its marker is an error (:func:`extract_reference` raises ValueError; the loader adds the
row), never an empty reference that no response could match.
"""

from __future__ import annotations

from typing import Literal

AnswerFormat = Literal["plain", "gsm8k", "math"]
FORMATS: tuple[AnswerFormat, ...] = ("plain", "gsm8k", "math")
GSM8K_MARK = "####"
BOXED = "\\boxed{"


def extract_reference(text: str, fmt: AnswerFormat) -> str:
    """The reference answer in the solution ``text`` stored in format ``fmt``; ValueError
    saying what is missing (no location: the caller names the row)."""
    if fmt == "gsm8k":
        return _gsm8k(text)
    if fmt == "math":
        return _last_boxed(text)
    return text


def _gsm8k(text: str) -> str:
    """The answer after GSM8K's last ``####``, thousands separators dropped (GSM8K answers
    are integers, written ``1,000`` in a few hundred rows)."""
    _, mark, tail = text.rpartition(GSM8K_MARK)
    if not mark:
        raise ValueError(
            f"no {GSM8K_MARK!r} (data.answer_format=gsm8k reads the answer after "
            f"the last one) in {_shown(text)}"
        )
    answer = tail.strip().replace(",", "")
    if not answer:
        raise ValueError(f"nothing after the last {GSM8K_MARK!r} in {_shown(text)}")
    return answer


def _last_boxed(text: str) -> str:
    """The content of the last ``\\boxed{...}``: the braces are counted, so nested groups
    (``\\frac{1}{2}``) stay inside; an escaped brace (``\\{``) is text, not a group."""
    start = text.rfind(BOXED)
    if start < 0:
        raise ValueError(
            f"no \\boxed{{...}} (data.answer_format=math reads the answer in the "
            f"last one) in {_shown(text)}"
        )
    depth, i = 1, start + len(BOXED)
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # a command or an escaped brace: the next character is not a group's
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            answer = text[start + len(BOXED) : i].strip()
            if not answer:
                raise ValueError(f"the last \\boxed{{}} is empty in {_shown(text)}")
            return answer
        i += 1
    raise ValueError(
        f"the last \\boxed{{ (character {start + 1}) is never closed in {_shown(text)}"
    )


def _shown(text: str, width: int = 40) -> str:
    """The end of ``text``, where the marker would be, short enough for a one-line error."""
    return repr(text if len(text) <= width else "..." + text[-width:])
