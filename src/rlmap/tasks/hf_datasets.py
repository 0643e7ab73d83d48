"""A Hugging Face ``datasets`` dataset as a task: ``data.task=hf:PATH_OR_NAME[:CONFIG][@SPLIT]``.

Its rows are read as a data file's (:mod:`rlmap.tasks.datafiles` converts them: the same
``data.prompt_field`` / ``data.answer_field``, chat rows, row guards and
``data.answer_format``); this module only finds the rows. ``PATH_OR_NAME`` is, in order:

- a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``, read
  with ``datasets.load_from_disk`` (nothing downloaded, nothing cached; it has no configs);
- any other name, passed to ``datasets.load_dataset(PATH_OR_NAME, CONFIG)``: a directory of
  data files, or a Hub dataset (``openai/gsm8k:main@train``), from the network or the
  local cache (``HF_DATASETS_OFFLINE=1`` keeps it to the cache).

A path that does not exist (it starts with ``/``, ``.`` or ``~``, or has two ``/``) is
refused without asking the Hub. ``@SPLIT`` picks a split; without one, a dataset of a
single split is that split, and one of several is refused with their names (a held-out
split is ``data.eval_path=hf:...@test``). Errors name the task as written, and a row's
by its index from 0 (``hf:gsm8k:main@train row 17``), as ``datasets`` counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError, first_line

PREFIX = "hf:"
SHAPE = "hf:PATH_OR_NAME[:CONFIG][@SPLIT]"
SAVED_MARKERS = ("dataset_dict.json", "state.json")
"""The file ``save_to_disk`` writes at the top of a DatasetDict's, or a Dataset's, directory."""


@dataclass(frozen=True)
class HFSource:
    """The parts of ``hf:PATH_OR_NAME[:CONFIG][@SPLIT]``."""

    path: str
    """A directory, or a dataset's name on the Hub (``openai/gsm8k``)."""
    config: str | None = None
    """The dataset's configuration (GSM8K: ``main`` or ``socratic``); None: its default."""
    split: str | None = None
    """The split read (``train``, ``test``); None: the only one there is."""


def is_hf(task: str) -> bool:
    """Whether ``data.task`` (or ``data.eval_path``) names a ``datasets`` dataset."""
    return task.startswith(PREFIX)


def parse(task: str) -> HFSource:
    """The parts of ``task``: the split after the last ``@``, the config after the last
    ``:`` before it. InputError naming ``task`` for an empty part."""
    body = task.removeprefix(PREFIX)
    name, at, split = body.rpartition("@") if "@" in body else (body, "", "")
    path, colon, config = name.rpartition(":") if ":" in name else (name, "", "")
    for part, given, what in (
        (path, True, "dataset"),
        (config, colon, "config"),
        (split, at, "split"),
    ):
        if given and not part:
            raise InputError(f"{task}: the {what} is empty; the form is {SHAPE}")
    return HFSource(path, config or None, split or None)


def load_rows(task: str, prompt_field: str, answer_field: str) -> list[dict[str, Any]]:
    """Every row of the split ``task`` names, as a mapping (a file's row); InputError naming
    ``task`` for a dataset that cannot be loaded, a split it lacks, or a field none of its
    columns holds (a chat ``messages`` column is checked row by row, as in a file)."""
    source = parse(task)
    dataset = _pick_split(task, _load(task, source), source.split)
    columns = list(dataset.column_names)
    if "messages" not in columns:
        for field, name in ((prompt_field, "prompt_field"), (answer_field, "answer_field")):
            if field not in columns:
                raise InputError(
                    f"{task}: no column {field!r} (data.{name}); its columns: {_listed(columns)}"
                )
    rows: list[dict[str, Any]] = dataset.to_list()
    return rows


def _load(task: str, source: HFSource) -> Any:
    """The Dataset or DatasetDict ``source`` names (see the module's docstring)."""
    datasets = _require()
    path = Path(source.path).expanduser()
    if any((path / marker).is_file() for marker in SAVED_MARKERS):
        if source.config is not None:
            raise InputError(
                f"{task}: a dataset saved with save_to_disk has no configs; drop ':{source.config}'"
            )
        try:
            return datasets.load_from_disk(str(path))
        except (OSError, ValueError) as err:  # a damaged or partly copied directory
            raise InputError(f"{task}: cannot load the saved dataset ({first_line(err)})") from None
    local = source.path.startswith(("/", ".", "~")) or source.path.count("/") > 1
    if local and not path.exists():
        raise InputError(f"{task}: no such directory {str(path)!r}")
    try:
        return datasets.load_dataset(source.path, source.config)
    except Exception as err:  # datasets raises a dozen types: Hub, files, builder configs
        raise InputError(f"{task}: cannot load the dataset ({first_line(err)})") from None


def _pick_split(task: str, loaded: Any, split: str | None) -> Any:
    """The split ``split`` of ``loaded`` (a DatasetDict), or ``loaded`` itself when it is a
    single Dataset (``Dataset.save_to_disk``) and no split is named."""
    if not hasattr(loaded, "keys"):  # a Dataset: one split, no name of its own to check
        if split is not None:
            raise InputError(
                f"{task}: the saved dataset is a single split (Dataset."
                f"save_to_disk), no split {split!r}; drop '@{split}'"
            )
        return loaded
    names = list(loaded.keys())
    if split is None and len(names) == 1:
        return loaded[names[0]]
    if split is None:
        raise InputError(
            f"{task}: it has the splits {_listed(names)}; name one, as in {task}@{names[0]}"
        )
    if split not in names:
        raise InputError(f"{task}: no split {split!r}; it has {_listed(names)}")
    return loaded[split]


def _listed(names: list[str], most: int = 12) -> str:
    """``names`` for a one-line error: a dataset may have hundreds of columns."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _require() -> Any:
    """The ``datasets`` module, or a ConfigError saying how to install it."""
    try:
        import datasets  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            f"data.task: {SHAPE} needs the datasets package (pip install 'rlmap[hf]')"
        ) from None
    return datasets
