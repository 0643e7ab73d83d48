"""Resuming a run: where from, what may have changed, and what a resume leaves behind.

The decision comes first and touches nothing (:func:`resume_point_of`: the newest intact
checkpoint, its trainer state, the config changes it accepts, the damaged checkpoints);
refusals raise there. Intact means whole on disk *and* holding every field the resume
reads (:func:`state_problem`): a checkpoint without its optimiser, its RNG, its loop state
or an asynchronous run's queue is damaged like one cut short, found before anything is
cut back or set aside. Only once the run's parts are built does :func:`go_ahead` set the
damaged checkpoints aside and write the resume's line in ``resumes.jsonl``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.experiments.checkpoint_load import (
    RNG_SHAPE,
    Each,
    Shape,
    dataclass_shape,
    resume_point,
    set_aside,
    shape_problem,
    trainer_state_shape,
)
from rlmap.experiments.ledger import Ledger
from rlmap.learner.critic import CRITIC_DIR
from rlmap.recipes.build import build_config
from rlmap.recipes.config import RecipeConfig
from rlmap.runs.rundir import append_jsonl
from rlmap.system.loop_state import LoopState
from rlmap.system.snapshots import SNAPSHOT_SHAPE, snapshot_problem

RESUMABLE_CHANGES = ("optim.steps", "run.progress")
"""Fields of ``config.yaml`` a resume accepts changed (extend or shorten a run, hide the bar);
any other change is refused: the restored optimiser, scheduler and data would still follow
the old value, and ``config.yaml`` would no longer describe the run."""

RESUMES_FILE = "resumes.jsonl"


@dataclass(frozen=True)
class ResumePoint:
    """Where a resume goes on from, decided before anything in the run directory changes."""

    ckpt: Path | None
    """The newest intact checkpoint; None: the run starts over from step 0."""
    saved: dict[str, Any] | None
    """Its trainer state."""
    changes: dict[str, list[Any]]
    """The accepted config changes, field → [saved, current]."""
    damaged: list[tuple[Path, str]]
    """Newer checkpoints that are damaged, and why: set aside when the resume goes ahead."""


def resume_point_of(cfg: RecipeConfig, run_dir: Path) -> ResumePoint:
    """The checkpoint to resume from and its trainer state, or a start over.

    A config changed since the checkpoint is refused unless only :data:`RESUMABLE_CHANGES`
    differ (and ``optim.steps`` only with a constant schedule: a cosine one would jump).
    Refusals raise here, before any file is touched; so does a run whose every checkpoint
    is damaged.
    """
    models = [CRITIC_DIR] if cfg.critic.enabled else []
    ckpt, saved, damaged = resume_point(run_dir, models, state_problem)
    if ckpt is None or saved is None:
        return ResumePoint(None, None, {}, damaged)
    changes = config_changes(saved["extra"]["config"], cfg)
    refused = [c for c in changes if c[0] not in RESUMABLE_CHANGES]
    if refused:
        field, old, new = refused[0]
        raise ConfigError(
            f"{field}: changed in {run_dir / 'config.yaml'} since {ckpt.name} ({old!r} -> "
            f"{new!r}); a resumed run keeps its config (only {', '.join(RESUMABLE_CHANGES)} "
            "may change); put the config back, or start a new run from this one's checkpoint"
        )
    steps_changed = any(field == "optim.steps" for field, _, _ in changes)
    if steps_changed and cfg.optim.schedule != "constant":
        raise ConfigError(
            f"optim.steps: cannot change on resume with optim.schedule="
            f"{cfg.optim.schedule} (the learning rate would jump)"
        )
    if cfg.optim.steps < saved["step"]:
        raise ConfigError(
            f"optim.steps: {cfg.optim.steps} is below the step resumed from ({saved['step']})"
        )
    return ResumePoint(ckpt, saved, {f: [o, n] for f, o, n in changes}, damaged)


def go_ahead(run_dir: Path, point: ResumePoint) -> None:
    """The resume's side effects, once nothing can refuse it: damaged checkpoints set aside
    (each said on stderr), a start over said so, the line in ``resumes.jsonl``."""
    notes = set_aside(point.damaged)
    for note in notes:
        print(f"rlmap: {note}", file=sys.stderr)
    if point.ckpt is None:
        print(f"rlmap: {run_dir}: no checkpoint yet; starting over from step 0", file=sys.stderr)
    _record_resume(run_dir, point.ckpt, point.changes, notes)


CONFIG_SHAPE: dict[str, Shape] = {
    "extra": {"config": {"system": {"mode": str, "learners": int}, "critic": {"enabled": bool}}}
}
"""What a trainer state's saved config must say before the rest can be checked: the fields
that decide which other fields the checkpoint holds."""


def state_shape(mode: str, critic: bool, learners: int) -> dict[str, Shape]:
    """Every field :func:`rlmap.experiments.train` saves in a checkpoint of a run with this
    loop mode, critic and number of learner ranks, and what a resume reads of each: loop
    state, ledger and config always; the queue with its counters (asynchronous loop); each
    rank's RNG (several learner ranks)."""
    extra: dict[str, Shape] = {
        "loop": dataclass_shape(LoopState),
        "ledger": dataclass_shape(Ledger),
        "config": dict,
    }
    if mode != "sync":
        extra["async"] = SNAPSHOT_SHAPE
    if learners > 1:
        extra["rank_rng"] = Each(RNG_SHAPE)
    return trainer_state_shape(["policy", CRITIC_DIR] if critic else ["policy"], extra)


