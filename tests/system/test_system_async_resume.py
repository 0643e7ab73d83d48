"""An asynchronous run killed at any point resumes exactly once: its queue, the rounds in
flight, the admission counters and the balance come back from the checkpoint."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_system_resume_faults import (
    CONFIG_FIELDS,
    assert_each_field_is_required,
    saved_fields,
    without,
)

from rlmap.assembly.parts import Parts, build
from rlmap.cli import main
from rlmap.core.batch import RewardStatus
from rlmap.engines.engine import Completion
from rlmap.experiments.checkpoint import latest_checkpoint, list_checkpoints
from rlmap.experiments.checkpoint_load import load_trainer_state
from rlmap.recipes import build_config
from rlmap.rollout.episodes import single_turn
from rlmap.rollout.packing import Scored
from rlmap.runs.rundir import read_jsonl
from rlmap.system import async_loop, round_seeds, snapshots
from rlmap.system.loop_state import LoopState

Toy = Callable[..., list[str]]
KILLER = Path(__file__).with_name("async_kill.py")
BATCH = 8  # the toy's prompts_per_step × group_size


def _args(toy: Toy, model_dir: Path) -> list[str]:
    return [
        *toy(model_dir, steps=8),
        "data.task=calculator",
        "data.max_turns=2",
        "generation.max_new_tokens=6",
        "critic.warmup_steps=1",
        "run.checkpoint_every=2",
        "run.eval_every=4",
        "system.partial_rollout=true",
        "behaviour.max_staleness=2",
    ]


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("point", "at"), [("mid-step", 5), ("mid-checkpoint", 4), ("queued", 4)])
def test_sao_killed_at_any_point_resumes_exactly_once(
    point: str, at: int, tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    run = tmp_path / "run"
    args = ["--recipe", "sao", "--out", str(run), *_args(toy, tiny_calc_model_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(
        [sys.executable, str(KILLER), point, str(at), "--", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (run / "summary.json").exists()
    saved = load_trainer_state(latest_checkpoint(run))
    snapshot = saved["extra"]["async"]
    if point == "queued":  # the case of the issue: work was queued when the run died
        assert snapshot["queue"] and saved["extra"]["loop"]["step"] == at
    if point == "mid-checkpoint":  # the half-written checkpoint is not the one resumed from
        assert saved["extra"]["loop"]["step"] == at - 2
    resumed = subprocess.run(
        [sys.executable, "-m", "rlmap.cli", "train", "--resume", str(run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr  # a trajectory taken twice stops the run

    records = _records(run)
    assert [r["step"] for r in records] == list(range(9))
    resumed_from = saved["extra"]["loop"]["step"]
    for r in records[resumed_from + 1 :]:  # a full batch in every step after the resume
        assert r["sampling/kept"] == BATCH, r["step"]
        assert r["system/empty_step"] == 0
    # and the workers did not run ahead (admission counters not restored: most of each
    # take stale); a round overtaken by later ones can still be stale once in a while
    assert sum(r["system/stale_dropped"] for r in records[resumed_from + 1 :]) <= BATCH
    t = json.loads((run / "summary.json").read_text())["trajectories"]
    taken = sum(r["sampling/generated"] for r in records[1:])
    assert t["consumed"] + t["stale_dropped"] + t["rejected"] == taken  # over the whole run
    assert t["finished"] == taken + t["queued_at_end"]  # nothing lost, nothing twice
    assert t["restarted"] == sum(n for _, n in snapshot["redo"]) * 4  # counted, by name
    ledger = json.loads((run / "ledger.json").read_text())
    assert ledger["rollouts"] == taken and ledger["restarted_rollouts"] == t["restarted"]
    steps = [r.get("optim/policy_steps", 0) for r in records[1:]]  # step 1: critic warm-up
    assert ledger["learner_steps"] == sum(steps) and all(n >= 1 for n in steps[1:])


def _scored(group: int, version: int = 0) -> Scored:
    c = Completion(
        prompt_ids=(1, 5, 6),
        response_ids=(7, 2),
        logprobs=(-0.5, -0.25),
        stopped=True,
        version=version,
    )
    return Scored(single_turn(c), group, 1.0, 0.5, RewardStatus.OK, per_turn=(0.5,))


def _parts(toy: Toy, model_dir: Path) -> Parts:
    cfg = build_config(
        "sao",
        None,
        [*_args(toy, model_dir), "sampling.prompts_per_step=1", "sampling.group_size=2"],
    )
    return build(cfg, model_dir)


def test_a_snapshot_brings_back_the_queue_the_rounds_in_flight_and_the_counters(
    tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = _parts(toy, tiny_calc_model_dir)
    with async_loop.async_runner(parts, LoopState(step=3, cursor=7), workers_of=lambda r: []) as a:
        a.queue.put(snapshots.Finished(_scored(5, version=2), 0.25, 1))
        a.in_flight[6] = 1  # a round of prompt 6 is being rolled out
        a.cursor, a.admission.started, a.admission.dropped = 7, 14, 2
        a.counts.finished, a.consumed, a.taken = 9, 6, {5: 0b01}
        snapshot = a.snapshot()
    # the round in flight is redone: its 1 prompt × 2 samples are admitted anew
    assert snapshot["redo"] == [[6, 1]] and snapshot["started"] == 14 - 2
    buffer = io.BytesIO()  # a checkpoint loads with weights_only=True: plain values only
    torch.save(snapshot, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)

    rolled: list[tuple[int, int]] = []

    class Recorder:
        def roll(self, cursor: int, n: int, seed: int) -> list[Scored]:
            rolled.append((cursor, n))
            return [_scored(cursor + i, version=3) for i in range(n) for _ in range(2)]

    monkeypatch.setattr(async_loop, "learn", lambda p, batch, state: {"optim/policy_steps": 1.0})
    with async_loop.async_runner(
        parts, LoopState(step=3, cursor=7), workers_of=lambda r: [Recorder()], restored=loaded
    ) as b:
        (first,) = b._take(1)[0]
        assert first.uid == (5, 1) and first.scored == _scored(5, version=2)  # as it was queued
        assert first.duration_s == 0.25
        b._take(2)  # the redone round: 14 − 2 = 12 = (3 + 2 + 1)·2 admitted, no room for more
        assert rolled == [(6, 1)]
        b.admission.advance(4, 0)  # the learner's next version: one round more
        b._take(2)
    assert rolled[0] == (6, 1)  # the round that was in flight, before any new prompt
    assert rolled[1] == (7, 1)  # then the cursor goes on where it was
    assert b.counts.finished >= 9 + 2 and b.consumed == 6 and b.restarted == 2


def test_a_trajectory_taken_twice_stops_the_run(tiny_calc_model_dir: Path, toy: Toy) -> None:
    parts = _parts(toy, tiny_calc_model_dir)
    with async_loop.async_runner(parts, LoopState(), workers_of=lambda r: []) as runner:
        runner.queue.put(snapshots.Finished(_scored(0), 0.0, 0))
        runner._take(1)
        runner.queue.put(snapshots.Finished(_scored(0), 0.0, 0))  # the same id again
        with pytest.raises(RuntimeError, match=r"trajectory \(0, 0\) was taken twice"):
            runner._take(1)


def test_a_step_whose_take_was_all_stale_takes_again(
    tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a step that took only stale trajectories trained on nothing and still counted.
    parts = _parts(toy, tiny_calc_model_dir)  # B = 2, η = 2
    seen: list[int] = []
    monkeypatch.setattr(async_loop, "learn", lambda p, batch, state: seen.append(batch.size) or {})
    with async_loop.async_runner(parts, LoopState(step=5), workers_of=lambda r: []) as runner:
        for k, version in enumerate((0, 1, 5, 5)):  # lags 5, 4 (stale), then 0, 0
            runner.queue.put(snapshots.Finished(_scored(k // 2, version), 0.0, k % 2))
        _, metrics = runner.step(LoopState(step=5))
    assert seen == [2] and metrics["system/stale_dropped"] == 2
    assert metrics["sampling/generated"] == 4 and metrics["system/empty_step"] == 0


def test_a_step_takes_one_more_for_each_stale_one_and_learns_from_a_full_batch(
    tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a take of 1 fresh + 1 stale learnt from 1. The admission bound (v + η + 1)·B
    # counts B consumed per version, so each short step left the workers one slot further
    # ahead for the rest of the run: more lag, more stale, shorter steps (CI saw 4 of 8).
    parts = _parts(toy, tiny_calc_model_dir)  # B = 2, η = 2
    seen: list[int] = []
    monkeypatch.setattr(async_loop, "learn", lambda p, batch, state: seen.append(batch.size) or {})
    with async_loop.async_runner(parts, LoopState(step=5), workers_of=lambda r: []) as runner:
        for k, version in enumerate((5, 0, 4)):  # lags 0, 5 (stale), then 1
            runner.queue.put(snapshots.Finished(_scored(k, version), 0.0, 0))
        _, metrics = runner.step(LoopState(step=5))
        left = runner.queue.qsize()
    assert seen == [2] and metrics["sampling/kept"] == 2 and left == 0
    assert metrics["system/stale_dropped"] == 1 and metrics["sampling/generated"] == 3


def test_a_step_with_every_reward_failed_is_an_empty_step(
    tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = _parts(toy, tiny_calc_model_dir)
    monkeypatch.setattr(async_loop, "learn", lambda *a: pytest.fail("nothing to learn from"))
    failed = Scored(_scored(0).episode, 0, 0.0, 0.0, RewardStatus.INFRA_ERROR)
    with async_loop.async_runner(parts, LoopState(), workers_of=lambda r: []) as runner:
        for k in range(2):
            runner.queue.put(snapshots.Finished(failed, 0.0, k))
        state, metrics = runner.step(LoopState())
    assert metrics["system/empty_step"] == 1 and state.step == 1 and runner.empty_steps == 1


# --- repeatable on demand ---------------------------------------------------------------


def _timeless(run: Path) -> list[dict[str, Any]]:
    """Metrics without timings: every ``system/*`` and every ``budget/*_s``."""
    timing = lambda k: k.startswith("system/") or (k.startswith("budget/") and k.endswith("_s"))  # noqa: E731
    return [{k: v for k, v in r.items() if not timing(k)} for r in _records(run)]


def test_deterministic_runs_repeat_exactly_and_so_does_a_resume_after_kill_9(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    args = [
        *_args(toy, tiny_calc_model_dir),
        "system.partial_rollout=false",
        "system.deterministic=true",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "rlmap.cli", "train", "--recipe", "sao"]
    for name in ("one", "two"):
        subprocess.run(
            [*cli, "--out", str(tmp_path / name), *args],
            check=True,
            capture_output=True,
            env=env,
            timeout=300,
        )
    one = _timeless(tmp_path / "one")
    assert len(one) == 9 and one == _timeless(tmp_path / "two")
    lengths = {r["length/mean"] for r in one[1:]}
    assert len(lengths) > 1  # the steps differ from each other: something was compared
    killed = subprocess.run(
        [
            sys.executable,
            str(KILLER),
            "mid-step",
            "5",
            "--",
            "--recipe",
            "sao",
            "--out",
            str(tmp_path / "killed"),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    subprocess.run(
        [sys.executable, "-m", "rlmap.cli", "train", "--resume", str(tmp_path / "killed")],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert _timeless(tmp_path / "killed") == one


def test_round_seeds_differ_by_seed_worker_and_round() -> None:
    seeds = {round_seeds.round_seed(s, w, r) for s in range(3) for w in range(3) for r in range(50)}
    assert len(seeds) == 3 * 3 * 50 and all(0 <= x < 2**63 for x in seeds)
    assert round_seeds.round_seed(0, 1, 2) == round_seeds.round_seed(0, 1, 2)


def test_a_seeded_round_leaves_the_learners_generators_as_they_were() -> None:
    import random

    import numpy as np

    def draws() -> tuple[torch.Tensor, float, float]:
        return torch.rand(3), random.random(), float(np.random.rand())

    def seed_all() -> None:
        torch.manual_seed(7)
        random.seed(7)
        np.random.seed(7)

    seed_all()
    expected = draws()
    seed_all()
    with round_seeds.seeded(123):
        inside = draws()
    with round_seeds.seeded(123):
        again = draws()  # the same seed, the same draws
    assert torch.equal(again[0], inside[0]) and again[1:] == inside[1:]
    after = draws()  # and the learner's generators go on as if no round had run
    assert torch.equal(after[0], expected[0]) and after[1:] == expected[1:]


def test_a_deterministic_rounds_samples_depend_on_its_seed_not_the_learners_draws(
    tiny_calc_model_dir: Path, toy: Toy
) -> None:
    cfg = build_config(
        "sao",
        None,
        [
            *_args(toy, tiny_calc_model_dir),
            "system.partial_rollout=false",
            "system.deterministic=true",
            "generation.temperature=1.5",
        ],
    )
    parts = build(cfg, tiny_calc_model_dir)
    queues = []
    for learner_seed in (1, 2):  # whatever the learner drew before, the rounds are the same
        torch.manual_seed(learner_seed)
        with async_loop.async_runner(parts, LoopState()) as runner:
            runner._produce()
            queues.append([(f.uid, f.scored.episode.response_ids) for f in runner.queue.queue])
    assert queues[0] == queues[1] and len(queues[0]) == (2 + 1) * BATCH  # (v + η + 1)·B
    assert len({ids for _, ids in queues[0]}) > 1


def test_each_worker_round_gets_its_own_seed_of_seed_worker_and_round(
    tiny_calc_model_dir: Path, toy: Toy
) -> None:
    parts = _parts(toy, tiny_calc_model_dir)  # B = 2: 1 prompt × 2 samples per round
    seen: list[tuple[int, int, int]] = []  # (worker, cursor, seed)

    class Spy:
        def __init__(self, k: int) -> None:
            self.k = k

        def roll(self, cursor: int, n: int, seed: int) -> list[Scored]:
            seen.append((self.k, cursor, seed))
            return [_scored(cursor) for _ in range(2)]

    with async_loop.async_runner(parts, LoopState(), workers_of=lambda r: [Spy(0), Spy(1)]) as a:
        a._take(6)  # three rounds
    rounds = {cursor: (k, seed) for k, cursor, seed in seen}  # round r rolls prompt r here
    for r in range(3):
        k, seed = rounds[r]
        assert seed == round_seeds.round_seed(parts.cfg.seed, k, r)
    assert len({seed for _, _, seed in seen}) == len(seen)


# --- what a review found -------------------------------------------------------------------


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, failing (not hanging) when it takes longer than ``seconds``."""
    import threading

    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"still waiting after {seconds} s"
    return out[0]


class _Fresh:
    """A worker whose every round samples 2 trajectories of its prompt on the board's
    weights; ``fail`` rounds raise first."""

    def __init__(self, runner: async_loop.AsyncRunner, fail: int = 0) -> None:
        self.runner, self.fail = runner, fail

    def roll(self, cursor: int, n: int, seed: int) -> list[Scored]:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("tool server down")
        version = self.runner.board.version
        return [_scored(cursor + i, version) for i in range(n) for _ in range(2)]


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_take_that_fills_the_bound_with_stale_work_frees_it_and_takes_fresh(
    deterministic: bool, tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # η = 0, B = 2: at version 2 the bound admits (2 + 0 + 1)·2 = 6, and 6 are started; the
    # queue holds 2 stale ones. Before, the stale slots came free only after the step, so
    # the take-again waited for ever for rounds no worker could start.
    parts = _parts(toy, tiny_calc_model_dir)
    cfg = parts.cfg.model_copy(
        update={
            "behaviour": dataclasses.replace(parts.cfg.behaviour, max_staleness=0),
            "system": dataclasses.replace(
                parts.cfg.system, deterministic=deterministic, partial_rollout=False
            ),
        }
    )
    parts = dataclasses.replace(parts, cfg=cfg)
    monkeypatch.setattr(async_loop, "learn", lambda p, batch, state: {})
    state = LoopState(step=2, cursor=3)
    with async_loop.async_runner(parts, state, workers_of=lambda r: []) as before:
        before.admission.started = 6  # the bound is full before any worker starts
        for k in range(2):
            before.queue.put(snapshots.Finished(_scored(0, version=1), 0.0, k))
        full = before.snapshot()
    with async_loop.async_runner(
        parts, state, workers_of=lambda r: [_Fresh(r)], restored=full
    ) as runner:
        _, metrics = _within(30, lambda: runner.step(state))
    assert metrics["system/stale_dropped"] == 2 and metrics["sampling/kept"] == 2


def test_an_aborted_round_frees_its_slots(
    tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = _parts(toy, tiny_calc_model_dir)
    cfg = parts.cfg.model_copy(
        update={
            "behaviour": dataclasses.replace(parts.cfg.behaviour, max_staleness=0),
            "system": dataclasses.replace(parts.cfg.system, partial_rollout=False, workers=1),
        }
    )
    parts = dataclasses.replace(parts, cfg=cfg)
    monkeypatch.setattr(async_loop, "learn", lambda p, batch, state: {})
    with async_loop.async_runner(
        parts, LoopState(), workers_of=lambda r: [_Fresh(r, fail=1)]
    ) as runner:
        _, metrics = _within(30, lambda: runner.step(LoopState()))  # (0 + 0 + 1)·2 admitted
        snapshot = runner.snapshot()
    assert metrics["sampling/kept"] == 2
    assert snapshot["aborted_rounds"] == 1 and snapshot["dropped"] == 2


def test_rounds_still_to_redo_are_not_subtracted_or_counted_twice(
    tiny_calc_model_dir: Path, toy: Toy
) -> None:
    parts = _parts(toy, tiny_calc_model_dir)
    with async_loop.async_runner(parts, LoopState(step=3, cursor=7), workers_of=lambda r: []) as a:
        a.in_flight[6] = 1
        a.admission.started = 14
        first = a.snapshot()
    assert first["started"] == 12 and first["lost"] == 2
    with async_loop.async_runner(
        parts, LoopState(step=3, cursor=7), workers_of=lambda r: [], restored=first
    ) as b:
        second = b.snapshot()  # checkpointed again before the redo round restarted
        assert b.restarted == 2
    assert second["started"] == 12 and second["redo"] == [[6, 1]] and second["lost"] == 0
    with async_loop.async_runner(
        parts, LoopState(step=3, cursor=7), workers_of=lambda r: [], restored=second
    ) as c:
        assert c.restarted == 2 and c.admission.started == 12


def test_a_restored_runner_remembers_what_was_taken(tiny_calc_model_dir: Path, toy: Toy) -> None:
    parts = _parts(toy, tiny_calc_model_dir)
    with async_loop.async_runner(parts, LoopState(), workers_of=lambda r: []) as a:
        a.queue.put(snapshots.Finished(_scored(5), 0.0, 0))
        a._take(1)  # (5, 0) taken before the checkpoint
        snapshot = a.snapshot()
    with async_loop.async_runner(
        parts, LoopState(), workers_of=lambda r: [], restored=snapshot
    ) as b:
        b.queue.put(snapshots.Finished(_scored(5), 0.0, 0))
        with pytest.raises(RuntimeError, match=r"\(5, 0\) was taken twice"):
            b._take(1)


def test_deterministic_mode_fills_to_the_bound_before_every_take(
    tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B = 2, η = 2: at version v the bound admits (v + 3)·2 trajectories. Before step 2 the
    # learner has taken 2 of the first 6, so the queue holds 4 + the 2 version 1 admits;
    # producing only when the queue ran dry would leave 4.
    parts = _parts(toy, tiny_calc_model_dir)
    cfg = parts.cfg.model_copy(
        update={
            "system": dataclasses.replace(
                parts.cfg.system, deterministic=True, partial_rollout=False
            )
        }
    )
    parts = dataclasses.replace(parts, cfg=cfg)
    monkeypatch.setattr(async_loop, "learn", lambda p, batch, state: {})
    with async_loop.async_runner(parts, LoopState(), workers_of=lambda r: [_Fresh(r)]) as runner:
        state, _ = runner.step(LoopState())
        assert runner.queue.qsize() == 4
        runner.step(state)
        assert runner.rounds == 4  # (1 + 3)·2 / 2 per round


# --- issue 27: an asynchronous checkpoint missing a field is damaged -------------------------


@pytest.fixture(scope="module")
def async_run(tiny_calc_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An asynchronous run of 2 steps, checkpoints at 1 and 2 (built once, copied by tests)."""
    from conftest import _toy_overrides

    run = tmp_path_factory.mktemp("async") / "run"
    args = [
        *_args(_toy_overrides, tiny_calc_model_dir),
        "optim.steps=2",
        "run.checkpoint_every=1",
        "run.eval_every=2",
    ]
    assert main(["train", "--recipe", "sao", "--out", str(run), *args]) == 0
    return run


def test_an_asynchronous_checkpoint_missing_any_field_is_damaged_and_refusing_changes_nothing(
    async_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(async_run, run)
    state = load_trainer_state(run / "checkpoints" / "step_2")
    assert set(state["extra"]["async"]) == set(snapshots.SNAPSHOT_SHAPE)  # no field forgotten
    assert state["extra"]["async"]["queue"]  # the case of the issue: work was queued
    paths = saved_fields(state)
    for must in [
        ("extra", "async", "queue"),
        ("extra", "async", "lost"),
        ("optimizers", "critic", "param_groups"),
        ("schedulers", "critic", "last_epoch"),
    ]:
        assert must in paths  # the walk reached the queue and the critic's optimiser
    assert_each_field_is_required(run, paths + CONFIG_FIELDS, capsys)


def _no_action(snapshot: dict[str, Any]) -> None:
    del snapshot["queue"][0]["scored"]["episode"]["action"]


def _half_a_round(snapshot: dict[str, Any]) -> None:
    snapshot["redo"] = [[3]]  # a round's first prompt, without its count


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (_no_action, "extra.async.queue[0]: not a finished trajectory (TypeError: "),
        (_half_a_round, "extra.async.redo[0]: expected a pair of ints, got [3]"),
    ],
)
def test_an_asynchronous_checkpoint_whose_queue_does_not_load_back_is_damaged(
    damage: Callable[[dict[str, Any]], None],
    named: str,
    async_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    shutil.copytree(async_run, run)
    for ckpt in list_checkpoints(run):
        state = load_trainer_state(ckpt)
        damage(state["extra"]["async"])
        torch.save(state, ckpt / "trainer_state.pt")
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"step_2/trainer_state.pt: {named}" in err
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


def test_an_asynchronous_run_whose_newest_checkpoint_lacks_its_queue_resumes_from_the_one_before(
    async_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: internal error (KeyError: 'queue'), after metrics.jsonl had lost step 2, its
    # samples had been deleted and resumes.jsonl told of a resume that did not happen.
    run = tmp_path / "run"
    shutil.copytree(async_run, run)
    newest = run / "checkpoints" / "step_2" / "trainer_state.pt"
    torch.save(without(load_trainer_state(newest.parent), ["extra", "async", "queue"]), newest)
    assert main(["train", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"{newest}: extra.async.queue: missing; skipped (kept as damaged-step_2-" in err
    assert [r["step"] for r in _records(run)] == [0, 1, 2]  # step 2 redone from step 1
    assert load_trainer_state(newest.parent)["extra"]["async"]["queue"] is not None  # rewritten
    (record,) = [v for _, v in read_jsonl(run / "resumes.jsonl")]
    assert record["from"] == "step_1"
