"""Resume under faults: no checkpoint yet, an edited config, damaged checkpoints.

Before: a run killed before its first checkpoint and resumed logged steps 0, 1, 0, 1, 2, 3;
an edited ``config.yaml`` was resumed silently with the old optimiser state; a missing
``trainer_state.pt`` or a truncated safetensors file ended in a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.experiments import train as train_module
from rlmap.recipes import load_config

Toy = Callable[..., list[str]]


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(run: Path, toy: Toy, model_dir: Path, *extra: str) -> int:
    return main(["train", "--out", str(run), *toy(model_dir, steps=4), "run.checkpoint_every=2",
                 *extra])  # fmt: skip


def _crash_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    real = train_module.sync_step

    def crashing(parts, state):  # type: ignore[no-untyped-def]
        if state.step + 1 == step:
            raise KeyboardInterrupt("simulated kill")
        return real(parts, state)

    monkeypatch.setattr(train_module, "sync_step", crashing)


@pytest.fixture(scope="module")
def finished(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 steps with checkpoints at 2 and 4 (built once, copied by the tests)."""
    from conftest import _toy_overrides

    run = tmp_path_factory.mktemp("finished") / "run"
    assert _train(run, _toy_overrides, tiny_model_dir) == 0
    return run


def test_a_run_killed_before_its_first_checkpoint_starts_over_cleanly(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
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
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


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
    damage: Callable[[Path], None], named: str, finished: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
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


def test_more_steps_with_a_cosine_schedule_are_refused(tiny_model_dir: Path, tmp_path: Path,
                                                        toy: Toy) -> None:  # fmt: skip
    run = tmp_path / "run"
    assert _train(run, toy, tiny_model_dir, "optim.schedule=cosine") == 0
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("steps: 4", "steps: 6"))
    with pytest.raises(ConfigError, match=r"^optim.steps: cannot change on resume"):
        train_module.run_training(load_config(config), run, resume=True)
