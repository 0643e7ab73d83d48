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

Partial rollout: a driver thread posts each new version to a small ``Newest`` actor;
between the turns of an episode an actor looks there and loads newer weights, so the
episode's later tokens carry the new version.
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

WATCH_S = 0.05
"""How often the driver looks for a newly published version (partial rollout)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "system.backend: 'ray' needs Ray installed (pip install 'rlmap[ray]')"
        ) from None
    return ray


def rollout_config(cfg: RecipeConfig) -> RecipeConfig:
    """The run's config as a rollout actor needs it: no critic, no reference model, no LoRA
    adapters (the published weights of a LoRA policy are merged: a plain model's)."""
    return cfg.model_copy(update={"critic": replace(cfg.critic, enabled=False),
                                  "kl": replace(cfg.kl, placement="none"),
                                  "model": replace(cfg.model, lora_rank=0)})  # fmt: skip


class RolloutActor:
    """The body of a Ray actor: the rollout side of a run, and one method per round."""

    def __init__(self, cfg: RecipeConfig, start: str, reward_path: str | None) -> None:
        from rlmap.system import setup

        torch.set_num_threads(1)  # one core per actor; the learner keeps the rest
        reward = None if reward_path is None else Path(reward_path)
        self.p = setup.build(rollout_config(cfg), Path(start), reward_path=reward)

    def rollout(
        self,
        cursor: int,
        n: int,
        version: int,
        state: dict[str, Any],
        newest: Any = None,
        seed: int | None = None,
    ) -> list[Scored]:
        """Prompts ``cursor .. cursor + n − 1`` on weights ``version``, sampling from a
        generator seeded with ``seed``; with ``newest`` (partial rollout: the driver's board
        of the newest weights) new weights between turns."""
        from rlmap.system.async_loop import seeded
        from rlmap.system.sync import next_prompts, rollout_round

        self._load(version, state)
        self.p.engine.reseed(seed)
        refresh = None if newest is None else (lambda: self._refresh(newest))
        examples = next_prompts(self.p.train, cursor, n, self.p.cfg.seed)
        if self.p.cfg.system.deterministic and seed is not None:  # the environments' draws too
            with seeded(seed):
                return rollout_round(self.p, examples, cursor, before_turn=refresh)
        return rollout_round(self.p, examples, cursor, before_turn=refresh)

    def _load(self, version: int, state: dict[str, Any]) -> None:
        p = self.p
        if version != p.engine.version:
            with torch.no_grad():
                p.policy.load_state_dict(state)
            p.engine.update_weights(p.policy, version)

    def _refresh(self, newest: Any) -> None:
        import ray

        version, box = ray.get(newest.get.remote())
        if box[0] is not None and version != self.p.engine.version:
            self._load(version, ray.get(box[0]))


class Newest:
    """The body of a tiny Ray actor: the newest weights' version and object (in a list, so
    Ray hands the reference over rather than the weights)."""

    def __init__(self) -> None:
        self.version, self.box = -1, [None]

    def set(self, version: int, box: list[Any]) -> None:
        self.version, self.box = version, box

    def get(self) -> tuple[int, list[Any]]:
        return self.version, self.box


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

    def roll(self, cursor: int, n: int, seed: int) -> list[Scored]:
        version, ref = self.shared.latest()
        call = self.actor.rollout.remote(cursor, n, version, ref, self.shared.newest, seed)
        try:
            result: list[Scored] = self.ray.get(call)
        except self.ray.exceptions.RayActorError:  # the actor died: a fresh one, round lost
            self.restarts += 1
            self.actor = self._start()
            raise
        return result

    def close(self) -> None:
        self.ray.kill(self.actor)


class SharedWeights:
    """The newest published weights as one object in Ray's store (put once per version).

    With partial rollout a driver thread also watches for new versions and posts each to
    a :class:`Newest` actor, where actors look between the turns of an episode."""

    def __init__(self, runner: AsyncRunner) -> None:
        self.ray, self.board = _ray(), runner.board
        self.lock = threading.Lock()
        self.version, self.ref = -1, None
        self.newest: Any = None
        self.stop = runner.stop
        if runner.p.cfg.system.partial_rollout:
            self.newest = self.ray.remote(num_cpus=0)(Newest).remote()
            threading.Thread(target=self._watch, name="weights-watch", daemon=True).start()

    def latest(self) -> tuple[int, Any]:
        version, state = self.board.latest()
        with self.lock:
            if version != self.version:
                self.version, self.ref = version, self.ray.put(state)
                if self.newest is not None:
                    self.newest.set.remote(version, [self.ref])
            return self.version, self.ref

    def _watch(self) -> None:
        while not self.stop.wait(WATCH_S):
            self.latest()


class RayPool:
    """``workers_of`` for :func:`rlmap.system.async_loop.async_runner`: Ray actors; starts a
    local Ray when none runs and :meth:`shutdown` stops only what it started."""

    def __init__(self, start: Path, reward_path: Path | None) -> None:
        self.start, self.reward_path, self.started = start, reward_path, False

    def __call__(self, runner: AsyncRunner) -> list[Worker]:
        ray = _ray()
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
