"""Hugging Face ``datasets`` as a task (``data.task=hf:...``): datasets built on disk here
(nothing downloaded: the Hub is switched off), their rows read as a file's, and the
GSM8K and MATH formats trained on with the tiny model."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmap.assembly.data import labelled_prompts, load_data
from rlmap.assembly.environments import environment_factory
from rlmap.assembly.models import load_tokenizer
from rlmap.core.errors import InputError
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.datafiles import load_file_examples, load_labelled_examples
from rlmap.tasks.hf_datasets import HFSource, parse

datasets = pytest.importorskip("datasets")

GSM8K = [
    ("Tom has 3 apples and buys 4. How many?", "3 + 4 = <<3+4=7>>7\n#### 7", "7"),
    ("A pen costs $2. Cost of 500 pens?", "2 * 500 = <<2*500=1000>>1000\n#### 1,000", "1000"),
    ("Sam had 9 cards, gave 2 away. Left?", "9 - 2 = <<9-2=7>>7\n#### 7", "7"),
    ("5 boxes of 6 eggs: how many eggs?", "5 * 6 = <<5*6=30>>30\n#### 30", "30"),
    ("Half of 48 clips, plus 48?", "48/2 = <<48/2=24>>24\n24 + 48 = 72\n#### 72", "72"),
    ("Ann reads 12 pages a day. 3 days?", "12 * 3 = 36\n#### 36", "36"),
]
"""(question, answer as GSM8K stores it, the reference read out of it)."""

MATH = [
    ("What is $1/2$ as a fraction?", "It is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("Simplify $\\sqrt{12}$.", "$\\sqrt{12} = \\boxed{2\\sqrt{3}}$", "2\\sqrt{3}"),
    ("Solve $x + 2 = 5$.", "First \\boxed{5-2}, so $x = \\boxed{3}$.", "3"),
    ("Compute $2^{10}$.", "$2^{10} = \\boxed{1024}$", "1024"),
    ("What is $0.25$ as a fraction?", "$\\boxed{\\frac{1}{4}}$", "\\frac{1}{4}"),
    ("Evaluate $3!$.", "$3! = \\boxed{6}$", "6"),
]
"""(problem, solution as MATH stores it, the reference read out of it)."""


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Hub, and ``datasets``' cache in the test's own directory. ``datasets`` reads the
    variables when it is imported, so its settings are set as well."""
    import huggingface_hub.constants

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def save(path: Path, splits: dict[str, dict[str, list[object]]] | dict[str, list[object]]) -> Path:
    """``splits`` saved with ``save_to_disk``: a DatasetDict when keyed by split name, else
    one Dataset (its columns). The progress bars go nowhere."""
    with contextlib.redirect_stderr(io.StringIO()):
        if all(isinstance(v, dict) for v in splits.values()):
            parts = {k: datasets.Dataset.from_dict(v) for k, v in splits.items()}
            datasets.DatasetDict(parts).save_to_disk(str(path))
        else:
            datasets.Dataset.from_dict(splits).save_to_disk(str(path))
    return path


def gsm8k_columns(rows: list[tuple[str, str, str]]) -> dict[str, list[object]]:
    return {"question": [q for q, _, _ in rows], "answer": [a for _, a, _ in rows]}


def test_the_task_string_parts() -> None:
    assert parse("hf:openai/gsm8k:main@train") == HFSource("openai/gsm8k", "main", "train")
    assert parse("hf:/data/saved@test") == HFSource("/data/saved", None, "test")
    assert parse("hf:./saved") == HFSource("./saved")
    assert parse("hf:gsm8k:main") == HFSource("gsm8k", "main")
    for bad, part in (("hf:", "dataset"), ("hf:gsm8k:@train", "config"), ("hf:gsm8k@", "split")):
        with pytest.raises(InputError, match=rf"^{bad}: the {part} is empty; the form is hf:"):
            parse(bad)


