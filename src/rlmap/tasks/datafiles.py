"""A user task from a data file: JSONL, JSON or Parquet, plain or chat-format rows.

``data.task=FILE`` reads, by the file's suffix:

- ``.jsonl`` (and any other existing file: ``.ndjson``, ``.txt``): one JSON object per line
  (:mod:`rlmap.tasks.jsonl`: errors name ``file:line``);
- ``.json``: a JSON array of objects (errors name ``file row N``, counted from 0 as
  ``datasets`` and pandas count);
- ``.parquet``: a table, read with pyarrow (the reader ``datasets`` itself uses; nothing is
  cached, no progress bar), errors as for ``.json``.

A row is either plain — ``data.prompt_field`` (default ``prompt``) and
``data.answer_field`` (default ``answer``), both strings — or in chat format: a
``messages`` list of ``{"role", "content"}`` (roles system, user, assistant, tool). A
chat row's final assistant message is its answer (without one, the answer field is); the
messages before it are the prompt, rendered with the model's chat template. Other keys of a
row are ignored (exported files carry ids).

``data.answer_format`` says how the answer stores the reference (:mod:`rlmap.tasks.answers`:
GSM8K's ``#### 72``, MATH's ``\\boxed{...}``); the reference is cut out as the row is read,
so a row without its marker is refused with the others. A Hugging Face ``datasets``
dataset (``data.task=hf:...``, :mod:`rlmap.tasks.hf_datasets`) is rows like a file's, each
named ``hf:... row N``.

Every format passes the same two guards of :mod:`rlmap.tasks.jsonl` before anything is
tokenised: a row over ``MAX_ROW_BYTES`` (a JSONL line's bytes; a JSON or Parquet row's
size as compact JSON, the line it would be in a ``.jsonl`` file) is refused — a 16 MiB
prompt once took 10 GB and two minutes in the tokenizer before any error — and so is a
prompt, answer or message that is not text (a lone surrogate escape; for Parquet, a string
column holding bytes that are not UTF-8).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError, first_line
from rlmap.tasks import hf_datasets
from rlmap.tasks.answers import AnswerFormat, extract_reference
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.jsonl import check_row_size, check_text, load_numbered, string_fields

ROLES = ("system", "user", "assistant", "tool")
SUFFIXES = (".jsonl", ".json", ".parquet")


def is_data_file(task: str) -> bool:
    """Whether ``data.task`` names a data file (by its suffix)."""
    return Path(task).suffix.lower() in SUFFIXES


def row_converter(
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    answer_format: AnswerFormat = "plain",
) -> Callable[[dict[str, Any]], Example]:
    """A row (a mapping) → an Example, its answer the reference ``answer_format`` reads out
    of the answer (a chat row's too); ValueError saying what is wrong (no location)."""

    def convert(row: dict[str, Any]) -> Example:
        field = f"field {answer_field!r}"
        if prompt_field not in row and "messages" in row:
            example = _chat_row(row, answer_field)
            if example.messages is not None and len(example.messages) < len(row["messages"]):
                field = "the final assistant message"
        else:
            fields = string_fields(row, (prompt_field, answer_field))
            example = Example(prompt=fields[prompt_field], answer=fields[answer_field])
        try:
            return replace(example, answer=extract_reference(example.answer, answer_format))
        except ValueError as err:
            raise ValueError(f"{field}: {err}") from None

    return convert


def _chat_row(row: dict[str, Any], answer_field: str) -> Example:
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("field 'messages' must be a non-empty list of {role, content}")
    turns: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be an object, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(
                f"messages[{i}].content must be a string, got {type(content).__name__}"
            )
        turns.append((role, check_text(content, f"messages[{i}].content")))
    if turns[-1][0] == "assistant":
        *prompt, (_, answer) = turns
    else:
        prompt, answer = turns, string_fields(row, (answer_field,))[answer_field]
    users = [content for role, content in prompt if role == "user"]
    if not users:
        raise ValueError("messages: no user message before the answer")
    return Example(prompt=users[-1], answer=answer, messages=tuple(prompt))


def load_labelled_examples(
    source: Path | str,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    answer_format: AnswerFormat = "plain",
) -> list[tuple[str, Example]]:
    """(label, example) of every row of a data file or ``hf:`` dataset: the label is
    ``file:line`` (JSONL) or ``file row N`` (``hf:... row N``); InputError naming the file
    and row on the first bad one, and on a file that cannot be read or holds no rows."""
    convert = row_converter(prompt_field, answer_field, answer_format)
    if isinstance(source, str) and hf_datasets.is_hf(source):
        split = hf_datasets.load_rows(source, prompt_field, answer_field)
        return _convert_rows(source, split, convert, "the split")
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix == ".jsonl" or (suffix not in SUFFIXES and path.is_file()):  # .ndjson, .txt: lines
        return [(f"{path}:{n}", e) for n, e in load_numbered(path, "examples", convert)]
    if suffix == ".json":
        rows: Iterable[Any] = _json_rows(path)
    elif suffix == ".parquet":
        rows = _parquet_rows(path)
    else:
        raise ConfigError(
            f"data.task: {str(path)!r} is neither a built-in task (arithmetic, "
            "calculator), reasoning_gym:NAME, hf:NAME, nor a data file (.jsonl, "
            ".json, .parquet); rlmap tasks lists the tasks"
        )
    return _convert_rows(path, rows, convert, "the file")


def _convert_rows(
    where: Path | str, rows: Iterable[Any], convert: Callable[[dict[str, Any]], Example], whole: str
) -> list[tuple[str, Example]]:
    """(``where row N``, example) of every row, each passing the row-size guard first;
    InputError naming the first bad row, or ``whole`` (the file, the split) when empty."""
    out = []
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise ValueError(f"expected an object, got {type(row).__name__}")
            check_row_size(_json_size(row))
            out.append((f"{where} row {i}", convert(row)))
        except ValueError as err:
            raise InputError(f"{where} row {i}: {err}") from None
    if not out:
        raise InputError(f"{where}: no examples ({whole} has no rows)")
    return out


def load_file_examples(
    source: Path | str,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    answer_format: AnswerFormat = "plain",
) -> list[Example]:
    """Every example of a data file or ``hf:`` dataset (see :func:`load_labelled_examples`)."""
    labelled = load_labelled_examples(source, prompt_field, answer_field, answer_format)
    return [e for _, e in labelled]


def _json_size(row: dict[str, Any]) -> int:
    """A row's size in bytes as compact JSON (UTF-8), the measure a JSONL line is held to.
    Parquet values JSON has no type for (dates, bytes) count as their text; a lone surrogate
    counts as its three bytes, so that :func:`check_text` is the one to name it."""
    text = json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode("utf-8", "surrogatepass"))


