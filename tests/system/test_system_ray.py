"""The asynchronous loop on Ray: actors as rollout workers, on a local cluster the run
starts itself (loopback, bounded CPUs) and stops."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlmap.experiments.train import run_training
from rlmap.recipes import build_config

ray = pytest.importorskip("ray")

Toy = Callable[..., list[str]]


def _sao(toy: Toy, model_dir: Path) -> list[str]:
    return [
        *toy(model_dir, steps=3),
        "data.task=calculator",
        "data.max_turns=2",
        "generation.max_new_tokens=6",
        "critic.warmup_steps=1",
        "system.backend=ray",
        "system.workers=2",
    ]


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_sao_runs_with_ray_actors_as_workers_and_a_killed_actor_costs_one_round(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlmap.system import ray_workers

    real = ray_workers.RayWorker.roll
    calls = {"n": 0}

    def roll(self: Any, cursor: int, n: int, seed: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # kill this actor while it is wanted: the round is lost
            ray.kill(self.actor)
        return real(self, cursor, n, seed)

    monkeypatch.setattr(ray_workers.RayWorker, "roll", roll)
    summary = run_training(
        build_config("sao", None, _sao(toy, tiny_calc_model_dir)), tmp_path / "run"
    )
    steps = _records(tmp_path / "run")[1:]
    assert [r["step"] for r in steps] == [1, 2, 3]
    t = summary["trajectories"]
    assert t["aborted_rounds"] == 1  # the killed actor's round, counted, not lost silently
    pulled = sum(r["sampling/generated"] for r in steps)
    assert t["finished"] == pulled + t["queued_at_end"]
    assert t["consumed"] + t["stale_dropped"] + t["rejected"] == pulled
    assert not ray.is_initialized()  # the run stopped the cluster it started


def test_partial_rollout_on_ray_keeps_the_staleness_bound(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlmap.system import async_loop

    seen: list[tuple[Any, int]] = []
    real = async_loop.learn

    def spy(p: Any, batch: Any, state: Any) -> dict[str, float]:
        seen.append((batch, state.step))
        return real(p, batch, state)

    monkeypatch.setattr(async_loop, "learn", spy)
    overrides = [
        *_sao(toy, tiny_calc_model_dir),
        "system.partial_rollout=true",
        "behaviour.max_staleness=1",
    ]
    run_training(build_config("sao", None, overrides), tmp_path / "run")
    assert seen
    for batch, version in seen:
        oldest = batch.policy_version.masked_fill(~batch.action_mask, 10**9).amin(-1)
        assert int((version - oldest).max()) <= 1
        assert int(batch.policy_version[batch.action_mask].max()) <= version


def test_an_actor_killed_mid_episode_under_partial_rollout_costs_its_round_once(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every environment step waits 1 s, so a round (2 turns) takes over 2 s; the actor is
    # killed 0.5 s into its third round: it has sampled the first turn of every episode and
    # is waiting for the tool — it holds partially rolled-out trajectories.
    import threading

    from rlmap.system import ray_workers

    real = ray_workers.RayWorker.roll
    calls = {"n": 0}
    lock = threading.Lock()

    def roll(self: Any, cursor: int, n: int, seed: int) -> Any:
        with lock:
            calls["n"] += 1
            doomed = calls["n"] == 3
        if doomed:
            threading.Timer(0.5, lambda: ray.kill(self.actor)).start()
        return real(self, cursor, n, seed)

    monkeypatch.setattr(ray_workers.RayWorker, "roll", roll)
    overrides = [
        *_sao(toy, tiny_calc_model_dir),
        "system.partial_rollout=true",
        "data.env_latency=fixed:1.0",
        "optim.steps=4",
    ]
    summary = run_training(build_config("sao", None, overrides), tmp_path / "run")
    steps = _records(tmp_path / "run")[1:]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]  # the run went on
    t = summary["trajectories"]
    assert t["aborted_rounds"] == 1 and t["aborted"] == 4  # recorded as aborted: 1 prompt × 4
    pulled = sum(r["sampling/generated"] for r in steps)  # none taken twice (the runner checks)
    assert t["finished"] == pulled + t["queued_at_end"]
    assert t["consumed"] + t["stale_dropped"] + t["rejected"] == pulled
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["aborted_rollouts"] == 4 and ledger["rollouts"] == pulled


def test_deterministic_runs_on_ray_actors_repeat_exactly(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    def timeless(run: Path) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if not k.startswith("system/") and not k.endswith("_s")}
            for r in _records(run)
        ]

    overrides = [
        *_sao(toy, tiny_calc_model_dir),
        "system.deterministic=true",
        "generation.temperature=1.5",
    ]
    for name in ("one", "two"):
        run_training(build_config("sao", None, overrides), tmp_path / name)
    one = timeless(tmp_path / "one")
    assert len(one) == 4 and one == timeless(tmp_path / "two")
    assert len({r["length/mean"] for r in one[1:]}) > 1  # the steps differ: a real comparison
