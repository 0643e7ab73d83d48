"""The JSONL task loader: valid files, and one-line errors that name the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmap.core.errors import InputError
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.datafiles import load_file_examples as load_examples


def test_loads_examples_skipping_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "task.jsonl"
    path.write_text(
        '{"prompt": "2+2=", "answer": "4", "id": 7}\n\n   \n{"prompt": "Q?", "answer": ""}\n'
    )
    assert load_examples(path) == [Example("2+2=", "4"), Example("Q?", "")]


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"prompt": "a", "answer": "b"', "invalid JSON"),
        ('["a", "b"]', "expected a JSON object, got list"),
        ('"just a string"', "expected a JSON object, got str"),
        ('{"answer": "b"}', "missing field 'prompt'"),
        ('{"prompt": "a"}', "missing field 'answer'"),
        ('{"prompt": "a", "answer": 4}', "field 'answer' must be a string, got int"),
        ('{"prompt": null, "answer": "4"}', "field 'prompt' must be a string, got NoneType"),
    ],
)
def test_malformed_line_names_file_line_and_problem(
    tmp_path: Path, bad_line: str, problem: str
) -> None:
    path = tmp_path / "task.jsonl"
    # line 1 valid, line 2 blank, line 3 the bad one: the blank line still counts
    path.write_text(f'{{"prompt": "1+1=", "answer": "2"}}\n\n{bad_line}\n')
    with pytest.raises(InputError) as err:
        load_examples(path)
    message = str(err.value)
    assert message.startswith(f"{path}:3: {problem}")
    assert "\n" not in message


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "task.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match="no examples"):
        load_examples(path)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_examples(tmp_path / "absent.jsonl")


def test_a_line_of_exactly_the_limit_with_crlf_keeps_the_line_numbers(tmp_path: Path) -> None:
    from rlmap.tasks.jsonl import MAX_ROW_BYTES

    # {"prompt": "P", "answer": "1"}: 12 bytes before P, 17 after: 29 + len(P) = the limit.
    # Read as MAX_ROW_BYTES + 1 bytes, the "\n" of its "\r\n" would be a line of its own,
    # and the bad line 2 would be named line 3.
    line = '{"prompt": "' + "1" * (MAX_ROW_BYTES - 29) + '", "answer": "1"}'
    assert len(line) == MAX_ROW_BYTES
    path = tmp_path / "task.jsonl"
    path.write_bytes(line.encode() + b"\r\n" + b'{"prompt": "1+1="}\r\n')
    with pytest.raises(InputError, match=rf"^{path}:2: missing field 'answer'"):
        load_examples(path)


def test_a_pair_with_a_lone_surrogate_names_its_line_and_field(tmp_path: Path) -> None:
    from rlmap.tasks.jsonl import load_records

    path = tmp_path / "pairs.jsonl"
    path.write_text(
        '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'
        '{"prompt": "1+1=", "chosen": "\\ud800", "rejected": "3"}\n'
    )
    with pytest.raises(InputError) as err:
        load_records(path, ("prompt", "chosen", "rejected"), "pairs")
    assert str(err.value) == (
        f"{path}:2: field 'chosen' holds a lone surrogate (\\ud800 at "
        "character 1), half of a UTF-16 pair, which is not text"
    )
