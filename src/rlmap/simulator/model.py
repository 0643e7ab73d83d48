"""A discrete-event model of the system axis: wait at a barrier, or drift?

``simulate(config)`` plays W rollout workers and one learner forward in time and
reports what each mode buys and what it costs: throughput and idle time against
staleness, dropped work and selection bias. The source map's point, in numbers:
asynchrony is not free throughput — it trades idle time for distribution shift,
a queue that prefers short trajectories, and version bookkeeping.

Notation (as ``rlmap simulate``'s flags):

- W rollout workers (``--workers``); each generates one trajectory at a time.
- d: a trajectory's rollout duration, i.i.d. from ``--duration``
  (:mod:`rlmap.simulator.inputs`); every mode sees the same sequence of draws.
- B trajectories per learner step (``--batch``; prompts × G for a group recipe).
- s: the learner step time (``--learner-step-s``, fixed or a distribution). A step
  consumes B trajectories and publishes weight version u + 1 when it ends (u = the
  number of steps published so far, starting at 0).
- staleness of a consumed trajectory = u − v, the learner's version when it takes
  the batch minus the version the trajectory's *first* token was generated under
  (docs/formulas.md §4 ``staleness``: the oldest token counts).

Modes:

``sync`` — the group barrier. Step k: the B trajectories are pulled one at a time by
whichever worker is free (greedy list scheduling; a worker with nothing left idles);
the rollout phase ends when the last one finishes; then the learner runs for s
while every worker idles (no overlap of rollout and learning). All trajectories
are generated under version k and consumed at version k: staleness 0.
``group_idle_frac`` = idle worker-time in rollout phases / (W × their length).

``async`` — the single-rollout queue with staleness bound η (``--eta``). Workers run
continuously and pick up the newest published weights when they *start* a
trajectory; finished ones join a FIFO queue; whenever the learner is free and the
queue holds B, it takes the B that finished first. Two guards, as in AReaL:
admission control — a worker may start a trajectory only while
``started − dropped < (u + η + 1)·B`` (in-order consumption could then never see a
staleness above η) — and a consumption filter that drops any finished trajectory
with u − v > η (long trajectories overtaken by short ones; counted, and their
worker time reported as wasted). η = 0 reproduces ``sync`` exactly. There is no
barrier, so ``group_idle_frac`` is 0; workers blocked by admission control show up
in ``worker_util``.

``partial`` — Kimi k1.5's partial rollout, in time rather than tokens. Iteration k's
rollout phase runs until B trajectories are ready; then every unfinished trajectory
is paused (its generated part kept), the learner runs for s, and the paused ones
resume first in iteration k + 1 under version k + 1 — one trajectory, segments
under several versions. With a per-iteration budget L (``--budget-s``) the phase also
ends L seconds after it began, as soon as at least one trajectory is ready, and the
learner trains on the ready ones (≤ B; the step takes s all the same). Workers never
wait for a straggler, only for the learner; ``group_idle_frac`` is 0.

Assumptions (what the model leaves out):

- durations are independent of the weight version, the worker and each other (no
  length drift during training, no batched-decoding interference; one trajectory
  per worker — a vLLM engine with many sequences in flight is many "workers");
- publishing weights and picking them up take no time; a resumed partial rollout
  costs no prefill of its saved prefix; the queue has no capacity limit beyond
  admission control; prompts never run out;
- the learner's step time does not depend on the trajectories' lengths;
- ties: events at the same instant are all handled before any worker starts, so a
  worker free at the moment a version is published starts under the new version;
- the run ends when the learner publishes its last version (``--steps``); what is
  then in flight or queued is reported, not consumed, and worker time is counted
  up to that moment.

Selection bias: ``generated_mean_duration`` is over every trajectory started (an
i.i.d. sample of d), ``consumed_mean_duration`` over those the learner used. They
differ when long ones are dropped or still in flight at the end; even without
drops, long trajectories reach the learner staler
(``staleness_by_duration_quartile``).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from rlmap.core.errors import ConfigError
from rlmap.simulator.inputs import Duration

MODES = ("sync", "async", "partial")
"""Known ``--mode`` values."""


@dataclass(frozen=True)
class SimConfig:
    """One simulated system; every field is the ``rlmap simulate`` flag of the same name."""

    mode: str
    """``sync`` (group barrier), ``async`` (queue with staleness bound η) or ``partial``."""
    workers: int
    """W: rollout workers, each generating one trajectory at a time."""
    batch: int
    """B: trajectories consumed per learner step."""
    duration: Duration
    """Distribution of one trajectory's rollout time, in seconds."""
    learner_step: Duration
    """Distribution of the learner's step time s, in seconds."""
    steps: int = 200
    """Learner steps to simulate; the run ends when the last one publishes."""
    eta: int = 1
    """η (async): the largest staleness, in versions, a consumed trajectory may have."""
    budget_s: float | None = None
    """L (partial): longest rollout phase of one iteration, in seconds; None: no limit."""
    seed: int = 0
    """Seed of the duration streams; equal seeds give identical runs."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode: unknown mode {self.mode!r} (known: {', '.join(MODES)})")
        for flag, value in (
            ("--workers", self.workers),
            ("--batch", self.batch),
            ("--steps", self.steps),
        ):
            if value < 1:
                raise ConfigError(f"{flag}: must be an integer >= 1, got {value}")
        if self.eta < 0:
            raise ConfigError(f"--eta: must be an integer >= 0, got {self.eta}")
        if self.budget_s is not None and not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise ConfigError(f"--budget-s: must be a positive number, got {self.budget_s:g}")


@dataclass(frozen=True)
class SimResult:
    """What one simulated run predicts. Times in seconds; staleness in versions."""

    mode: str
    """The simulated mode."""
    workers: int
    """W."""
    batch: int
    """B."""
    eta: int | None
    """η (async only)."""
    budget_s: float | None
    """L (partial only)."""
    duration: str
    """The duration distribution's spec."""
    learner_step: str
    """The learner step distribution's spec."""
    steps: int
    """Learner steps simulated."""
    sim_time_s: float
    """Simulated wall-clock until the last learner step published."""
    trajectories_per_s: float
    """Consumed trajectories per second (the throughput that trains the model)."""
    learner_steps_per_s: float
    """Learner steps per second."""
    learner_util: float
    """Fraction of the wall-clock the learner computes (1 − learner idle fraction)."""
    worker_util: float
    """Fraction of W × wall-clock workers generate (dropped work included)."""
    group_idle_frac: float
    """Idle worker-time in rollout phases / worker-time in rollout phases (barrier cost)."""
    started: int
    """Trajectories started."""
    consumed: int
    """Trajectories consumed by the learner (steps × B, or fewer under a partial budget)."""
    dropped: int
    """Trajectories dropped by the staleness filter (async)."""
    queued_at_end: int
    """Finished trajectories waiting for the learner when the run ended."""
    in_flight_at_end: int
    """Trajectories being generated or paused when the run ended."""
    dropped_frac: float
    """dropped / (consumed + dropped)."""
    wasted_work_frac: float
    """Worker-time spent on dropped trajectories / all worker busy time."""
    staleness_hist: tuple[int, ...]
    """Consumed trajectories with staleness 0, 1, 2, … versions."""
    staleness_mean: float
    """Mean staleness of consumed trajectories."""
    staleness_p95: int
    """95th percentile (nearest rank) of consumed trajectories' staleness."""
    staleness_max: int
    """Largest staleness of a consumed trajectory."""
    staleness_by_duration_quartile: tuple[float, float, float, float]
    """Mean staleness of consumed trajectories in each quartile of d, shortest first."""
    queue_mean: float
    """Time-averaged number of finished trajectories waiting for the learner."""
    queue_max: int
    """Most finished trajectories ever waiting for the learner."""
    generated_mean_duration: float
    """Mean d over all started trajectories (an i.i.d. sample of the distribution)."""
    consumed_mean_duration: float
    """Mean d over consumed trajectories; below the generated mean = selection bias."""
    segments_mean: float
    """Mean number of versions a consumed trajectory was generated under (partial: > 1)."""

    @property
    def selection_bias(self) -> float:
        """consumed / generated mean duration − 1 (negative: short trajectories favoured)."""
        return self.consumed_mean_duration / self.generated_mean_duration - 1.0


