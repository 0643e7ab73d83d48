"""The asynchronous loop (in-process): rollout workers feed a queue, the learner never waits
for a group.

    worker × W (threads)                      learner (the caller's thread)
    ─────────────────────                      ─────────────────────────────
    admit n prompts (staleness bound) ─┐       take B finished trajectories (arrival order)
    load the newest weights            │       drop those more than η versions old (counted)
    run their episodes, score them ────┴─►Q─►  learn (the synchronous loop's own step)
    (partial rollout: new weights may          publish weights as version v + 1
     arrive between turns)                     (every ``system.publish_every`` steps)

It reuses the synchronous loop's step functions: :func:`~rlmap.system.sync.rollout_round`
produces and scores the episodes (on the worker's own engine), and
:func:`~rlmap.system.sync.learn` updates critic and policy.

A worker rolls out ``system.worker_prompts`` prompts (default B / W) in one batched
``generate`` per turn — Hugging Face ``generate`` has no continuous batching — and its
trajectories enter the queue when that round finishes.

Versions. Every action token carries the version of the weights that sampled it
(``Completion.version``); a worker loads the newest published snapshot before each
prompt and, with ``system.partial_rollout``, also between the turns of an episode, so one
trajectory may mix versions. A trajectory's staleness when consumed is the learner's
version minus its *oldest* token's version.

The staleness bound η = ``behaviour.max_staleness`` holds twice:

- at admission (AReaL's rule): a worker starts a prompt only while
  ``started − dropped ≤ (v + η + 1)·B`` trajectories, v the learner's version — so
  no more is in flight than the learner can consume within η versions;
- at consumption: a trajectory older than η versions is dropped (``system/stale_dropped``),
  and the ``staleness`` correction, when the recipe has it, masks it too.

Weights travel as a snapshot (a cloned state dict) taken by the learner after its
step, never read from the live model while it trains. Nothing here touches files.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import TrainingError
from rlmap.system.hf_engine import HFEngine
from rlmap.system.lora import rollout_weights
from rlmap.system.rollout import Scored, to_batch
from rlmap.system.setup import DTYPES, Parts
from rlmap.system.sync import (
    LoopState,
    adapt_kl,
    learn,
    next_prompts,
    rollout_metrics,
    rollout_round,
)
from rlmap.system.vllm_engine import PinnedView

WAIT_S = 0.05
"""How often blocked threads look at the stop flag."""
FAILED_IN_A_ROW = 5
"""Rounds one worker may lose in a row (a flaky tool, a restarted actor) before the run stops."""


@dataclass
class Board:
    """The newest published weights: a version and a snapshot of the state dict (of a LoRA
    policy, the merged one: engines and Ray actors load it into a plain model)."""

    version: int
    state: dict[str, torch.Tensor]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        snapshot = {k: v.detach().clone() for k, v in rollout_weights(model).items()}
        with self.lock:
            self.version, self.state = version, snapshot

    def latest(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self.lock:
            return self.version, self.state


@dataclass
class Admission:
    """AReaL's staleness control: ``started − dropped ≤ (v + η + 1)·B`` (module docstring)."""

    batch: int
    eta: int
    started: int = 0
    dropped: int = 0
    version: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def admit(self, n: int, stop: threading.Event) -> bool:
        """Wait until ``n`` more trajectories may start; False when stopping."""
        with self.cond:
            while self.started + n - self.dropped > (self.version + self.eta + 1) * self.batch:
                if stop.is_set():
                    return False
                self.cond.wait(WAIT_S)
            self.started += n
            return not stop.is_set()

    def advance(self, version: int, dropped: int) -> None:
        with self.cond:
            self.version, self.dropped = version, self.dropped + dropped
            self.cond.notify_all()


@dataclass(frozen=True)
class Finished:
    """A scored trajectory as it leaves a worker."""

    scored: Scored
    duration_s: float
    """Wall seconds from the start of its prompt's rollout to its end."""


@dataclass
class Counts:
    """What the workers did, for the ledger's balance (generated = consumed + dropped +
    aborted + queued)."""

    finished: int = 0
    finished_tokens: int = 0
    aborted_rounds: int = 0
    durations: list[float] = field(default_factory=list)
    """Seconds of each trajectory finished since the learner last looked (drained per step):
    every finished one, not only the consumed — those are biased toward the quick."""
    lock: threading.Lock = field(default_factory=threading.Lock)


