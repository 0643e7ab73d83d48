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

GPUs (``system.actor_gpus``, ``system.actor_placement``): an actor asks Ray for
``num_gpus`` and builds its engine on the GPU Ray hands it (``cuda:0`` in its process), or
on the CPU when it asks for none. ``separate``: the local Ray is started with the learner's
GPU hidden (``CUDA_VISIBLE_DEVICES``), so no actor lands on it; ``colocate``: Ray gets the
learner's GPU alone and the actors share it through one ``PACK`` placement group, as
OpenRLHF's hybrid engine does (``openrlhf/trainer/ray/vllm_engine.py``). The weights
travel as the board's host snapshot (``Board.host``: the rollout dtype, copied off the GPU
into pinned memory), put in the object store as it is. Not measured on a GPU.
"""

from __future__ import annotations

import os
import threading
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlmap.assembly.placement import (
    actor_device,
    actor_gpus,
    actor_options,
    bundles,
    colocated_options,
    cuda_visible,
    ray_gpus,
    visible_gpus,
)
from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.system_params import SystemParams
from rlmap.rollout.packing import Scored
from rlmap.system.async_loop import AsyncRunner, Worker

WATCH_S = 0.05
"""How often the driver looks for a newly published version (partial rollout)."""
PLACE_TIMEOUT_S = 120.0
"""How long the colocated actors' placement group may take to be reserved."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "system.backend: 'ray' needs Ray installed (pip install 'rlmap[ray]')"
        ) from None
    return ray


def rollout_config(cfg: RecipeConfig, device: str = "cpu") -> RecipeConfig:
    """The run's config as a rollout actor on ``device`` needs it: no critic, no reference
    model, no LoRA adapters (the published weights of a LoRA policy are merged: a plain
    model's), and one process (``inprocess``: the actor is no Ray driver)."""
    system = replace(cfg.system, device=device, backend="inprocess")
    return cfg.model_copy(
        update={
            "critic": replace(cfg.critic, enabled=False),
            "kl": replace(cfg.kl, placement="none"),
            "model": replace(cfg.model, lora_rank=0),
            "system": system,
        }
    )


class RolloutActor:
    """The body of a Ray actor: the rollout side of a run, and one method per round."""

    def __init__(self, cfg: RecipeConfig, start: str, reward_path: str | None) -> None:
        import ray

        from rlmap.assembly.parts import build

        torch.set_num_threads(1)  # one core per actor; the learner keeps the rest
        reward = None if reward_path is None else Path(reward_path)
        mine = rollout_config(cfg, actor_device(ray.get_gpu_ids()))
        self.p = build(mine, Path(start), reward_path=reward, trains=False)

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
        from rlmap.system.round_seeds import seeded
        from rlmap.system.rounds import next_prompts, rollout_round

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

    def __init__(
        self,
        runner: AsyncRunner,
        start: Path,
        reward_path: Path | None,
        shared: Any,
        options: dict[str, Any],
    ) -> None:
        self.ray, self.runner, self.shared, self.options = _ray(), runner, shared, options
        self.args = (runner.p.cfg, str(start), None if reward_path is None else str(reward_path))
        self.restarts = 0
        self.actor = self._start()

    def _start(self) -> Any:
        actor_class = self.ray.remote(**self.options)(RolloutActor)
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
                # the board's snapshot as it is: in host memory, in the rollout dtype
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
        self.group: Any = None

    def __call__(self, runner: AsyncRunner) -> list[Worker]:
        ray, s = _ray(), runner.p.cfg.system
        gpus = actor_gpus(s, runner.p.device)
        if not ray.is_initialized():
            self._init(ray, s, runner.p.device, gpus)
        shared = SharedWeights(runner)
        options = [actor_options(gpus)] * s.workers
        if s.actor_placement == "colocate":
            options = self._colocate(ray, s.workers, gpus)
        return [RayWorker(runner, self.start, self.reward_path, shared, o) for o in options]

    def _init(self, ray: Any, s: SystemParams, learner: torch.device, gpus: float) -> None:
        """A local Ray on the loopback address with a CPU per actor and one for the driver,
        and the GPUs the actors may take (:func:`ray_gpus`; none when they ask for none) — or,
        with ``RAY_ADDRESS`` set, the user's cluster joined as it is (Ray refuses resource
        counts when it joins one; that cluster must keep the learner's GPU out itself)."""
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
            return
        devices = ray_gpus(s.actor_placement, learner, visible_gpus()) if gpus > 0 else []
        with cuda_visible(devices) if devices else nullcontext():
            ray.init(
                num_cpus=s.workers + 1,
                num_gpus=len(devices),
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
            )
        self.started = True

    def _colocate(self, ray: Any, workers: int, gpus: float) -> list[dict[str, Any]]:
        """The actors' options in one PACK placement group, reserved whole before any actor
        starts, so they share the learner's GPU or the run stops in one line."""
        from ray.util.placement_group import placement_group

        self.group = placement_group(bundles(workers, gpus), strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"system.actor_placement: Ray could not place {workers} actors "
                f"at {gpus:g} GPU each on one GPU in {PLACE_TIMEOUT_S:g} s "
                "(is another job on it?)"
            ) from None
        return colocated_options(gpus, self.group, workers)

    def shutdown(self) -> None:
        if self.group is not None and _ray().is_initialized():
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None
        if self.started:
            _ray().shutdown()
            self.started = False