@dataclass
class _Level:
    """A piecewise-constant count over time (the queue): its time integral and maximum."""

    value: int = 0
    since: float = 0.0
    area: float = 0.0
    peak: int = 0

    def set(self, now: float, value: int) -> None:
        self.area += self.value * (now - self.since)
        self.value, self.since, self.peak = value, now, max(self.peak, value)


@dataclass
class _Tally:
    """Mutable bookkeeping of one run; :func:`_summarise` freezes it into a ``SimResult``."""

    duration_T: list[float] = field(default_factory=list)  # d of every started trajectory
    version_T: list[int] = field(default_factory=list)  # version of its first segment
    consumed: list[tuple[float, int, int]] = field(default_factory=list)  # (d, staleness, segs)
    dropped_durations: list[float] = field(default_factory=list)
    worker_busy: float = 0.0
    rollout_window: float = 0.0  # W × length of rollout phases (sync, partial)
    learner_busy: float = 0.0
    queue: _Level = field(default_factory=_Level)
    end: float = 0.0
    queued_at_end: int = 0
    in_flight_at_end: int = 0

    def start(self, d: float, version: int) -> int:
        self.duration_T.append(d)
        self.version_T.append(version)
        return len(self.duration_T) - 1

    def consume(self, tid: int, version: int, segments: int = 1) -> None:
        self.consumed.append((self.duration_T[tid], version - self.version_T[tid], segments))


