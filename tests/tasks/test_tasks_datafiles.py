"""Data files as people have them: JSONL, JSON and Parquet, plain or chat rows, fields
named in config; the chat rows rendered with the model's chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmap.assembly.data import check_prompt_lengths, labelled_prompts, load_data
from rlmap.assembly.environments import environment_factory
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.recipes import build_config
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.datafiles import load_file_examples, load_labelled_examples
from rlmap.tasks.prompts import encode_prompt

ROWS = [{"question": f"{a}+1=", "solution": str(a + 1), "id": a} for a in range(6)]
EXPECTED = [Example(f"{a}+1=", str(a + 1)) for a in range(6)]


def _write_all(tmp_path: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {s: tmp_path / f"task.{s}" for s in ("jsonl", "json", "parquet")}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    paths["json"].write_text(json.dumps(ROWS, indent=2))
    pq.write_table(pa.Table.from_pylist(ROWS), paths["parquet"])
    return paths


def test_the_three_formats_give_the_same_examples(tmp_path: Path) -> None:
    for path in _write_all(tmp_path).values():
        assert load_file_examples(path, "question", "solution") == EXPECTED, path.suffix


def test_labels_name_the_line_or_the_row(tmp_path: Path) -> None:
    paths = _write_all(tmp_path)
    assert [label for label, _ in load_labelled_examples(paths["jsonl"], "question", "solution")][
        :2
    ] == [f"{paths['jsonl']}:1", f"{paths['jsonl']}:2"]
    assert load_labelled_examples(paths["parquet"], "question", "solution")[5][0] == (
        f"{paths['parquet']} row 5"
    )


def test_a_chat_row_answer_is_its_final_assistant_message(tmp_path: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Add."},
                {"role": "user", "content": "1+1="},
                {"role": "assistant", "content": "2"},
            ]
        },
        {"messages": [{"role": "user", "content": "2+2="}], "answer": "4"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_file_examples(path)
    assert (first.prompt, first.answer) == ("1+1=", "2")
    assert first.messages == (("system", "Add."), ("user", "1+1="))
    assert (second.prompt, second.answer, second.messages) == ("2+2=", "4", (("user", "2+2="),))


TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_messages_go_through_the_template_and_plain_text_without_one() -> None:
    plain = build_tokenizer(characters="0123456789+-*=() abcdefghijklmnopqrstuvwxyz.,:?<>\n")
    messages = (("system", "add"), ("user", "1+1="))
    # no template: the contents one per line, with the tokenizer's own <bos>
    assert encode_prompt(plain, messages) == plain("add\n1+1=")["input_ids"]
    templated = build_tokenizer(characters="0123456789+-*=() abcdefghijklmnopqrstuvwxyz.,:?<>\n")
    templated.chat_template = TEMPLATE
    ids = encode_prompt(templated, messages)
    text = templated.decode(ids, skip_special_tokens=True)
    assert text == "<system>add\n<user>1+1=\n<assistant>"
    # one user text is the one-message conversation
    assert encode_prompt(templated, "1+1=") == encode_prompt(templated, (("user", "1+1="),))


def test_chat_rows_render_with_the_embedded_chat_models_template(tmp_path: Path) -> None:
    from rlmap.embedded.warmstart import chat_tokenizer

    row = {
        "messages": [
            {"role": "system", "content": "Add."},
            {"role": "user", "content": "1+1="},
            {"role": "assistant", "content": "2"},
        ]
    }
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (example,) = load_file_examples(path)
    tokenizer = chat_tokenizer()
    ids = encode_prompt(tokenizer, example.chat)
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )  # ChatML, the answer (the last assistant message) left out
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_a_chat_task_trains_on_its_rendered_prompts(tmp_path: Path) -> None:
    def chat(a: int) -> dict[str, object]:
        return {
            "messages": [
                {"role": "user", "content": f"{a}+1="},
                {"role": "assistant", "content": str(a + 1)},
            ]
        }

    rows = [chat(a) for a in range(12)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config("grpo", None, [f"data.task={path}", "data.eval_size=4"])
    train, heldout = load_data(cfg)
    assert len(train) == 8 and len(heldout) == 4 and train[0].messages is not None
    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"
    env = environment_factory(cfg, tokenizer)(train[0])
    assert tokenizer.decode(env.reset(), skip_special_tokens=True) == f"{train[0].prompt}="
    step = env.step(
        [*tokenizer.encode(train[0].answer, add_special_tokens=False), tokenizer.eos_token_id]
    )
    assert step.reward == 1.0


def test_a_chat_prompt_longer_than_the_context_names_its_row(tmp_path: Path) -> None:
    from rlmap.core.errors import InputError

    long = {
        "messages": [
            {"role": "system", "content": "1" * 40},
            {"role": "user", "content": "1"},
            {"role": "assistant", "content": "1"},
        ]
    }
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([ROWS[0] | {"prompt": "1=", "answer": "1"}, long]))
    cfg = build_config("grpo", None, [f"data.task={path}"])
    with pytest.raises(InputError, match=r"chat\.json row 1: prompt of \d+ tokens .* 32-position"):
        check_prompt_lengths(labelled_prompts(cfg), build_tokenizer(), 32)


def test_a_file_of_another_suffix_is_read_as_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "task.ndjson"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert load_file_examples(path, "question", "solution") == EXPECTED


def test_a_chat_template_that_refuses_a_row_names_it(tmp_path: Path) -> None:
    from rlmap.core.errors import InputError

    rows = [
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "1+1="},
            ],
            "answer": "2",
        }
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = build_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    cfg = build_config("grpo", None, [f"data.task={path}", f"data.eval_path={path}"])
    with pytest.raises(InputError, match=r"chat\.jsonl:1: the tokenizer's chat template refuses"):
        check_prompt_lengths(labelled_prompts(cfg), tokenizer, 512)


def test_field_names_are_refused_where_there_is_no_file() -> None:
    from rlmap.core.errors import ConfigError

    for task in ("arithmetic", "reasoning_gym:chain_sum"):
        with pytest.raises(ConfigError, match=r"^data.prompt_field: only data files"):
            build_config("grpo", None, [f"data.task={task}", "data.prompt_field=question"])
    assert build_config("grpo", None, ["data.task=x.jsonl", "data.answer_field=a"])


# --- the guards every format shares: the row size, and text that is not text ------------------


def _write_rows(tmp_path: Path, suffix: str, rows: list[dict[str, object]]) -> Path:
    """``rows`` as a data file of ``suffix``, JSON written compactly and unescaped, so that
    a row is the same bytes in every format (JSONL's line; the others' compact JSON)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / f"task.{suffix}"
    if suffix == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif suffix == "json":
        path.write_text(json.dumps(rows, ensure_ascii=False, separators=(",", ":")))
    else:
        path.write_text(
            "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
        )
    return path


