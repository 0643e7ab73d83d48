"""What an AI judge is shown and how its reply is read: the request templates (pointwise
and pairwise, the embedded judge's), their placeholders, and the parsers of a rating
(:func:`parse_score`) and of a pairwise choice (:func:`parse_choice`). Pure text; the
HTTP client is :mod:`rlmap.feedback.judge_client`, the rewards :mod:`rlmap.feedback.judge`.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Literal

from rlmap.core.errors import ConfigError

POINTWISE_TEMPLATE = """\
Rate the response to the task below for correctness, from {lo} (wrong) to {hi} (correct).
Reply with the number only.

Task:
{prompt}

Response:
{response}

Rating:"""

PAIRWISE_TEMPLATE = """\
Which response answers the task below correctly? Reply with A or B only, or TIE if they
are equally good.

Task:
{prompt}

Response A:
{first}

Response B:
{second}

Better response:"""

EMBEDDED_POINTWISE = "{response}?{prompt}"
"""The embedded judge's pointwise template (``feedback.judge_template=embedded``):
``19?12+7=``, answered with its own sum, then ``1`` or ``0`` (``19:1``;
:mod:`rlmap.learned.judge_model`)."""
EMBEDDED_PAIRWISE = "{first},{second}?{prompt}"
"""... and its pairwise one: ``18,19?12+7=``, answered ``19:b``."""

FIELDS = {
    "pointwise": ({"prompt", "response", "reference", "lo", "hi"}, {"response"}),
    "pairwise": ({"prompt", "first", "second", "reference"}, {"first", "second"}),
}
"""Per mode: the placeholders a template may use, and those it must use."""


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_LETTER = re.compile(r"\b([AB])\b")
_KEYWORD = re.compile(r"(?i)\b(?:rating|score)\b[^\w+-]*(" + _NUMBER.pattern + ")")
_LEADING = re.compile("(" + _NUMBER.pattern + r")(?=$|[\s.,;:!)/]|out\b)")
_RANGE = re.compile(r"\d+(?:\.\d+)?\s*(?:-|–|\bto\b)\s*\d+(?:\.\d+)?")
_EMBEDDED_REPLY = re.compile(r"-?\d*:(\d)")
_LAST_LETTER = re.compile(r"(?:^|[:,]\s*)([ABab])[.!]?$")
_TIE = re.compile(r"(?i)\W*(?:it'?s\s+)?(?:a\s+)?(?:tie|equal(?:ly good)?)\b")


def load_template(path: str | None, mode: Literal["pointwise", "pairwise"]) -> str:
    """The prompt template of ``mode``: the file at ``path``, the built-in one (None), or the
    embedded judge's short one (``embedded``).

    A template is ``str.format`` text; it may use only the mode's placeholders and must use
    the ones that carry the responses. Errors are one line naming ``feedback.judge_template``.
    """
    if path is None:
        return POINTWISE_TEMPLATE if mode == "pointwise" else PAIRWISE_TEMPLATE
    if path == "embedded":
        return EMBEDDED_POINTWISE if mode == "pointwise" else EMBEDDED_PAIRWISE
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"feedback.judge_template: cannot read {path} ({exc.strerror})") from None
    allowed, required = FIELDS[mode]
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"feedback.judge_template: {path}: {exc}") from None
    unknown, missing = sorted(names - allowed), sorted(required - names)
    if unknown or missing:
        what = (
            (f"unknown placeholder(s) {unknown}" if unknown else "")
            + ("; " if unknown and missing else "")
            + (f"missing {missing}" if missing else "")
        )
        raise ConfigError(
            f"feedback.judge_template: {path}: {what} (a {mode} template may use {sorted(allowed)})"
        )
    return text


# --- parsing -----------------------------------------------------------------------------


def parse_score(reply: str, lo: float, hi: float) -> float | None:
    """The reply's rating mapped from [lo, hi] to [0, 1]; None if there is none, or it lies
    outside the range (an unparseable reply: ``INVALID``). Ranges ("0-10", "1 to 10") are
    never ratings. The rating is, in this order: the verdict of the embedded judge's
    ``SUM:VERDICT`` ("19:1"); the number after "rating" or "score" ("Rating (0-10): 7",
    "Score: -2"); the number the reply starts with ("7/10", "8 out of 10", "7. The answer
    is right but step 3 is unclear"); the last ("I would rate it 7 on a scale of 0 to 10")."""
    text = reply.strip()
    embedded = _EMBEDDED_REPLY.fullmatch(text)
    if embedded is not None:
        return _in_range(float(embedded.group(1)), lo, hi)
    text = _RANGE.sub(" ", text)
    found = _KEYWORD.search(text) or _LEADING.match(text)
    if found is not None:
        value = float(found.group(1))
    else:
        numbers = _NUMBER.findall(text)
        if not numbers:
            return None
        value = float(numbers[-1])
    return _in_range(value, lo, hi)


def _in_range(value: float, lo: float, hi: float) -> float | None:
    if not lo <= value <= hi:
        return None
    return (value - lo) / (hi - lo)


def parse_choice(reply: str) -> float | None:
    """0 if the reply picks A (the first shown), 1 for B, ½ for a tie (a reply that starts
    "tie", "it's a tie", "equal"), None if it names neither or both. A reply that is one
    letter, ``a`` or ``b`` in either case, picks it; one that names both picks only the
    letter it leads with, alone or followed by punctuation ("A, because B is wrong"; not
    "A better answer is B"); one that names neither picks a lone letter that ends it after
    ":" or "," (the embedded judge's "19:b")."""
    text = reply.strip()
    alone = text.rstrip(".!").upper()
    if alone in ("A", "B"):
        return float("AB".index(alone))
    if _TIE.match(text):  # "TIE", "It's a tie", "Equally good: both are right"
        return 0.5
    letters = set(_LETTER.findall(text))
    if len(letters) == 1:
        return 0.0 if letters == {"A"} else 1.0
    first = re.match(r"\W*([AB])\s*(?:[,.:;)!]|$)", text)
    if first is None and not letters:  # "19:b": a lowercase letter alone at the end
        first = _LAST_LETTER.search(text)
    return None if first is None else float("AB".index(first.group(1).upper()))
