"""A user task from a JSONL file: one ``{"prompt": ..., "answer": ...}`` object per line.

Blank lines are skipped; anything else that is not such an object stops the run
before any work starts, with a one-line error naming ``path:lineno`` and the fault.
Other keys on a line are ignored (files exported from other tools carry ids).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.tasks.arithmetic import Example

FIELDS = ("prompt", "answer")


def parse_record(line: str, fields: tuple[str, ...] = FIELDS) -> dict[str, str]:
    """One line's string ``fields``; raises ValueError saying what is wrong (no location)."""
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"invalid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for field in fields:
        if field not in obj:
            raise ValueError(f"missing field {field!r}")
        if not isinstance(obj[field], str):
            raise ValueError(f"field {field!r} must be a string, got {type(obj[field]).__name__}")
    return {field: obj[field] for field in fields}


def parse_example(line: str) -> Example:
    """One line as an Example; raises ValueError saying what is wrong (no location)."""
    return Example(**parse_record(line))


def load_records(path: Path, fields: tuple[str, ...], kind: str) -> list[dict[str, str]]:
    """The string ``fields`` of every line; raises ConfigError ``path:lineno: problem``.

    A missing, unreadable or empty file (no non-blank line) is a ConfigError too;
    ``kind`` (plural) names what the file holds in that message.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the file of {kind} ({err})") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(parse_record(line, fields))
        except ValueError as err:
            raise ConfigError(f"{path}:{lineno}: {err}") from None
    if not records:
        raise ConfigError(f"{path}: no {kind} (the file is empty)")
    return records


def load_examples(path: Path) -> list[Example]:
    """All examples of a JSONL file; raises ConfigError ``path:lineno: problem``."""
    return [Example(**r) for r in load_records(path, FIELDS, "examples")]
