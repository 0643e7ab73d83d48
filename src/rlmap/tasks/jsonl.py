"""JSONL files: one JSON object per line (a task's examples, preference pairs).

Blank lines are skipped; anything else that is not such an object stops the run
before any work starts, with a one-line :class:`InputError` naming ``path:lineno``
and the fault. Other keys on a line are ignored (files exported from other tools
carry ids). The file is read line by line as bytes: a line that is not UTF-8 is
named by its number (not by a byte offset into the file), and a line over
``MAX_ROW_BYTES`` is refused before it is parsed or tokenised (a 50 MiB prompt
stalls or aborts the tokenizer library; no model has a context that long).

The two guards every data format shares live here (:mod:`rlmap.tasks.datafiles` calls
them for JSON and Parquet rows): :func:`check_row_size`, and :func:`check_text` on every
string a tokenizer will see — valid JSON can hold a lone surrogate (``"\\ud800"``, half
of a UTF-16 pair), which Python keeps in a ``str`` and every tokenizer refuses.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rlmap.core.errors import InputError

T = TypeVar("T")
FIELDS = ("prompt", "answer")
MAX_ROW_BYTES = 1 << 20
"""The longest line accepted, in bytes (1 MiB, about 250k tokens of English text)."""


def check_row_size(size: int) -> None:
    """ValueError (no location) for a row of ``size`` bytes over ``MAX_ROW_BYTES``: the one
    size guard of every data format, called before the row is tokenised (and, for a JSONL
    line, before it is parsed)."""
    if size > MAX_ROW_BYTES:
        raise ValueError(
            f"row longer than {MAX_ROW_BYTES} bytes (1 MiB), the limit of one "
            "row; it is refused before tokenising"
        )


def check_text(value: str, field: str) -> str:
    """``value``, or a ValueError naming ``field`` and its first lone surrogate: a string a
    tokenizer would refuse with a TypeError naming neither."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{field} holds a lone surrogate (\\u{ord(value[err.start]):04x} at character "
            f"{err.start + 1}), half of a UTF-16 pair, which is not text"
        ) from None
    return value


def parse_object(line: str) -> dict[str, Any]:
    """One line's JSON object; raises ValueError saying what is wrong (no location)."""
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"invalid JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise ValueError("invalid JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def parse_record(line: str, fields: tuple[str, ...] = FIELDS) -> dict[str, str]:
    """One line's string ``fields``; raises ValueError saying what is wrong (no location)."""
    return string_fields(parse_object(line), fields)


def string_fields(obj: dict[str, Any], fields: tuple[str, ...]) -> dict[str, str]:
    """``obj``'s string ``fields``; ValueError naming the first missing or non-string one."""
    for field in fields:
        if field not in obj:
            raise ValueError(f"missing field {field!r}")
        if not isinstance(obj[field], str):
            raise ValueError(f"field {field!r} must be a string, got {type(obj[field]).__name__}")
        check_text(obj[field], f"field {field!r}")
    return {field: obj[field] for field in fields}


def _decode(raw: bytes, lineno: int) -> str:
    """One line as text; ValueError naming the first byte that is not UTF-8."""
    try:  # a byte-order mark is accepted on the first line (some editors write one)
        return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as err:
        byte = raw[err.start : err.start + 1].hex()
        raise ValueError(f"not UTF-8 (byte 0x{byte} at column {err.start + 1})") from None


def _lines(path: Path, kind: str) -> list[tuple[int, bytes]]:
    """(line number, raw line) of every line; InputError when unreadable or a line is too long."""
    lines = []
    try:
        with open(path, "rb") as f:
            for lineno in itertools.count(1):
                # no further than the limit and a CRLF: a 50 MiB line costs 1 MiB, and a line
                # of exactly the limit keeps its "\r\n" (else its "\n" would count as a line)
                raw = f.readline(MAX_ROW_BYTES + 2)
                if not raw:
                    break
                try:
                    check_row_size(len(raw.rstrip(b"\r\n")))
                except ValueError as err:
                    raise InputError(f"{path}:{lineno}: {err}") from None
                lines.append((lineno, raw))
    except OSError as err:
        raise InputError(f"{path}: cannot read the file of {kind} ({err.strerror})") from None
    return lines


def load_numbered(
    path: Path, kind: str, convert: Callable[[dict[str, Any]], T]
) -> list[tuple[int, T]]:
    """(line number, ``convert(object)``) of every non-blank line, in order; InputError
    ``path:lineno: problem`` at the first bad line (not JSON, not an object, or refused by
    ``convert`` with a ValueError).

    A missing, unreadable or empty file (no non-blank line) is an InputError too;
    ``kind`` (plural) names what the file holds in that message.
    """
    rows = []
    for lineno, raw in _lines(Path(path), kind):
        try:
            line = _decode(raw.rstrip(b"\r\n"), lineno)
            if line.strip():
                rows.append((lineno, convert(parse_object(line))))
        except ValueError as err:
            raise InputError(f"{path}:{lineno}: {err}") from None
    if not rows:
        raise InputError(f"{path}: no {kind} (the file is empty)")
    return rows


def load_numbered_records(
    path: Path, fields: tuple[str, ...], kind: str
) -> list[tuple[int, dict[str, str]]]:
    """(line number, string ``fields``) of every non-blank line (see :func:`load_numbered`)."""
    return load_numbered(path, kind, lambda obj: string_fields(obj, fields))


def load_records(path: Path, fields: tuple[str, ...], kind: str) -> list[dict[str, str]]:
    """The string ``fields`` of every line (see :func:`load_numbered_records`)."""
    return [record for _, record in load_numbered_records(path, fields, kind)]
