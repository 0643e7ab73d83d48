"""The asynchronous loop (in-process): rollout workers feed a queue, the learner never waits
for a group.

    worker × W (threads)                      learner (the caller's thread)
    ─────────────────────                      ─────────────────────────────
    admit n prompts (staleness bound) ─┐       take B finished trajectories (arrival order)
    load the newest weights            │       drop those more than η versions old (counted)
    run their episodes, score them ────┴─►Q─►  learn (the synchronous loop's own step)
    (partial rollout: new weights may          publish weights as version v + 1
     arrive between turns)                     (every ``system.publish_every`` steps)

It reuses the synchronous loop's step functions: :func:`~rlmap.system.rounds.rollout_round`
produces and scores the episodes (on the worker's own engine), and
:func:`~rlmap.system.learner_step.learn` updates critic and policy.

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

Weights travel as a snapshot taken by the learner after its step
(:class:`~rlmap.system.board.Board`), never read from the live model while it trains: the
rollout weights streamed one tensor at a time into buffers of the board's own, in the
rollout dtype — on the learner's device for in-process workers, in host memory for Ray
actors. Its seconds, with the learner's own engine's update, are ``system/weight_sync_s``.
Nothing here touches files.

Exactly once across a crash. :meth:`AsyncRunner.snapshot` (taken at each checkpoint,
between learner steps) holds the queue — finished, not yet consumed trajectories with
their tokens, per-token versions and behaviour log-probs —, the rounds in flight, the
admission counters, the data cursor and the balance. A resumed runner starts from it:
the queue is refilled as it was, and each round that was in flight is rolled out again
from its prompts on the newest weights (its tokens so far are not kept: the restart
policy), before any new prompt; those trajectories are counted as ``restarted``. Every
trajectory has an id (its group, its place in the group); the learner refuses to take
one twice, so none is consumed twice, and the balance says none is lost.

Repeatable on demand (``system.deterministic``): no threads; before each take the
learner's thread itself runs the rounds the admission bound allows, in order, round r on
worker r mod W, each under the python, numpy and torch generators seeded from (run seed,
worker, round) and restored afterwards. The queue's contents are then a function of the
seed, and so is every step.

A learner step takes one more trajectory for each stale one it drops (the workers are
rolling out on newer weights), so every step learns from B: the admission bound counts B
consumed per version, and a step that learnt from fewer would leave the workers that much
further ahead for the rest of the run. A step with nothing to train on otherwise (every
reward failed) is an *empty step*:
``system/empty_step`` 1, counted in the ledger, flagged by ``rlmap diagnose``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

import torch

from rlmap.assembly.parts import Parts
from rlmap.assembly.settings import DTYPES
from rlmap.core.batch import RewardStatus, trains
from rlmap.core.device import elapsed
from rlmap.core.errors import TrainingError
from rlmap.engines.hf import HFEngine
from rlmap.engines.vllm import PinnedView
from rlmap.rollout.packing import Scored, to_batch
from rlmap.sampling.filters import sampling_counters
from rlmap.system.admission import WAIT_S, Admission, Counts
from rlmap.system.board import Board
from rlmap.system.learner_step import learn
from rlmap.system.loop_state import LoopState, adapt_kl
from rlmap.system.round_seeds import round_seed, seeded
from rlmap.system.rounds import next_prompts, rollout_round
from rlmap.system.snapshots import Finished, numbered
from rlmap.system.step_metrics import rollout_metrics, step_times

FAILED_IN_A_ROW = 5
"""Rounds one worker may lose in a row (a flaky tool, a restarted actor) before the run stops."""


class AsyncRunner:
    """Worker threads around a run's parts; ``step`` is one learner step (module docstring).

    ``restored`` is a :meth:`snapshot` from a checkpoint: the runner goes on from it."""

    def __init__(
        self,
        p: Parts,
        state: LoopState,
        workers_of: Callable[[AsyncRunner], list[Worker]],
        restored: dict[str, Any] | None = None,
    ) -> None:
        s = p.cfg.sampling
        self.p = p
        self.batch = s.prompts_per_step * s.group_size
        workers = p.cfg.system.workers
        self.prompts = p.cfg.system.worker_prompts or max(1, s.prompts_per_step // workers)
        self.queue: queue.Queue[Finished] = queue.Queue()
        self.board = Board(
            state.step,
            {},
            dtype=DTYPES[p.cfg.system.rollout_dtype],
            host=p.cfg.system.backend == "ray",
        )
        self.board.publish(p.policy, state.step)
        self.admission = Admission(self.batch, p.cfg.behaviour.max_staleness, version=state.step)
        self.lock = self.admission.cond
        """Guards admission, the cursor, the rounds in flight and the queue's contents
        together: a snapshot sees every trajectory exactly once (in flight or queued)."""
        self.counts = Counts()
        self.consumed = self.stale_dropped = self.rejected = self.restarted = 0
        self.empty_steps = 0
        self.cursor = state.cursor
        self.in_flight: dict[int, int] = {}
        """Rounds started and not finished: first prompt's cursor → prompts."""
        self.redo: list[tuple[int, int]] = []
        """Rounds in flight at the checkpoint resumed from, to roll out again first."""
        self.taken: dict[int, int] = {}
        """Per group not yet fully taken by the learner, a bitmask of the samples taken."""
        self.rounds = 0
        """Rounds claimed so far (deterministic mode: round r's seed and worker)."""
        if restored is not None:
            self._restore(restored)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.workers = workers_of(self)
        self.deterministic = p.cfg.system.deterministic
        self.threads = (
            []
            if self.deterministic
            else [
                threading.Thread(target=self._work, args=(k,), name=f"rollout-{k}", daemon=True)
                for k in range(len(self.workers))
            ]
        )
        for t in self.threads:
            t.start()

    # --- across a crash ----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What a resumed runner needs to go on exactly (module docstring), as plain values.
        Taken by the learner between its steps (so nothing is being consumed)."""
        with self.lock, self.counts.lock:
            lost = sum(self.in_flight.values()) * self.p.cfg.sampling.group_size
            rounds = sorted(self.in_flight.items()) + self.redo  # then those not redone yet
            return {
                "queue": [f.to_record() for f in list(self.queue.queue)],
                "redo": [[c, n] for c, n in rounds],
                "lost": lost,
                "started": self.admission.started - lost,  # the redone are admitted anew
                "dropped": self.admission.dropped,
                "cursor": self.cursor,
                "finished": self.counts.finished,
                "finished_tokens": self.counts.finished_tokens,
                "aborted_rounds": self.counts.aborted_rounds,
                "consumed": self.consumed,
                "stale_dropped": self.stale_dropped,
                "rejected": self.rejected,
                "restarted": self.restarted,
                "empty_steps": self.empty_steps,
                "taken": [[g, m] for g, m in self.taken.items()],
                "rounds": self.rounds,
            }

    def _restore(self, r: dict[str, Any]) -> None:
        for item in r["queue"]:
            self.queue.put(Finished.from_record(item))
        self.redo = [(int(c), int(n)) for c, n in r["redo"]]
        self.admission.started, self.admission.dropped = r["started"], r["dropped"]
        self.cursor = r["cursor"]
        c = self.counts
        c.finished, c.finished_tokens = r["finished"], r["finished_tokens"]
        c.aborted_rounds = r["aborted_rounds"]
        self.consumed, self.stale_dropped = r["consumed"], r["stale_dropped"]
        self.rejected, self.empty_steps = r["rejected"], r["empty_steps"]
        self.restarted = r["restarted"] + r["lost"]  # those still to redo: counted
        self.taken = {int(g): int(m) for g, m in r["taken"]}
        self.rounds = r["rounds"]

    # --- workers -----------------------------------------------------------------------

    def _claim(self) -> tuple[int, int, int]:
        """The next round's prompts (cursor, n) — a round to redo, else the next fresh ones
        — and its number; called under ``self.lock``."""
        if self.redo:
            cursor, n = self.redo.pop(0)
        else:
            cursor, n = self.cursor, self.prompts
            self.cursor += n
        self.in_flight[cursor] = n
        self.rounds += 1
        return cursor, n, self.rounds - 1

    def _work(self, k: int) -> None:
        failed = [0]  # rounds in a row this worker lost
        try:
            while (claimed := self.admission.admit(self._size, self.stop, self._claim)) is not None:
                self._run(k, *claimed, failed)
        except BaseException as exc:  # surfaced by the learner, never swallowed
            self.errors.append(exc)

    @property
    def _size(self) -> int:
        return self.prompts * self.p.cfg.sampling.group_size

    def _run(self, k: int, cursor: int, n: int, r: int, failed: list[int]) -> None:
        """Round ``r`` on worker ``k``, sampling from its own generator seeded from (run
        seed, k, r): its trajectories queued, or the round aborted (``failed[0]``: rounds
        in a row this worker lost, FAILED_IN_A_ROW stops the run)."""
        group = self.p.cfg.sampling.group_size
        started = time.perf_counter()
        try:
            scored = self.workers[k].roll(cursor, n, round_seed(self.p.cfg.seed, k, r))
        except TrainingError:  # the policy itself is broken: every round would fail
            raise
        except Exception as exc:  # an engine, environment or worker fault: this round
            with self.lock, self.counts.lock:  # one change, as a snapshot must see it
                del self.in_flight[cursor]
                self.counts.aborted_rounds += 1
                self.admission.release(n * group)  # its slots are free again
            failed[0] += 1
            if failed[0] >= FAILED_IN_A_ROW:  # not a passing fault: stop, saying which
                raise TrainingError(
                    f"rollout: {failed[0]} rounds in a row failed in a "
                    f"worker, the last with {type(exc).__name__}: "
                    f"{exc}"
                ) from exc
            return
        failed[0] = 0
        took = time.perf_counter() - started
        with self.lock, self.counts.lock:  # in flight → queued, as one change
            del self.in_flight[cursor]
            self.counts.finished += len(scored)
            self.counts.finished_tokens += sum(x.episode.generated_tokens for x in scored)
            self.counts.durations += [took] * len(scored)
            for item in numbered(scored, took):
                self.queue.put(item)

    def _produce(self) -> None:
        """Deterministic mode: run every round the admission bound admits now, in order on
        the calling thread, round r on worker r mod W under seeds of (seed, worker, r)."""
        failed = [0]
        while True:
            a = self.admission
            with a.cond:
                if a.started + self._size - a.dropped > (a.version + a.eta + 1) * a.batch:
                    return
                a.started += self._size
                k = self.rounds % len(self.workers)
                cursor, n, r = self._claim()
            with seeded(round_seed(self.p.cfg.seed, k, r)):  # the environments' draws too
                self._run(k, cursor, n, r, failed)

    # --- the learner ---------------------------------------------------------------------

    def _take(self, n: int) -> tuple[list[Finished], float]:
        """``n`` finished trajectories in arrival order, and the seconds spent waiting; a
        trajectory taken before (a bug in the bookkeeping) stops the run."""
        items: list[Finished] = []
        started = time.perf_counter()
        if self.deterministic:  # every round the bound admits now, as far ahead as it goes
            self._produce()
        while len(items) < n:
            if self.deterministic and self.queue.empty():
                self._produce()
                if self.queue.empty():  # no thread will ever fill it
                    raise RuntimeError(
                        "deterministic mode: the staleness bound admits no "
                        "round and the queue is empty"
                    )
            if not self.deterministic and not self.threads and self.queue.empty():
                raise RuntimeError("no rollout worker: the queue is empty and nothing will fill it")
            if self.errors:
                if isinstance(self.errors[0], TrainingError):  # one line at the CLI
                    raise TrainingError(str(self.errors[0]))
                raise RuntimeError("a rollout worker failed") from self.errors[0]
            try:
                items.append(self.queue.get(timeout=WAIT_S))
            except queue.Empty:
                continue
        full = (1 << self.p.cfg.sampling.group_size) - 1
        for item in items:
            g, bit = item.scored.group, 1 << item.index
            mask = self.taken.get(g, 0)
            if mask & bit:
                raise RuntimeError(f"trajectory {item.uid} was taken twice")
            self.taken[g] = mask | bit
            if self.taken[g] == full:
                del self.taken[g]
        return items, time.perf_counter() - started

    def step(self, state: LoopState) -> tuple[LoopState, dict[str, float]]:
        """One learner step: take B trajectories, drop the stale and take one more for each
        (so B are learnt from, and the admission bound stays exact), learn, publish."""
        started = time.perf_counter()
        queued_before = self.queue.qsize()
        version = state.step
        eta = self.p.cfg.behaviour.max_staleness
        items: list[Finished] = []
        lags: list[int] = []
        fresh: list[Scored] = []
        waited, takes = 0.0, 0
        while len(fresh) < self.batch:  # each stale one is replaced by a fresh one
            took, seconds = self._take(self.batch - len(fresh))
            items, waited, takes = items + took, waited + seconds, takes + 1
            lag = [version - oldest_version(x.scored) for x in took]
            lags += lag
            fresh += [x.scored for x, k in zip(took, lag, strict=True) if k <= eta]
            self.admission.release(sum(k > eta for k in lag))  # room for fresh rounds now
        kept = [x for x in fresh if trains(x.status, x.episode.end)]
        stale = len(items) - len(fresh)
        self.consumed += len(kept)
        self.stale_dropped += stale
        self.rejected += len(fresh) - len(kept)
        self.empty_steps += not kept
        metrics = self._metrics(items, kept, lags, takes, queued_before)
        metrics["system/stale_dropped"] = float(stale)
        metrics["system/empty_step"] = float(not kept)
        if kept:
            batch = to_batch(kept, pad_token_id=int(self.p.tokenizer.pad_token_id))
            metrics |= learn(self.p, batch, state)
            state = adapt_kl(self.p, state, metrics, batch.size)
        with self.lock:
            cursor = self.cursor
        state = replace(state, step=state.step + 1, cursor=cursor)
        published = time.perf_counter()
        if state.step % self.p.cfg.system.publish_every == 0:
            self.board.publish(self.p.policy, state.step)
        # the learner's own engine (in learn) and the board's snapshot: the time to publish
        sync_s = metrics.get("system/weight_sync_s", 0.0) + elapsed(published, self.p.device)
        self.admission.advance(state.step, 0)  # the stale were released as they were taken
        # the step's wall time = the wait + the rest (learn, publish, bookkeeping): the same
        # split as the synchronous loop's (step_times)
        update_s = time.perf_counter() - started - waited
        tokens = metrics["sampling/generated_tokens"]
        return state, metrics | step_times(waited, update_s, tokens) | {
            "system/weight_sync_s": sync_s
        }

    def _metrics(
        self, items: list[Finished], kept: list[Scored], lags: list[int], takes: int, queued: int
    ) -> dict[str, float]:
        scored = [x.scored for x in items]
        tokens = [x.episode.generated_tokens for x in scored]
        kept_tokens = sum(x.episode.generated_tokens for x in kept)
        with self.counts.lock:
            finished_mean = self.counts.finished_tokens / max(self.counts.finished, 1)
            recent, self.counts.durations = self.counts.durations, []
        durations = torch.tensor(recent or [x.duration_s for x in items])
        lag = torch.tensor(lags, dtype=torch.float32)
        trusted = [x.status == RewardStatus.OK for x in scored]
        counters = rollout_metrics(scored, self.p)
        counters |= sampling_counters(tokens, trusted, len(kept), takes)
        return counters | {
            "system/checkpoint_age_mean": float(lag.mean()),
            "system/checkpoint_age_max": float(lag.max()),
            "system/accepted_token_frac": kept_tokens / max(sum(tokens), 1),
            "system/queue_length": float(queued),
            "system/rollout_duration_mean": float(durations.mean()),
            "system/rollout_duration_p50": float(durations.quantile(0.5)),
            "system/rollout_duration_p95": float(durations.quantile(0.95)),
            "system/rollout_duration_p99": float(durations.quantile(0.99)),
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
            return {
                "finished": self.counts.finished,
                "consumed": self.consumed,
                "stale_dropped": self.stale_dropped,
                "rejected": self.rejected,
                "queued_at_end": self.queue.qsize(),
                "aborted_rounds": self.counts.aborted_rounds,
                "aborted": self.counts.aborted_rounds
                * self.prompts
                * self.p.cfg.sampling.group_size,
                "restarted": self.restarted,
                "empty_steps": self.empty_steps,
            }


class Worker(Protocol):
    """One rollout worker: rolls out prompts ``cursor .. cursor + n − 1`` on the newest
    published weights, sampling from a generator seeded with ``seed``, and returns them
    scored; raises on a fault (the round is lost)."""

    def roll(self, cursor: int, n: int, seed: int) -> list[Scored]: ...


class ThreadWorker:
    """A worker in this process, on a thread: its own HF engine (a copy of the weights), or
    its own view of the run's one vLLM engine (:class:`rlmap.engines.vllm.PinnedView`:
    its own weight version; the engine batches one worker's call at a time)."""

    def __init__(self, runner: AsyncRunner) -> None:
        p = self.p = runner.p
        self.board = runner.board
        self.engine: HFEngine | PinnedView
        if isinstance(p.engine, PinnedView):  # vLLM: the run's one engine, shared
            self.engine = PinnedView(p.engine.engine, *self.board.latest())
        else:
            self.engine = HFEngine(
                p.policy,
                pad_token_id=int(p.tokenizer.pad_token_id),
                eos_token_id=int(p.tokenizer.eos_token_id),
                dtype=DTYPES[p.cfg.system.rollout_dtype],
                own_copy=True,
            )

    def refresh(self) -> None:
        version, state = self.board.latest()
        if version != self.engine.version:
            self.engine.set_weights(state, version)

    def roll(self, cursor: int, n: int, seed: int) -> list[Scored]:
        p = self.p
        self.refresh()
        self.engine.reseed(seed)
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
    restored: dict[str, Any] | None = None,
) -> Iterator[AsyncRunner]:
    """An :class:`AsyncRunner` whose workers stop when the block ends, however it ends;
    its :meth:`AsyncRunner.close` balance is written into ``report``. ``workers_of`` makes
    the workers: threads here (default), Ray actors (:mod:`rlmap.system.ray_workers`);
    ``restored``: a checkpoint's :meth:`AsyncRunner.snapshot` to go on from."""
    runner = AsyncRunner(p, state, workers_of, restored)
    try:
        yield runner
    finally:
        balance = runner.close()
        if report is not None:
            report.update(balance)