def test_a_saved_dataset_dict_loads_by_path_split_by_split(tmp_path: Path) -> None:
    test_rows = [("Two plus two?", "#### 4", "4")]
    path = save(
        tmp_path / "gsm8k", {"train": gsm8k_columns(GSM8K), "test": gsm8k_columns(test_rows)}
    )
    task = f"hf:{path}@train"
    labelled = load_labelled_examples(task, "question", "answer", "gsm8k")
    assert [e for _, e in labelled] == [Example(q, ref) for q, _, ref in GSM8K]
    assert labelled[4][0] == f"{task} row 4"  # counted from 0, as datasets counts
    (held,) = load_file_examples(f"hf:{path}@test", "question", "answer", "gsm8k")
    assert held == Example("Two plus two?", "4")
    # the answer as stored, with answer_format left at plain
    assert load_file_examples(task, "question", "answer")[0].answer == GSM8K[0][1]


def test_train_and_held_out_splits_of_one_dataset(tmp_path: Path) -> None:
    path = save(
        tmp_path / "gsm8k", {"train": gsm8k_columns(GSM8K[:5]), "test": gsm8k_columns(GSM8K[5:])}
    )
    args = [
        f"data.task=hf:{path}@train",
        f"data.eval_path=hf:{path}@test",
        "data.prompt_field=question",
        "data.answer_format=gsm8k",
    ]
    cfg = build_config("grpo", None, args)
    train, heldout = load_data(cfg)
    assert [e.answer for e in train] == ["7", "1000", "7", "30", "72"]
    assert [e.answer for e in heldout] == ["36"]
    assert labelled_prompts(cfg)[5] == (f"hf:{path}@test row 0", GSM8K[5][0])


def test_one_saved_split_needs_no_name_and_refuses_one(tmp_path: Path) -> None:
    path = save(tmp_path / "one", {"prompt": ["1+1="], "answer": ["2"]})
    assert load_file_examples(f"hf:{path}") == [Example("1+1=", "2")]
    with pytest.raises(InputError, match=r"is a single split .* no split 'train'; drop '@train'"):
        load_file_examples(f"hf:{path}@train")
    only = save(tmp_path / "dict", {"train": {"prompt": ["1+1="], "answer": ["2"]}})
    assert load_file_examples(f"hf:{only}") == [Example("1+1=", "2")]


def test_a_split_must_be_named_or_known(tmp_path: Path) -> None:
    rows = {"prompt": ["1+1="], "answer": ["2"]}
    path = save(tmp_path / "d", {"train": rows, "test": rows})
    with pytest.raises(InputError) as err:
        load_file_examples(f"hf:{path}")
    assert str(err.value) == (
        f"hf:{path}: it has the splits train, test; name one, as in hf:{path}@train"
    )
    with pytest.raises(InputError) as err:
        load_file_examples(f"hf:{path}@validation")
    assert str(err.value) == f"hf:{path}@validation: no split 'validation'; it has train, test"


def test_a_missing_field_names_the_columns(tmp_path: Path) -> None:
    path = save(tmp_path / "d", {"train": gsm8k_columns(GSM8K)})
    with pytest.raises(InputError) as err:
        load_file_examples(f"hf:{path}@train")  # the default prompt field, "prompt"
    assert str(err.value) == (
        f"hf:{path}@train: no column 'prompt' (data.prompt_field); its columns: question, answer"
    )


def test_a_bad_row_is_named_by_its_index(tmp_path: Path) -> None:
    path = save(tmp_path / "d", {"question": ["a", "b", "c"], "answer": ["#### 1", None, "#### 3"]})
    with pytest.raises(InputError) as err:
        load_file_examples(f"hf:{path}", "question", "answer", "gsm8k")
    assert str(err.value) == f"hf:{path} row 1: field 'answer' must be a string, got NoneType"
    path = save(tmp_path / "e", {"question": ["a", "b"], "answer": ["#### 1", "so 2"]})
    with pytest.raises(InputError, match=rf"^hf:{path} row 1: field 'answer': no '####'"):
        load_file_examples(f"hf:{path}", "question", "answer", "gsm8k")


def test_chat_rows_of_a_dataset_are_read_as_a_files(tmp_path: Path) -> None:
    messages = [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "1+1="},
            {"role": "assistant", "content": "\\boxed{2}"},
        ]
    ]
    path = save(tmp_path / "chat", {"messages": messages})
    (example,) = load_file_examples(f"hf:{path}", answer_format="math")
    assert (example.prompt, example.answer) == ("1+1=", "2")
    assert example.messages == (("system", "Be brief."), ("user", "1+1="))


