"""Rollout workers as Ray actors (``system.backend=ray``), for the asynchronous loop.

The loop is the same (:mod:`rlmap.system.async_loop`); only where a round of rollouts
runs changes. Each actor builds the run's rollout side from the config and the start
checkpoint (policy weights, tokenizer, environments, rewards — no critic, no optimiser
state worth the name), and per round loads the newest published weights from Ray's
object store (one ``ray.put`` per publication, shared by every actor), rolls out its
prompts and returns the scored trajectories.

An actor that dies (killed, out of memory, a crash) costs the round it was running:
the round is counted as aborted, never silently lost or returned twice, and a fresh
actor takes its place. Ray is started here when no cluster is running — local, on the
loopback address, with ``system.workers`` + 1 CPUs — and shut down when the run ends.

Partial rollout (new weights between turns) needs a call back into the driver from
inside an episode; with Ray it is refused for now.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig
from rlmap.system.async_loop import AsyncRunner, Worker
from rlmap.system.rollout import Scored


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "system.backend: 'ray' needs Ray installed (pip install 'rlmap[ray]')"
        ) from None
    return ray


def rollout_config(cfg: RecipeConfig) -> RecipeConfig:
    """The run's config as a rollout actor needs it: no critic, no reference model."""
    return cfg.model_copy(update={"critic": replace(cfg.critic, enabled=False),
                                  "kl": replace(cfg.kl, placement="none")})  # fmt: skip


class RolloutActor:
    """The body of a Ray actor: the rollout side of a run, and one method per round."""

    def __init__(self, cfg: RecipeConfig, start: str, reward_path: str | None) -> None:
        from rlmap.system import setup

        torch.set_num_threads(1)  # one core per actor; the learner keeps the rest
        reward = None if reward_path is None else Path(reward_path)
        self.p = setup.build(rollout_config(cfg), Path(start), reward_path=reward)

    def rollout(self, cursor: int, n: int, version: int, state: dict[str, Any]) -> list[Scored]:
        from rlmap.system.sync import next_prompts, rollout_round

        p = self.p
        if version != p.engine.version:
            with torch.no_grad():
                p.policy.load_state_dict(state)
            p.engine.update_weights(p.policy, version)
        return rollout_round(p, next_prompts(p.train, cursor, n, p.cfg.seed), cursor)


class RayWorker:
    """A worker of the asynchronous loop backed by a Ray actor (restarted when it dies)."""

    def __init__(self, runner: AsyncRunner, start: Path, reward_path: Path | None, shared: Any):
        self.ray, self.runner, self.shared = _ray(), runner, shared
        self.args = (runner.p.cfg, str(start), None if reward_path is None else str(reward_path))
        self.restarts = 0
        self.actor = self._start()

    def _start(self) -> Any:
        actor_class = self.ray.remote(num_cpus=1)(RolloutActor)
        return actor_class.remote(*self.args)

    def roll(self, cursor: int, n: int) -> list[Scored]:
        version, ref = self.shared.latest()
        try:
            result: list[Scored] = self.ray.get(self.actor.rollout.remote(cursor, n, version, ref))
        except self.ray.exceptions.RayActorError:  # the actor died: a fresh one, round lost
            self.restarts += 1
            self.actor = self._start()
            raise
        return result

    def close(self) -> None:
        self.ray.kill(self.actor)


class SharedWeights:
    """The newest published weights as one object in Ray's store (put once per version)."""

    def __init__(self, runner: AsyncRunner) -> None:
        self.ray, self.board = _ray(), runner.board
        self.lock = threading.Lock()
        self.version, self.ref = -1, None

    def latest(self) -> tuple[int, Any]:
        version, state = self.board.latest()
        with self.lock:
            if version != self.version:
                self.version, self.ref = version, self.ray.put(state)
            return self.version, self.ref


class RayPool:
    """``workers_of`` for :func:`rlmap.system.async_loop.async_runner`: Ray actors; starts a
    local Ray when none runs and :meth:`shutdown` stops only what it started."""

    def __init__(self, start: Path, reward_path: Path | None) -> None:
        self.start, self.reward_path, self.started = start, reward_path, False

    def __call__(self, runner: AsyncRunner) -> list[Worker]:
        ray = _ray()
        if runner.p.cfg.system.partial_rollout:
            raise ConfigError("system.partial_rollout: not available with system.backend=ray yet")
        if not ray.is_initialized():
            ray.init(num_cpus=runner.p.cfg.system.workers + 1, include_dashboard=False,
                     log_to_driver=False, _node_ip_address="127.0.0.1")  # fmt: skip
            self.started = True
        shared = SharedWeights(runner)
        return [RayWorker(runner, self.start, self.reward_path, shared)
                for _ in range(runner.p.cfg.system.workers)]  # fmt: skip

    def shutdown(self) -> None:
        if self.started:
            _ray().shutdown()
            self.started = False
