"""The asynchronous loop: versions, the staleness bound, the balance of trajectories."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlmap.core.batch import Batch
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.system import admission, async_loop, snapshots

Toy = Callable[..., list[str]]


def _calc(toy: Toy, model_dir: Path, steps: int = 4) -> list[str]:
    return [
        *toy(model_dir, steps=steps),
        "data.task=calculator",
        "data.max_turns=2",
        "generation.max_new_tokens=6",
        "critic.warmup_steps=1",
    ]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Batch, int]]:
    seen: list[tuple[Batch, int]] = []
    real = async_loop.learn

    def spy(p: Any, batch: Batch, state: Any) -> dict[str, float]:
        seen.append((batch, state.step))
        return real(p, batch, state)

    monkeypatch.setattr(async_loop, "learn", spy)
    return seen


@pytest.mark.parametrize("partial", [False, True])
def test_sao_trains_on_the_tool_task_asynchronously(
    tiny_calc_model_dir: Path,
    tmp_path: Path,
    toy: Toy,
    monkeypatch: pytest.MonkeyPatch,
    partial: bool,
) -> None:
    seen = _spy(monkeypatch)
    overrides = [
        *_calc(toy, tiny_calc_model_dir),
        "behaviour.max_staleness=1",
        f"system.partial_rollout={str(partial).lower()}",
    ]
    run_training(build_config("sao", None, overrides), tmp_path / "run")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = records[1:]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for key in (
        "system/checkpoint_age_mean",
        "system/accepted_token_frac",
        "system/queue_length",
        "system/rollout_duration_p95",
        "system/learner_utilisation",
        "system/learner_wait_s",
        "system/tokens_per_s",
    ):
        assert all(key in r for r in steps), key
    # the same split of the step as the synchronous loop's; no rollout_s (rollouts overlap)
    for r in steps:
        assert "system/rollout_s" not in r
        total = r["system/learner_wait_s"] + r["system/update_s"]
        assert r["system/learner_utilisation"] == pytest.approx(r["system/update_s"] / total)
    # no consumed trajectory is older than η = 1 version
    assert seen
    for batch, version in seen:
        assert batch.policy_version is not None
        oldest = batch.policy_version.masked_fill(~batch.action_mask, 10**9).amin(-1)
        assert int((version - oldest).max()) <= 1
        assert int(batch.policy_version[batch.action_mask].max()) <= version  # none from the future


def test_admission_keeps_in_flight_work_within_the_staleness_bound() -> None:
    import threading

    stop = threading.Event()
    gate = admission.Admission(batch=4, eta=1)
    claims: list[int] = []

    def claim() -> int:  # runs under the admission's lock, once per admitted prompt
        claims.append(gate.started)
        return len(claims)

    # (v + η + 1)·B = (0 + 1 + 1)·4 = 8 trajectories may start before the learner moves
    assert [gate.admit(2, stop, claim) for _ in range(4)] == [1, 2, 3, 4] and gate.started == 8
    assert claims == [2, 4, 6, 8]  # each claim sees its own admission counted
    stop.set()
    assert gate.admit(2, stop, claim) is None  # a 5th would exceed the bound: waits, then stops
    stop.clear()
    gate.advance(version=1, dropped=0)  # the learner took a step: 4 more slots
    assert gate.admit(2, stop, claim) and gate.admit(2, stop, claim) and gate.started == 12
    gate.advance(version=1, dropped=2)  # dropped trajectories free their slots
    assert gate.admit(2, stop, claim) and gate.started == 14
    assert len(claims) == 7  # the refused one claimed nothing


def test_the_trajectory_balance_holds_exactly_and_a_failing_round_costs_only_itself(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = async_loop.rollout_round
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # a worker's engine or environment blows up once
            raise RuntimeError("tool server down")
        return real(*args, **kwargs)

    monkeypatch.setattr(async_loop, "rollout_round", flaky)
    summary = run_training(
        build_config("sao", None, _calc(toy, tiny_calc_model_dir)), tmp_path / "run"
    )
    t = summary["trajectories"]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    pulled = sum(r["sampling/generated"] for r in records[1:])
    assert t["consumed"] + t["stale_dropped"] + t["rejected"] == pulled  # what the learner took
    assert t["finished"] == pulled + t["queued_at_end"]  # nothing lost, nothing twice
    assert t["aborted_rounds"] == 1 and t["aborted"] >= 1
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["rollouts"] + ledger["queued_at_end"] == t["finished"]  # the ledger balances
    assert ledger["rollouts"] == (
        ledger["filtered_rollouts"] + ledger["rejected_rollouts"] + t["consumed"]
    )
    assert ledger["aborted_rollouts"] == t["aborted"]


def test_a_broken_policy_in_a_worker_stops_the_run_instead_of_aborting_rounds_for_ever(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlmap.core.errors import TrainingError

    def broken(*args: Any, **kwargs: Any) -> Any:  # what the engine raises on NaN scores
        raise TrainingError("rollout: the policy's scores are NaN or infinite")

    monkeypatch.setattr(async_loop, "rollout_round", broken)
    cfg = build_config("sao", None, _calc(toy, tiny_calc_model_dir))
    with pytest.raises(TrainingError, match=r"^step 1: rollout: the policy's scores"):
        run_training(cfg, tmp_path / "run")  # before: every round aborted, the learner waited


def test_a_worker_that_fails_every_round_stops_the_run_in_one_line(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlmap.core.errors import TrainingError

    calls = {"n": 0}

    def down(*args: Any, **kwargs: Any) -> Any:  # e.g. an engine refusing every call
        calls["n"] += 1
        raise ValueError("temperature must be in [0, 2]")

    monkeypatch.setattr(async_loop, "rollout_round", down)
    cfg = build_config("sao", None, _calc(toy, tiny_calc_model_dir))
    with pytest.raises(TrainingError, match=r"rounds in a row failed .* ValueError: temperature"):
        run_training(cfg, tmp_path / "run")  # before: aborted rounds for ever, the learner waited
    assert calls["n"] >= async_loop.FAILED_IN_A_ROW


def _scored(version: int, group: int) -> Any:
    from rlmap.core.batch import RewardStatus
    from rlmap.engines.engine import Completion
    from rlmap.rollout.episodes import single_turn
    from rlmap.rollout.packing import Scored

    c = Completion(
        prompt_ids=(1, 5, 6),
        response_ids=(7, 2),
        logprobs=(-0.5, -0.25),
        stopped=True,
        version=version,
    )
    return Scored(single_turn(c), group, 1.0, 1.0, RewardStatus.OK)


def test_the_learner_drops_what_is_older_than_eta_when_it_consumes(
    tiny_calc_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admission control keeps stale work rare, so deleting the consumption filter left every
    # other test green; here the queue holds two trajectories older than η on purpose.
    from rlmap.assembly.parts import build
    from rlmap.system.loop_state import LoopState

    cfg = build_config(
        "sao",
        None,
        [
            *_calc(toy, tiny_calc_model_dir),
            "behaviour.max_staleness=1",
            "sampling.prompts_per_step=1",
            "sampling.group_size=4",
        ],
    )
    parts = build(cfg, tiny_calc_model_dir)
    seen: list[Batch] = []
    monkeypatch.setattr(async_loop, "learn", lambda p, batch, state: seen.append(batch) or {})
    with async_loop.async_runner(parts, LoopState(step=3), workers_of=lambda r: []) as runner:
        # lags 3, 0, 2, 1 at version 3 (η = 1: two stale), then two more taken for them
        for k, version in enumerate((0, 3, 1, 2, 3, 2)):
            runner.queue.put(snapshots.Finished(_scored(version, k // 4), 0.0, k % 4))
        _, metrics = runner.step(LoopState(step=3))
    assert metrics["system/stale_dropped"] == 2 and metrics["sampling/generated"] == 6
    assert len(seen) == 1 and seen[0].size == 4
    kept = seen[0].policy_version
    assert kept is not None and sorted(int(v) for v in kept[seen[0].action_mask].unique()) == [2, 3]


class _Board:
    """A board that publishes a newer version every time it is read."""

    def __init__(self) -> None:
        self.version = 0

    def latest(self) -> tuple[int, dict[str, Any]]:
        self.version += 1
        return self.version, {}


class _Engine:
    def __init__(self) -> None:
        self.version, self.loaded = 0, []

    def set_weights(self, state: dict[str, Any], version: int) -> None:
        self.version = version
        self.loaded.append(version)

    def reseed(self, seed: int | None) -> None:
        self.seed = seed


@pytest.mark.parametrize("partial", [True, False])
def test_a_partial_rollout_worker_takes_new_weights_between_turns(
    partial: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Switching partial rollout off inside the worker left every other test green.
    from types import SimpleNamespace

    from rlmap.tasks.arithmetic import Example

    def two_turns(p: Any, examples: Any, cursor: int, *, engine: Any, before_turn: Any) -> list:
        for _ in range(2):  # the runner calls before_turn before each turn of the round
            if before_turn is not None:
                before_turn()
        return []

    monkeypatch.setattr(async_loop, "rollout_round", two_turns)
    cfg = build_config("sao", None, [f"system.partial_rollout={str(partial).lower()}"])
    worker = object.__new__(async_loop.ThreadWorker)
    worker.p = SimpleNamespace(cfg=cfg, train=[Example("1+1=", "2")] * 4)  # type: ignore[assignment]
    worker.board, worker.engine = _Board(), _Engine()  # type: ignore[assignment]
    worker.roll(0, 1, seed=17)
    assert worker.engine.seed == 17  # type: ignore[attr-defined]  # the round's own generator
    loaded = worker.engine.loaded  # type: ignore[attr-defined]
    assert loaded == ([1, 2, 3] if partial else [1])  # the round's start, then each turn