def _json_rows(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except OSError as err:
        raise InputError(f"{path}: cannot read the file of examples ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 (byte {err.start})") from None
    except json.JSONDecodeError as err:
        hint = "; one object per line is a .jsonl file" if "Extra data" in err.msg else ""
        raise InputError(
            f"{path}:{err.lineno}: invalid JSON ({err.msg} at column {err.colno}){hint}"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: invalid JSON (nested too deeply)") from None
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON array of rows, got {type(data).__name__}")
    return data


def _parquet_rows(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "data.task: Parquet files need pyarrow (pip install pyarrow, or "
            "datasets, which brings it)"
        ) from None
    try:
        table = pq.read_table(path)
        return list(table.to_pylist())
    except OSError as err:
        raise InputError(
            f"{path}: cannot read the file of examples ({err.strerror or err})"
        ) from None
    except UnicodeDecodeError:  # Arrow checks UTF-8 when it writes, not when it reads
        raise InputError(_not_utf8(path, table)) from None
    except Exception as err:  # pyarrow's ArrowInvalid for a damaged or foreign file
        raise InputError(f"{path}: not a Parquet file ({first_line(err)})") from None


def _not_utf8(path: Path, table: Any) -> str:
    """The error line naming the first row and column of ``table`` holding a string that is
    not UTF-8 (a writer that does not check, or a lone surrogate's three bytes). Only on the
    error path: the columns are converted one by one, then the bad ones value by value."""
    bad = []
    for name in table.column_names:
        try:
            table.column(name).to_pylist()
        except UnicodeDecodeError:
            bad.append(name)
    for i in range(table.num_rows):
        for name in bad:
            try:
                table.column(name)[i].as_py()
            except UnicodeDecodeError as err:
                byte = err.object[err.start : err.start + 1].hex()
                return (
                    f"{path} row {i}: field {name!r} is not UTF-8 (byte 0x{byte} at "
                    f"column {err.start + 1} of its text)"
                )
    return f"{path}: a string is not UTF-8"