class AsyncRunner:
    """Worker threads around a run's parts; ``step`` is one learner step (module docstring)."""

    def __init__(
        self, p: Parts, state: LoopState, workers_of: Callable[[AsyncRunner], list[Worker]]
    ) -> None:
        s = p.cfg.sampling
        self.p = p
        self.batch = s.prompts_per_step * s.group_size
        workers = p.cfg.system.workers
        self.prompts = p.cfg.system.worker_prompts or max(1, s.prompts_per_step // workers)
        self.queue: queue.Queue[Finished] = queue.Queue()
        self.board = Board(state.step, {})
        self.board.publish(p.policy, state.step)
        self.admission = Admission(self.batch, p.cfg.behaviour.max_staleness, version=state.step)
        self.counts = Counts()
        self.consumed = self.stale_dropped = self.rejected = 0
        self.cursor, self.cursor_lock = state.cursor, threading.Lock()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.workers = workers_of(self)
        self.threads = [
            threading.Thread(target=self._work, args=(w,), name=f"rollout-{k}", daemon=True)
            for k, w in enumerate(self.workers)
        ]
        for t in self.threads:
            t.start()

    # --- workers -----------------------------------------------------------------------

    def _take_prompts(self, n: int) -> int:
        """The cursor of the next ``n`` prompts (they are groups cursor .. cursor + n − 1)."""
        with self.cursor_lock:
            cursor = self.cursor
            self.cursor += n
        return cursor

    def _work(self, worker: Worker) -> None:
        size = self.prompts * self.p.cfg.sampling.group_size
        failed = 0  # rounds in a row this worker lost
        try:
            while self.admission.admit(size, self.stop):
                cursor = self._take_prompts(self.prompts)
                started = time.perf_counter()
                try:
                    scored = worker.roll(cursor, self.prompts)
                except TrainingError:  # the policy itself is broken: every round would fail
                    raise
                except Exception as exc:  # an engine, environment or worker fault: this round
                    with self.counts.lock:
                        self.counts.aborted_rounds += 1
                    self.admission.advance(self.admission.version, size)  # slots free again
                    failed += 1
                    if failed >= FAILED_IN_A_ROW:  # not a passing fault: stop, saying which
                        raise TrainingError(f"rollout: {failed} rounds in a row failed in a "
                                            f"worker, the last with {type(exc).__name__}: "
                                            f"{exc}") from exc  # fmt: skip
                    continue
                failed = 0
                took = time.perf_counter() - started
                with self.counts.lock:
                    self.counts.finished += len(scored)
                    self.counts.finished_tokens += sum(x.episode.action_tokens for x in scored)
                    self.counts.durations += [took] * len(scored)
                for x in scored:
                    self.queue.put(Finished(x, took))
        except BaseException as exc:  # surfaced by the learner, never swallowed
            self.errors.append(exc)

    # --- the learner ---------------------------------------------------------------------

    def _take(self, n: int) -> tuple[list[Finished], float]:
        """``n`` finished trajectories in arrival order, and the seconds spent waiting."""
        items: list[Finished] = []
        started = time.perf_counter()
        while len(items) < n:
            if self.errors:
                if isinstance(self.errors[0], TrainingError):  # one line at the CLI
                    raise TrainingError(str(self.errors[0]))
                raise RuntimeError("a rollout worker failed") from self.errors[0]
            try:
                items.append(self.queue.get(timeout=WAIT_S))
            except queue.Empty:
                continue
        return items, time.perf_counter() - started

    def step(self, state: LoopState) -> tuple[LoopState, dict[str, float]]:
        """One learner step: take B trajectories, drop the stale, learn, publish."""
        started = time.perf_counter()
        queued_before = self.queue.qsize()
        items, waited = self._take(self.batch)
        version = state.step
        lags = [version - oldest_version(x.scored) for x in items]
        eta = self.p.cfg.behaviour.max_staleness
        fresh = [x.scored for x, lag in zip(items, lags, strict=True) if lag <= eta]
        kept = [x for x in fresh if x.status == RewardStatus.OK and x.episode.end != End.ABORTED]
        self.consumed += len(kept)
        self.stale_dropped += len(items) - len(fresh)
        self.rejected += len(fresh) - len(kept)
        metrics = self._metrics(items, kept, lags, waited, queued_before)
        metrics["system/stale_dropped"] = float(len(items) - len(fresh))
        update_started = time.perf_counter()
        if kept:
            batch = to_batch(kept, pad_token_id=int(self.p.tokenizer.pad_token_id))
            metrics |= learn(self.p, batch, state)
            state = adapt_kl(self.p, state, metrics, batch.size)
        update_s = time.perf_counter() - update_started
        state = replace(state, step=state.step + 1, cursor=self.cursor)
        if state.step % self.p.cfg.system.publish_every == 0:
            self.board.publish(self.p.policy, state.step)
        self.admission.advance(state.step, len(items) - len(fresh))
        total = time.perf_counter() - started
        return state, metrics | {
            "system/update_s": update_s,
            "system/rollout_s": waited,
            "system/learner_utilisation": update_s / max(total, 1e-9),
            "system/tokens_per_s": metrics["sampling/generated_tokens"] / max(total, 1e-9),
        }

    def _metrics(self, items: list[Finished], kept: list[Scored], lags: list[int],
                 waited: float, queued: int) -> dict[str, float]:  # fmt: skip
        scored = [x.scored for x in items]
        tokens = [x.episode.action_tokens for x in scored]
        kept_tokens = sum(x.episode.action_tokens for x in kept)
        with self.counts.lock:
            finished_mean = self.counts.finished_tokens / max(self.counts.finished, 1)
            recent, self.counts.durations = self.counts.durations, []
        durations = torch.tensor(recent or [x.duration_s for x in items])
        lag = torch.tensor(lags, dtype=torch.float32)
        return rollout_metrics(scored, multi_turn=self.p.cfg.data.multi_turn) | {
            "sampling/generated": float(len(items)),
            "sampling/generated_tokens": float(sum(tokens)),
            "sampling/kept": float(len(kept)),
            "sampling/kept_frac": len(kept) / len(items),
            "sampling/rounds": 1.0,
            "sampling/rejected": float(sum(x.status != 0 for x in scored)),
            "sampling/infra_errors": float(
                sum(x.status == RewardStatus.INFRA_ERROR for x in scored)
            ),
            "sampling/timeouts": float(sum(x.status == RewardStatus.TIMEOUT for x in scored)),
            "system/checkpoint_age_mean": float(lag.mean()),
            "system/checkpoint_age_max": float(lag.max()),
            "system/accepted_token_frac": kept_tokens / max(sum(tokens), 1),
            "system/queue_length": float(queued),
            "system/rollout_duration_mean": float(durations.mean()),
            "system/rollout_duration_p50": float(durations.quantile(0.5)),
            "system/rollout_duration_p95": float(durations.quantile(0.95)),
            "system/rollout_duration_p99": float(durations.quantile(0.99)),
            "system/learner_wait_s": waited,
            "system/consumed_length_mean": sum(tokens) / len(tokens),
            "system/finished_length_mean": finished_mean,
        }

    def close(self) -> dict[str, int]:
        """Stop the workers (a round under way finishes) and return the balance:
        ``finished`` = ``consumed`` + ``stale_dropped`` + ``rejected`` (failed rewards) +
        ``queued_at_end``, exactly;
        ``aborted_rounds`` (rounds whose rollout raised) and ``aborted`` (their trajectories)
        produced nothing to consume."""
        self.stop.set()
        with self.admission.cond:
            self.admission.cond.notify_all()
        for t in self.threads:
            t.join(timeout=60)
        for w in self.workers:
            close = getattr(w, "close", None)
            if close is not None:
                close()
        with self.counts.lock:
            return {"finished": self.counts.finished, "consumed": self.consumed,
                    "stale_dropped": self.stale_dropped, "rejected": self.rejected,
                    "queued_at_end": self.queue.qsize(),
                    "aborted_rounds": self.counts.aborted_rounds,
                    "aborted": self.counts.aborted_rounds * self.prompts
                    * self.p.cfg.sampling.group_size}  # fmt: skip


class Worker(Protocol):
    """One rollout worker: rolls out prompts ``cursor .. cursor + n − 1`` on the newest
    published weights and returns them scored; raises on a fault (the round is lost)."""

    def roll(self, cursor: int, n: int) -> list[Scored]: ...


class ThreadWorker:
    """A worker in this process, on a thread: its own HF engine (a copy of the weights), or
    its own view of the run's one vLLM engine (:class:`rlmap.system.vllm_engine.PinnedView`:
    its own weight version; the engine batches one worker's call at a time)."""

    def __init__(self, runner: AsyncRunner) -> None:
        p = self.p = runner.p
        self.board = runner.board
        self.engine: HFEngine | PinnedView
        if isinstance(p.engine, PinnedView):  # vLLM: the run's one engine, shared
            self.engine = PinnedView(p.engine.engine, *self.board.latest())
        else:
            self.engine = HFEngine(
                p.policy, pad_token_id=int(p.tokenizer.pad_token_id),
                eos_token_id=int(p.tokenizer.eos_token_id),
                dtype=DTYPES[p.cfg.system.rollout_dtype], own_copy=True)  # fmt: skip

    def refresh(self) -> None:
        version, state = self.board.latest()
        if version != self.engine.version:
            self.engine.set_weights(state, version)

    def roll(self, cursor: int, n: int) -> list[Scored]:
        p = self.p
        self.refresh()
        examples = next_prompts(p.train, cursor, n, p.cfg.seed)
        partial = self.refresh if p.cfg.system.partial_rollout else None
        return rollout_round(p, examples, cursor, engine=self.engine, before_turn=partial)


def thread_workers(runner: AsyncRunner) -> list[Worker]:
    """``system.workers`` in-process workers."""
    return [ThreadWorker(runner) for _ in range(runner.p.cfg.system.workers)]


def oldest_version(x: Scored) -> int:
    """The version of the oldest weights that sampled any of the trajectory's tokens."""
    e = x.episode
    versions = [v for v, a in zip(e.versions, e.action, strict=True) if a]
    return min(versions) if versions else 0


@contextmanager
def async_runner(
    p: Parts,
    state: LoopState,
    report: dict[str, int] | None = None,
    workers_of: Callable[[AsyncRunner], list[Worker]] = thread_workers,
) -> Iterator[AsyncRunner]:
    """An :class:`AsyncRunner` whose workers stop when the block ends, however it ends;
    its :meth:`AsyncRunner.close` balance is written into ``report``. ``workers_of`` makes
    the workers: threads here (default), Ray actors (:mod:`rlmap.system.ray_workers`)."""
    runner = AsyncRunner(p, state, workers_of)
    try:
        yield runner
    finally:
        balance = runner.close()
        if report is not None:
            report.update(balance)