def state_problem(state: dict[str, Any]) -> str | None:
    """What a resume cannot read in a trainer state, by field (``extra.async.queue:
    missing``), or None. The fields expected are those of the run's own saved config (so
    a config edited since is refused as such, by :func:`resume_point_of`, not called
    damage); an asynchronous run's queue must load back whole."""
    problem = shape_problem(state, CONFIG_SHAPE)
    if problem is not None:
        return problem
    saved = state["extra"]["config"]
    mode = saved["system"]["mode"]
    shape = state_shape(mode, saved["critic"]["enabled"], saved["system"]["learners"])
    problem = shape_problem(state, shape)
    if problem is None and mode != "sync":
        problem = snapshot_problem(state["extra"]["async"], "extra.async.")
    return problem


def config_changes(saved: Mapping[str, Any], cfg: RecipeConfig) -> list[tuple[str, Any, Any]]:
    """(dotted field, saved value, current value) for every field that differs.

    A field the saved config lacks was added to rlmap after the checkpoint: it counts as
    the value the saved config gives it today (its recipe's, a new field's default being
    the behaviour from before it existed), so an upgrade does not refuse every resume.
    """
    now, was = _flat(cfg.model_dump(mode="json")), _flat(saved)
    if now.keys() - was.keys():
        was = _flat(_completed(saved)) | was
    return [
        (k, was.get(k), now.get(k))
        for k in sorted(now.keys() | was.keys())
        if was.get(k) != now.get(k)
    ]


def _completed(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """The saved config through today's config builder (missing fields filled in); empty
    when it no longer builds (the comparison then names the field that changed)."""
    try:
        return build_config(None, saved).model_dump(mode="json")
    except (ConfigError, AttributeError, KeyError, TypeError):  # not a config rlmap can build
        return {}


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _record_resume(
    run_dir: Path, ckpt: Path | None, changes: dict[str, Any], notes: list[str]
) -> None:
    """One line per resume in ``resumes.jsonl``: where from, what changed, what was skipped."""
    record = {
        "from": None if ckpt is None else ckpt.name,
        "changes": changes,
        "skipped": notes,
        "time": time.time(),
    }
    append_jsonl(run_dir / RESUMES_FILE, record)