def _where(path: Path, index: int) -> str:
    """How an error names row ``index`` (from 0): its line, or its row."""
    lines = path.suffix in (".jsonl", ".ndjson")
    return f"{path}:{index + 1}:" if lines else f"{path} row {index}:"


FORMATS = ["jsonl", "ndjson", "json", "parquet"]


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("char", ["1", "é"])
def test_a_row_one_byte_over_the_limit_is_refused_in_every_format(
    tmp_path: Path, suffix: str, char: str
) -> None:
    from rlmap.core.errors import InputError
    from rlmap.tasks.jsonl import MAX_ROW_BYTES

    # {"prompt":"P","answer":"1"}: 11 bytes before P ('{"prompt":"') and 15 after
    # ('","answer":"1"}'), so the row is 26 + bytes(P); "é" is 2 bytes in UTF-8.
    width = len(char.encode())
    fits = "1" * ((MAX_ROW_BYTES - 26) % width) + char * ((MAX_ROW_BYTES - 26) // width)
    assert (
        len(
            json.dumps(
                {"prompt": fits, "answer": "1"}, ensure_ascii=False, separators=(",", ":")
            ).encode()
        )
        == MAX_ROW_BYTES
    )
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": fits, "answer": "1"}]
    assert len(load_file_examples(_write_rows(tmp_path, suffix, rows))) == 2  # at the limit: kept
    rows.append({"prompt": fits + "1", "answer": "1"})  # one byte more: refused
    path = _write_rows(tmp_path, suffix, rows)
    with pytest.raises(InputError) as err:
        load_file_examples(path)
    assert str(err.value).startswith(f"{_where(path, 2)} row longer than {MAX_ROW_BYTES} bytes")
    assert "\n" not in str(err.value)


def test_a_held_out_file_passes_the_same_guard(tmp_path: Path) -> None:
    from rlmap.core.errors import InputError
    from rlmap.tasks.jsonl import MAX_ROW_BYTES

    train = _write_rows(tmp_path, "jsonl", [{"prompt": f"{a}+1=", "answer": "1"} for a in range(8)])
    heldout = tmp_path / "heldout.json"
    heldout.write_text(json.dumps([{"prompt": "1" * MAX_ROW_BYTES, "answer": "1"}]))
    cfg = build_config("grpo", None, [f"data.task={train}", f"data.eval_path={heldout}"])
    with pytest.raises(InputError, match=r"heldout\.json row 0: row longer than"):
        labelled_prompts(cfg)


SURROGATE_ROWS = [
    (
        {"prompt": "1+1=\ud800", "answer": "2"},
        "field 'prompt' holds a lone surrogate (\\ud800 at character 5)",
    ),
    (
        {"prompt": "1+1=", "answer": "\udfff"},
        "field 'answer' holds a lone surrogate (\\udfff at character 1)",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "1+1="},
                {"role": "assistant", "content": "2\udc00"},
            ]
        },
        "messages[1].content holds a lone surrogate (\\udc00 at character 2)",
    ),
]


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
@pytest.mark.parametrize(("row", "problem"), SURROGATE_ROWS)
def test_a_lone_surrogate_escape_names_its_row_and_field(
    tmp_path: Path, suffix: str, row: dict[str, object], problem: str
) -> None:
    from rlmap.core.errors import InputError

    # json.dumps escapes the surrogate as \ud800: valid JSON in a valid UTF-8 file
    path = tmp_path / f"task.{suffix}"
    rows = [{"prompt": "2+2=", "answer": "4"}, row]
    path.write_text(
        json.dumps(rows) if suffix == "json" else "".join(json.dumps(r) + "\n" for r in rows)
    )
    assert "\\ud" in path.read_text()
    with pytest.raises(InputError) as err:
        load_file_examples(path)
    tail = "half of a UTF-16 pair, which is not text"
    assert str(err.value) == f"{_where(path, 1)} {problem}, {tail}"