def simulate(config: SimConfig) -> SimResult:
    """Run the model of ``config`` (see the module docstring) and summarise it."""
    durations = config.duration.stream(random.Random(f"{config.seed}/rollout"))
    learner = config.learner_step.stream(random.Random(f"{config.seed}/learner"))
    if config.mode == "sync":
        tally = _run_sync(config, durations, learner)
    elif config.mode == "async":
        tally = _Async(config, durations, learner).run()
    else:
        tally = _Partial(config, durations, learner).run()
    return _summarise(config, tally)


def _run_sync(cfg: SimConfig, durations: Iterator[float], learner: Iterator[float]) -> _Tally:
    tally, now = _Tally(), 0.0
    for k in range(cfg.steps):
        free_at = [now] * cfg.workers  # a heap of the moments each worker is free
        finished = []
        for _ in range(cfg.batch):
            d = next(durations)
            done = heapq.heappop(free_at) + d
            heapq.heappush(free_at, done)
            finished.append((done, tally.start(d, k)))
        barrier = max(done for done, _ in finished)
        tally.worker_busy += sum(tally.duration_T[tid] for _, tid in finished)
        tally.rollout_window += cfg.workers * (barrier - now)
        # waiting at the barrier: each finished trajectory sits in the queue until then
        tally.queue.area += sum(barrier - done for done, _ in finished)
        tally.queue.peak = cfg.batch
        for _, tid in finished:
            tally.consume(tid, k)
        s = next(learner)
        tally.learner_busy += s
        now = barrier + s
    tally.end = now
    return tally


FINISHED, LEARNED = 0, 1
"""Event kinds; at one instant, finished trajectories are handled before a publish."""