def test_a_directory_of_data_files_loads_through_load_dataset(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    for split, rows in (("train", GSM8K[:4]), ("test", GSM8K[4:])):
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a, _ in rows)
        )
    examples = load_file_examples(f"hf:{folder}@test", "question", "answer", "gsm8k")
    assert [e.answer for e in examples] == ["72", "36"]
    with pytest.raises(
        InputError,
        match=rf"^hf:{folder}:main@test: cannot load the dataset "
        r"\(BuilderConfig 'main' not found",
    ):
        load_file_examples(f"hf:{folder}:main@test")


def test_what_cannot_be_loaded_is_one_line_naming_the_task(tmp_path: Path) -> None:
    saved = save(tmp_path / "d", {"train": {"prompt": ["1"], "answer": ["1"]}})
    cases = {
        f"hf:{tmp_path}/absent@train": f"no such directory '{tmp_path}/absent'",
        "hf:./absent": "no such directory 'absent'",
        f"hf:{saved}:main@train": "a dataset saved with save_to_disk has no configs; drop ':main'",
        # a Hub name with the Hub switched off: the library's own reason, nothing downloaded
        "hf:someone/no-such-dataset@train": "cannot load the dataset (Couldn't reach",
    }
    for task, problem in cases.items():
        with pytest.raises(InputError) as err:
            load_file_examples(task)
        assert str(err.value).startswith(f"{task}: {problem}") and "\n" not in str(err.value)


def test_rlmap_tasks_lists_hf_datasets() -> None:
    from rlmap.tasks.catalog import listing

    assert "hf:NAME@SPLIT" in listing()


# --- training on GSM8K- and MATH-format rows: the reference itself scores 1 ---------------------


def _scorer(args: list[str]) -> Callable[[Example, str], float]:
    """The reward of a response to an example in the run's environment (its verifier)."""
    cfg = build_config("grpo", None, args)
    tokenizer = load_tokenizer(Path(cfg.model.path))
    make_env = environment_factory(cfg, tokenizer)

    def reward(example: Example, response: str) -> float:
        env = make_env(example)
        env.reset()
        ids = tokenizer.encode(response, add_special_tokens=False)
        return float(env.step([*ids, tokenizer.eos_token_id]).reward)

    return reward


@pytest.mark.parametrize("fmt", ["gsm8k", "math"])
def test_each_format_trains_and_scores_its_references(
    fmt: str, wide_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    rows, fields = (
        (GSM8K, ["question", "answer"]) if fmt == "gsm8k" else (MATH, ["problem", "solution"])
    )
    if fmt == "gsm8k":  # GSM8K as a JSONL file
        task = tmp_path / "gsm8k.jsonl"
        task.write_text(
            "".join(json.dumps(dict(zip(fields, r[:2], strict=True))) + "\n" for r in rows)
        )
        source = str(task)
    else:  # MATH as a datasets directory, loaded by path
        path = save(
            tmp_path / "math", {"train": {f: [r[i] for r in rows] for i, f in enumerate(fields)}}
        )
        source = f"hf:{path}@train"
    args = [
        *toy(wide_model_dir),
        f"data.task={source}",
        "data.eval_size=2",
        f"data.prompt_field={fields[0]}",
        f"data.answer_field={fields[1]}",
        f"data.answer_format={fmt}",
    ]
    train, heldout = load_data(build_config("grpo", None, args))
    assert [e.answer for e in heldout + train] == [ref for _, _, ref in rows]
    reward = _scorer(args)
    for example, (_, solution, reference) in zip(heldout + train, rows, strict=True):
        # math_equiv (the format's verifier): the reference as an answer (MATH's boxed, as
        # math-verify reads LaTeX in a response only between $ or in a box), and the whole
        # solution as the dataset writes it, both score 1; a wrong answer 0
        answer = reference if fmt == "gsm8k" else f"\\boxed{{{reference}}}"
        assert reward(example, answer) == 1.0, answer
        assert reward(example, solution) == 1.0, solution
    assert reward(heldout[0], "#### 999" if fmt == "gsm8k" else "\\boxed{999}") == 0.0
    summary = run_training(build_config("grpo", None, args), tmp_path / "run")
    records = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert summary["before"]["eval/pass@1"] is not None