def _parquet_with_bad_utf8(path: Path, column: str, rows: int, bad_row: int) -> None:
    """A Parquet file whose string ``column`` holds, in ``bad_row``, the three bytes a lone
    surrogate would have (ED A0 80): pyarrow refuses to build that from Python, so the
    column is built from raw buffers, as a writer that does not check UTF-8 would."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = [f"{a}+1=".encode() for a in range(rows)]
    values[bad_row] = b"1+1=\xed\xa0\x80"
    binary = pa.array(values, pa.binary())
    strings = pa.Array.from_buffers(pa.string(), rows, binary.buffers())
    other = pa.array([str(a) for a in range(rows)])
    names = [column, "answer" if column != "answer" else "prompt"]
    pq.write_table(pa.table({names[0]: strings, names[1]: other}), path)


@pytest.mark.parametrize("column", ["prompt", "answer"])
def test_a_parquet_string_that_is_not_utf8_names_its_row_and_field(
    tmp_path: Path, column: str
) -> None:
    from rlmap.core.errors import InputError

    path = tmp_path / "task.parquet"
    _parquet_with_bad_utf8(path, column, rows=5, bad_row=3)
    with pytest.raises(InputError) as err:
        load_file_examples(path)
    # "1+1=" is 4 bytes: the bad byte 0xed is the 5th
    assert str(err.value) == (
        f"{path} row 3: field {column!r} is not UTF-8 (byte 0xed at column 5 of its text)"
    )


def test_a_parquet_chat_message_that_is_not_utf8_names_its_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlmap.core.errors import InputError

    contents = pa.Array.from_buffers(
        pa.string(), 4, pa.array([b"1+1=", b"2", b"2+2=", b"\xed\xa0\x80"], pa.binary()).buffers()
    )
    roles = pa.array(["user", "assistant"] * 2)
    messages = pa.StructArray.from_arrays([roles, contents], ["role", "content"])
    offsets = pa.array([0, 2, 4], pa.int32())
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.table({"messages": pa.ListArray.from_arrays(offsets, messages)}), path)
    with pytest.raises(InputError) as err:
        load_file_examples(path)
    assert str(err.value) == (
        f"{path} row 1: field 'messages' is not UTF-8 (byte 0xed at column 1 of its text)"
    )
