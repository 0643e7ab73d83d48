"""Resume under faults: no checkpoint yet, an edited config, damaged checkpoints.

Before: a run killed before its first checkpoint and resumed logged steps 0, 1, 0, 1, 2, 3;
an edited ``config.yaml`` was resumed silently with the old optimiser state; a missing
``trainer_state.pt`` or a truncated safetensors file ended in a traceback; a trainer state
without a field (the asynchronous queue) ended in ``internal error (KeyError: ...)`` after
metrics, samples and ``resumes.jsonl`` had been changed for a resume that never happened.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
import torch

from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.experiments import train as train_module
from rlmap.experiments import train_step
from rlmap.experiments.checkpoint import list_checkpoints
from rlmap.experiments.checkpoint_load import load_trainer_state
from rlmap.experiments.resume import ResumePoint, go_ahead, resume_point_of
from rlmap.recipes import load_config
from rlmap.runs.rundir import read_jsonl

Toy = Callable[..., list[str]]


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(run: Path, toy: Toy, model_dir: Path, *extra: str) -> int:
    return main(
        ["train", "--out", str(run), *toy(model_dir, steps=4), "run.checkpoint_every=2", *extra]
    )


def _crash_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    real = train_step.sync_step

    def crashing(parts, state):  # type: ignore[no-untyped-def]
        if state.step + 1 == step:
            raise KeyboardInterrupt("simulated kill")
        return real(parts, state)

    monkeypatch.setattr(train_step, "sync_step", crashing)


@pytest.fixture(scope="module")
def finished(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 steps with checkpoints at 2 and 4 (built once, copied by the tests)."""
    from conftest import _toy_overrides

    run = tmp_path_factory.mktemp("finished") / "run"
    assert _train(run, _toy_overrides, tiny_model_dir) == 0
    return run


