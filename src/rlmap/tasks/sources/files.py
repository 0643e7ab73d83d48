"""Your own rows: a data file (.jsonl, .json or .parquet; prompt/answer or chat messages)
or a ``datasets`` dataset (``hf:NAME@SPLIT``), read as a file's rows
(:mod:`rlmap.tasks.datafiles`, :mod:`rlmap.tasks.hf_datasets`). The fallback kind: any
``data.task`` no other kind claims names a file."""

from __future__ import annotations

from rlmap.core.errors import ConfigError
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.datafiles import load_file_examples, load_labelled_examples
from rlmap.tasks.kind import DataSettings, Labelled, TaskKind


def splits(d: DataSettings) -> tuple[list[Example], list[Example]]:
    """``data.eval_path``'s rows held out, else the first ``data.eval_size`` rows."""
    fields = (d.prompt_field, d.answer_field, d.answer_format)
    train = load_file_examples(d.task, *fields)  # a data file or an hf: dataset's split
    if d.eval_path is not None:
        return train, load_file_examples(d.eval_path, *fields)
    if len(train) <= d.eval_size:
        raise ConfigError(f"data.eval_size: {d.eval_size} held out leaves no training prompts")
    return train[d.eval_size :], train[: d.eval_size]


def prompts(d: DataSettings) -> list[Labelled]:
    """Each row's prompt, labelled ``file:line`` (JSONL) or ``file row N``."""
    sources = [d.task, *([d.eval_path] if d.eval_path is not None else [])]
    fields = (d.prompt_field, d.answer_field, d.answer_format)
    return [(label, e.chat) for f in sources for label, e in load_labelled_examples(f, *fields)]


FILES = TaskKind(
    name="files",
    matches=lambda task: True,
    splits=splits,
    prompts=prompts,
    data_files=True,
    fallback=True,
    listing=(
        ("FILE", "your own rows: .jsonl, .json or .parquet, prompt/answer or chat messages"),
        (
            "hf:NAME@SPLIT",
            "a datasets dataset or save_to_disk directory, rows as a file's "
            "(hf:openai/gsm8k:main@train)",
        ),
    ),
)