class _Async:
    """The asynchronous queue with admission control and a staleness filter (η)."""

    def __init__(self, cfg: SimConfig, durations: Iterator[float], learner: Iterator[float]):
        self.cfg, self.durations, self.learner = cfg, durations, learner
        self.tally = _Tally()
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, tid, worker)
        self.idle = list(range(cfg.workers))
        self.queue: deque[int] = deque()
        self.version = 0
        self.admitted = 0  # started − dropped
        self.learning = False

    def run(self) -> _Tally:
        self._start_workers(0.0)
        while True:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, tid, worker = heapq.heappop(self.events)
                if kind == LEARNED:
                    self.version += 1
                    self.learning = False
                    if self.version == self.cfg.steps:
                        return self._finish(now)
                else:
                    self._finished(now, tid, worker)
            self._take_batch(now)
            if not (self.events and self.events[0][0] == now):
                self._start_workers(now)

    def _start_workers(self, now: float) -> None:
        cap = (self.version + self.cfg.eta + 1) * self.cfg.batch
        while self.idle and self.admitted < cap:
            d = next(self.durations)
            tid = self.tally.start(d, self.version)
            heapq.heappush(self.events, (now + d, FINISHED, tid, self.idle.pop()))
            self.admitted += 1

    def _finished(self, now: float, tid: int, worker: int) -> None:
        self.idle.append(worker)
        self.tally.worker_busy += self.tally.duration_T[tid]
        self.queue.append(tid)
        self.tally.queue.set(now, len(self.queue))

    def _drop_stale(self, now: float) -> None:
        oldest = self.version - self.cfg.eta
        stale = [tid for tid in self.queue if self.tally.version_T[tid] < oldest]
        if stale:
            self.queue = deque(tid for tid in self.queue if self.tally.version_T[tid] >= oldest)
            self.tally.dropped_durations += [self.tally.duration_T[tid] for tid in stale]
            self.admitted -= len(stale)
            self.tally.queue.set(now, len(self.queue))

    def _take_batch(self, now: float) -> None:
        if self.learning:
            return
        self._drop_stale(now)
        if len(self.queue) < self.cfg.batch:
            return
        for _ in range(self.cfg.batch):
            self.tally.consume(self.queue.popleft(), self.version)
        self.tally.queue.set(now, len(self.queue))
        s = next(self.learner)
        self.tally.learner_busy += s
        self.learning = True
        heapq.heappush(self.events, (now + s, LEARNED, -1, -1))

    def _finish(self, now: float) -> _Tally:
        t = self.tally
        t.queue.set(now, len(self.queue))
        in_flight = [tid for _, kind, tid, _ in self.events if kind == FINISHED]
        t.worker_busy += sum(
            now - (done - t.duration_T[tid])
            for done, kind, tid, _ in self.events
            if kind == FINISHED
        )
        t.end, t.queued_at_end, t.in_flight_at_end = now, len(self.queue), len(in_flight)
        return t


