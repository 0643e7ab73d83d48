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

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig
from rlmap.rollout.episodes import Scored
from rlmap.system.async_loop import AsyncRunner, Worker
from rlmap.system.params import SystemParams

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


def actor_device(gpu_ids: list[Any]) -> str:
    """An actor's ``system.device``: the GPU Ray gave it (``ray.get_gpu_ids()``; Ray narrows
    its CUDA_VISIBLE_DEVICES to it, so ``cuda:0``), else the CPU — even on a GPU machine,
    where Ray leaves an actor that asked for none every GPU in sight."""
    return "cuda:0" if gpu_ids else "cpu"


def actor_gpus(s: SystemParams, learner: torch.device) -> float:
    """``system.actor_gpus`` resolved: as set; else 0 beside a CPU learner, 1 on separate
    GPUs, or an equal share of the learner's GPU rounded down to Ray's unit of 1e-4 (so
    the shares never sum past one GPU)."""
    if s.actor_gpus is not None:
        return s.actor_gpus
    if learner.type != "cuda":
        return 0.0
    return 1.0 if s.actor_placement == "separate" else math.floor(1e4 / s.workers) / 1e4


def per_gpu(gpus: float) -> int:
    """How many actors asking ``gpus`` (0 < gpus ≤ 1) Ray fits on one GPU: ⌊1/gpus⌋ (a
    fraction is a share of one GPU, never split across two)."""
    return math.floor(1 / gpus + 1e-9)  # 1e-9: 1/0.1 must count 10, whatever its rounding


def actor_options(gpus: float) -> dict[str, Any]:
    """Ray's options for a rollout actor: one CPU, and ``num_gpus`` when it asks for any."""
    return {"num_cpus": 1, "num_gpus": gpus} if gpus > 0 else {"num_cpus": 1}


def bundles(workers: int, gpus: float) -> list[dict[str, float]]:
    """The colocated actors' placement group: one bundle per actor, its CPU and its share of
    the GPU; packed (``PACK``) onto the one GPU Ray is given, the learner's."""
    return [{"CPU": 1, "GPU": gpus} for _ in range(workers)]


def colocated_options(gpus: float, group: Any, workers: int) -> list[dict[str, Any]]:
    """Actor ``i``'s options: :func:`actor_options` in bundle ``i`` of ``group``, so an actor
    that dies and restarts takes its own bundle back."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return [
        actor_options(gpus)
        | {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i
            )
        }
        for i in range(workers)
    ]


def visible_gpus() -> list[str]:
    """This process's GPUs as CUDA_VISIBLE_DEVICES names them (their indices when unset)."""
    if not torch.cuda.is_available():
        return []
    count, named = torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is None:
        return [str(i) for i in range(count)]
    return [g.strip() for g in named.split(",")][:count]


def ray_gpus(placement: str, learner: torch.device, visible: list[str]) -> list[str]:
    """The GPUs the run's own Ray is started with: all of ``visible`` beside a CPU learner;
    beside a CUDA learner the others (``separate``) or the learner's alone (``colocate``)."""
    if learner.type != "cuda":
        return visible
    own = visible[learner.index or 0]
    return [own] if placement == "colocate" else [g for g in visible if g != own]


@contextmanager
def cuda_visible(devices: list[str]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES set to ``devices`` while Ray starts: its raylet and every actor
    inherit it, and Ray hands out only these. The learner's own CUDA context, made before,
    does not move."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def check_gpus(cfg: RecipeConfig, learner: torch.device) -> None:
    """One-line ConfigError, before the run starts, for GPUs the actors ask of this machine
    and it cannot give (``learner``: the learner's device, resolved)."""
    s = cfg.system
    if s.actor_placement == "colocate" and learner.type != "cuda":
        raise ConfigError(
            f"system.actor_placement: colocate shares the learner's GPU, and "
            f"the learner is on the CPU (system.device={s.device})"
        )
    gpus = actor_gpus(s, learner)
    if gpus == 0:
        if s.engine == "vllm" and torch.cuda.is_available():
            raise ConfigError(
                "system.actor_gpus: 0, and vLLM's CUDA build needs a GPU in each "
                "rollout actor; set system.actor_gpus > 0"
            )
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            f"system.actor_gpus: {gpus:g} GPU per rollout actor, and this torch "
            f"sees no CUDA (torch {torch.__version__}); use 0"
        )
    if os.environ.get("RAY_ADDRESS"):  # a cluster of the user's: its GPUs are not this machine's
        if s.actor_placement == "colocate":
            raise ConfigError(
                "system.actor_placement: colocate needs the run's own Ray (it "
                "gives Ray the learner's GPU alone); unset RAY_ADDRESS or use "
                "separate"
            )
        return
    have = len(ray_gpus(s.actor_placement, learner, visible_gpus()))
    need = math.ceil(s.workers / per_gpu(gpus))
    if need > have:
        mine = " (the learner's own)" if s.actor_placement == "colocate" else ""
        raise ConfigError(
            f"system.actor_gpus: {s.workers} rollout actors at {gpus:g} GPU "
            f"each need {need} GPU(s), and Ray gets {have}{mine}; lower "
            "system.workers or system.actor_gpus"
        )
    if s.engine == "vllm":
        _check_engine_memory(s, gpus)


def _check_engine_memory(s: SystemParams, gpus: float) -> None:
    """vLLM instances sharing a GPU each take ``engine_memory`` of it — colocated, the
    learner's own engine (built in the learner's process, for its evaluations) among them,
    and the learner needs some too: a share that cannot fit stops the run before it starts."""
    sharing = min(s.workers, per_gpu(gpus))
    colocated = s.actor_placement == "colocate"
    engines = sharing + colocated  # the learner's own engine shares the colocated GPU
    total = engines * s.engine_memory
    if total > 1 or (colocated and total >= 1):
        whose = f" ({sharing} actors' and the learner's)" if colocated else " (actors')"
        beside = " beside the learner" if colocated else ""
        raise ConfigError(
            f"system.engine_memory: {engines} vLLM engines on one GPU{whose} at "
            f"{s.engine_memory:g} each take {total:g} of its memory{beside}; "
            "lower system.engine_memory"
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