def test_a_run_killed_before_its_first_checkpoint_starts_over_cleanly(
    tiny_model_dir: Path,
    tmp_path: Path,
    toy: Toy,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    _crash_at(monkeypatch, 2)  # steps 0 and 1 logged, no checkpoint (every 2)
    with pytest.raises(KeyboardInterrupt):
        _train(run, toy, tiny_model_dir)
    assert _steps(run) == [0, 1] and not (run / "checkpoints").exists()
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0
    assert _steps(run) == [0, 1, 2, 3, 4]  # before: 0, 1, 0, 1, 2, 3, 4
    assert "starting over from step 0" in capsys.readouterr().err
    resumes = [json.loads(x) for x in (run / "resumes.jsonl").read_text().splitlines()]
    assert resumes[0]["from"] is None


def _copy(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    return to


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_an_edited_config_is_refused_naming_the_field_and_nothing_changes(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(finished, tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(re.sub(r"(?m)^  lr: 5.0e-05$", "  lr: 3.0e-05", config.read_text()))
    before = _tree(run)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("rlmap: error: optim.lr: changed in"), err
    assert "5e-05 -> 3e-05" in err
    assert _tree(run) == before


def test_more_steps_are_accepted_on_resume_and_recorded(finished: Path, tmp_path: Path) -> None:
    run = _copy(finished, tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("steps: 4", "steps: 5"))
    assert main(["train", "--resume", str(run)]) == 0
    assert _steps(run) == [0, 1, 2, 3, 4, 5]
    record = json.loads((run / "resumes.jsonl").read_text().splitlines()[-1])
    assert record["from"] == "step_4" and record["changes"] == {"optim.steps": [4, 5]}


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda c: (c / "trainer_state.pt").unlink(), "trainer_state.pt: missing"),
        (lambda c: _truncate(c / "trainer_state.pt"), "trainer_state.pt: damaged"),
        (lambda c: _truncate(c / "model.safetensors"), "model.safetensors: damaged"),
        (lambda c: (c / "config.json").write_text('{"model_type": '), "config.json: not valid"),
    ],
)
def test_a_damaged_newest_checkpoint_is_skipped_for_the_newest_intact_one(
    damage: Callable[[Path], None],
    named: str,
    finished: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _copy(finished, tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("steps: 4", "steps: 5"))
    damage(run / "checkpoints" / "step_4")
    assert main(["train", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert named in err and "skipped" in err and "Traceback" not in err
    assert _steps(run) == [0, 1, 2, 3, 4, 5]  # redone from step 2
    assert (run / "checkpoints" / "step_4").is_dir()  # written again by the resumed run
    kept = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("damaged-")]
    assert len(kept) == 1 and kept[0].startswith("damaged-step_4-")  # kept, not deleted


def test_every_checkpoint_damaged_is_one_line_naming_the_file(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(finished, tmp_path / "run")
    for ckpt in (run / "checkpoints").iterdir():
        (ckpt / "trainer_state.pt").unlink()
    before = _tree(run)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "step_4/trainer_state.pt: missing" in err
    assert _tree(run) == before


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_refused_resume_leaves_a_damaged_checkpoint_where_it_was(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the damaged step_4 was renamed aside, then the edited config was refused.
    run = _copy(finished, tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(re.sub(r"(?m)^  lr: 5.0e-05$", "  lr: 3.0e-05", config.read_text()))
    (run / "checkpoints" / "step_4" / "trainer_state.pt").unlink()
    before = _tree(run)
    assert main(["train", "--resume", str(run)]) == 2
    assert capsys.readouterr().err.startswith("rlmap: error: optim.lr: changed")
    assert _tree(run) == before and not (run / "resumes.jsonl").exists()


def test_more_steps_with_a_cosine_schedule_are_refused(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    run = tmp_path / "run"
    assert _train(run, toy, tiny_model_dir, "optim.schedule=cosine") == 0
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("steps: 4", "steps: 6"))
    with pytest.raises(ConfigError, match=r"^optim.steps: cannot change on resume"):
        train_module.run_training(load_config(config), run, resume=True)


# --- issue 27: a checkpoint missing a field is damaged; a refused resume changes nothing ----

UNREAD = {
    ("rng", "cuda"),
    ("extra", "config"),
    ("schedulers", "*", "_is_initial"),
    ("schedulers", "*", "_get_lr_called_within_step"),
    ("optimizers", "*", "state"),
}
"""What is not walked into, field by field: CUDA's RNG (a machine's fact; none on CPU), the
saved config (compared with ``config.yaml`` as a whole: a field gone is a change refused,
three fields of it are checked below), two flags torch sets only around a scheduler's
``step``, and the optimiser's per-parameter state (torch's own, keyed by parameter)."""
CONFIG_FIELDS = [
    ("extra", "config", "system", "mode"),
    ("extra", "config", "system", "learners"),
    ("extra", "config", "critic", "enabled"),
]
"""The saved config's fields that say which other fields a checkpoint holds."""


def saved_fields(state: dict[str, Any], at: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field of a trainer state as written, by path: each key of each dict, nested
    dicts walked (lists are values: the queue's items are checked on their own)."""
    out = []
    for key, value in state.items():
        path = (*at, key)
        if any(
            len(u) == len(path) and all(a in ("*", b) for a, b in zip(u, path, strict=True))
            for u in UNREAD
        ):
            continue
        out.append(path)
        if isinstance(value, dict):
            out += saved_fields(value, path)
    return out


def without(state: dict[str, Any], path: Sequence[str | int]) -> dict[str, Any]:
    """A deep copy of ``state`` less the field at ``path``."""
    copy = deepcopy(state)
    parent: Any = copy
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return copy


def assert_each_field_is_required(
    run: Path, paths: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    """For each field: a newest checkpoint without it is damaged (the resume goes on from
    the one before, naming it); with every checkpoint without it, the resume is refused in
    one line naming it, and the run directory is byte for byte as it was."""
    cfg = load_config(run / "config.yaml")
    *_, older, newest = list_checkpoints(run)
    files = {ckpt: ckpt / "trainer_state.pt" for ckpt in (older, newest)}
    originals = {ckpt: load_trainer_state(ckpt) for ckpt in files}
    for path in paths:
        field = ".".join(path)
        torch.save(without(originals[newest], path), files[newest])
        point = resume_point_of(cfg, run)  # the decision alone: it moves nothing
        assert point.ckpt == older, field
        assert point.damaged == [(newest, f"{files[newest]}: {field}: missing")]
        torch.save(without(originals[older], path), files[older])
        before = _tree(run)
        assert main(["train", "--resume", str(run)]) == 2, field
        err = capsys.readouterr().err
        assert err == (
            f"rlmap: error: {files[newest]}: {field}: missing; no intact checkpoint "
            "to resume from\n"
        )
        assert _tree(run) == before, field
        torch.save(originals[older], files[older])


def test_a_synchronous_checkpoint_missing_any_field_is_damaged_and_refusing_changes_nothing(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(finished, tmp_path / "run")
    paths = saved_fields(load_trainer_state(run / "checkpoints" / "step_4"))
    for must in [
        ("optimizers", "policy", "param_groups"),
        ("extra", "loop", "cursor"),
        ("extra", "ledger", "generated_tokens"),
        ("rng", "numpy"),
    ]:
        assert must in paths  # the walk reached every level
    assert_each_field_is_required(run, paths + CONFIG_FIELDS, capsys)


def test_a_newest_checkpoint_missing_its_loop_state_is_set_aside_and_the_run_goes_on(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(finished, tmp_path / "run")
    state = run / "checkpoints" / "step_4" / "trainer_state.pt"
    torch.save(without(torch.load(state, weights_only=True), ["extra", "loop"]), state)
    assert main(["train", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"{state}: extra.loop: missing; skipped (kept as damaged-step_4-" in err
    assert _steps(run) == [0, 1, 2, 3, 4]  # step 3 and 4 redone from step 2, not doubled
    kept = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("damaged-")]
    assert len(kept) == 1 and (run / "checkpoints" / "step_4").is_dir()
    (record,) = [v for _, v in read_jsonl(run / "resumes.jsonl")]
    assert record["from"] == "step_2" and "extra.loop: missing" in record["skipped"][0]


def test_a_resume_after_a_torn_resumes_line_appends_a_line_of_its_own(tmp_path: Path) -> None:
    # Before: the new record was appended onto the torn one: one unparseable line for two.
    log = tmp_path / "resumes.jsonl"
    log.write_text('{"from": "step_2", "changes": {}, "skipped": [], "time": 1.0}\n{"from": ')
    go_ahead(tmp_path, ResumePoint(None, None, {}, []))  # a resume that starts over
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and [json.loads(x)["from"] for x in lines] == ["step_2", None]


def test_a_restore_that_fails_after_the_checks_changes_nothing(
    finished: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A failure the field check cannot see (optimiser state whose shapes no longer fit the
    # model, say) comes while the state is put back. Before: the damaged step_4 had been set
    # aside, resumes.jsonl written and metrics.jsonl cut back by then.
    from rlmap.core.errors import InputError
    from rlmap.experiments import train as train_module

    run = _copy(finished, tmp_path / "run")
    (run / "checkpoints" / "step_4" / "trainer_state.pt").unlink()  # step_2 is the one to use

    def failing(*args: object) -> None:
        raise InputError("step_2/trainer_state.pt: optimizer state does not fit the model")

    monkeypatch.setattr(train_module, "_restore", failing)
    before = _tree(run)
    assert main(["train", "--resume", str(run)]) == 2
    assert "does not fit the model" in capsys.readouterr().err
    assert _tree(run) == before and not (run / "resumes.jsonl").exists()


def test_optimiser_state_that_does_not_fit_the_model_is_one_line_and_changes_nothing(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real failure the test above stands in for: step_2's AdamW moment of parameter 0
    # flattened, as a checkpoint of another model would hold it. PyTorch's own check counts
    # tensors only, so before the resume failed inside step 3's optimiser step.
    run = _copy(finished, tmp_path / "run")
    (run / "checkpoints" / "step_4" / "trainer_state.pt").unlink()  # step_2 is the one to use
    path = run / "checkpoints" / "step_2" / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    moments = state["optimizers"]["policy"]["state"][0]
    shape = tuple(moments["exp_avg"].shape)
    moments["exp_avg"] = moments["exp_avg"].flatten()
    torch.save(state, path)
    before = _tree(run)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(path.parent) in err, err
    assert f"exp_avg of parameter 0 has shape ({math.prod(shape)},), the parameter {shape}" in err
    assert _tree(run) == before and not (run / "resumes.jsonl").exists()