class _Partial:
    """Iterations that end when B trajectories are ready (or at L); the rest pause and resume."""

    def __init__(self, cfg: SimConfig, durations: Iterator[float], learner: Iterator[float]):
        self.cfg, self.durations, self.learner = cfg, durations, learner
        self.tally = _Tally()
        self.remaining: list[float] = []  # per trajectory: rollout time still to go
        self.segments: list[int] = []  # per trajectory: versions it was generated under
        self.ready: deque[int] = deque()  # finished, waiting for the learner
        self.paused: deque[int] = deque()  # paused at an update, resumed first, oldest first
        self.running: dict[int, tuple[int, float]] = {}  # worker → (tid, segment start)
        self.events: list[tuple[float, int, int]] = []  # (segment end, tid, worker)

    def run(self) -> _Tally:
        now, budget = 0.0, self.cfg.budget_s if self.cfg.budget_s is not None else math.inf
        for k in range(self.cfg.steps):
            phase_start = now
            if len(self.ready) < self.cfg.batch:
                for worker in range(self.cfg.workers):
                    self._next_segment(worker, now, k)
                now = self._rollout_phase(k, deadline=now + budget)
            self.tally.rollout_window += self.cfg.workers * (now - phase_start)
            for _ in range(min(self.cfg.batch, len(self.ready))):
                tid = self.ready.popleft()
                self.tally.consume(tid, k, self.segments[tid])
            self.tally.queue.set(now, len(self.ready))
            s = next(self.learner)
            self.tally.learner_busy += s
            now += s
        t = self.tally
        t.queue.set(now, len(self.ready))
        t.end, t.queued_at_end, t.in_flight_at_end = now, len(self.ready), len(self.paused)
        return t

    def _next_segment(self, worker: int, now: float, version: int) -> None:
        if self.paused:
            tid = self.paused.popleft()
            self.segments[tid] += 1
        else:
            d = next(self.durations)
            tid = self.tally.start(d, version)
            self.remaining.append(d)
            self.segments.append(1)
        self.running[worker] = (tid, now)
        heapq.heappush(self.events, (now + self.remaining[tid], tid, worker))

    def _rollout_phase(self, version: int, deadline: float) -> float:
        """Segments run until B trajectories are ready, or until the deadline if one is."""
        while True:
            end, _, worker = self.events[0]
            if self.ready and end > deadline:  # the budget is spent: update with what is ready
                self._pause_running(deadline)
                return deadline
            self._finished(*heapq.heappop(self.events))
            if len(self.ready) >= self.cfg.batch or end >= deadline:
                while self.events and self.events[0][0] == end:  # finished at the same instant
                    self._finished(*heapq.heappop(self.events))
                self._pause_running(end)
                return end
            self._next_segment(worker, end, version)

    def _finished(self, now: float, tid: int, worker: int) -> None:
        _, started = self.running.pop(worker)
        self.tally.worker_busy += now - started
        self.remaining[tid] = 0.0
        self.ready.append(tid)
        self.tally.queue.set(now, len(self.ready))

    def _pause_running(self, now: float) -> None:
        """The update: every running segment stops; its trajectory resumes next iteration."""
        for tid, started in self.running.values():
            self.tally.worker_busy += now - started
            self.remaining[tid] -= now - started
            self.paused.append(tid)
        self.running.clear()
        self.events.clear()


def _summarise(cfg: SimConfig, t: _Tally) -> SimResult:
    stale_C = sorted(s for _, s, _ in t.consumed)
    n = len(stale_C)
    hist = [0] * (stale_C[-1] + 1)
    for s in stale_C:
        hist[s] += 1
    by_d = sorted(t.consumed)
    quartiles = tuple(
        _mean([s for _, s, _ in by_d[q * n // 4 : (q + 1) * n // 4]]) for q in range(4)
    )
    dropped = len(t.dropped_durations)
    return SimResult(
        mode=cfg.mode,
        workers=cfg.workers,
        batch=cfg.batch,
        eta=cfg.eta if cfg.mode == "async" else None,
        budget_s=cfg.budget_s if cfg.mode == "partial" else None,
        duration=cfg.duration.spec,
        learner_step=cfg.learner_step.spec,
        steps=cfg.steps,
        sim_time_s=t.end,
        trajectories_per_s=n / t.end,
        learner_steps_per_s=cfg.steps / t.end,
        learner_util=t.learner_busy / t.end,
        worker_util=t.worker_busy / (cfg.workers * t.end),
        group_idle_frac=max(0.0, 1 - t.worker_busy / t.rollout_window) if t.rollout_window else 0.0,
        started=len(t.duration_T),
        consumed=n,
        dropped=dropped,
        queued_at_end=t.queued_at_end,
        in_flight_at_end=t.in_flight_at_end,
        dropped_frac=dropped / (n + dropped),
        wasted_work_frac=sum(t.dropped_durations) / t.worker_busy,
        staleness_hist=tuple(hist),
        staleness_mean=_mean(stale_C),
        staleness_p95=stale_C[math.ceil(0.95 * n) - 1],
        staleness_max=stale_C[-1],
        staleness_by_duration_quartile=(quartiles[0], quartiles[1], quartiles[2], quartiles[3]),
        queue_mean=t.queue.area / t.end,
        queue_max=t.queue.peak,
        generated_mean_duration=_mean(t.duration_T),
        consumed_mean_duration=_mean([d for d, _, _ in t.consumed]),
        segments_mean=_mean([g for _, _, g in t.consumed]),
    )


def _mean(values: list[float] | list[int]) -> float:
    return sum(values) / len(values) if values else math.nan
