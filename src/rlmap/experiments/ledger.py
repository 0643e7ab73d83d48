"""The budget ledger: what a run spent, counted the same way for every recipe.

Two runs are compared fairly only at equal budget, and "budget" has many units
(generated tokens, prompts, optimizer steps, wall-clock). The ledger records all
of them, plus the settings that change what one step means (epochs per batch,
effective batch, the reduction and its denominator, engine and precision), so
``rlmap compare`` can line runs up on any axis and say when they are not alike.

Compute is charged to who spent it, as the map's fairness rules ask: sampling
(``rollout_s``), and on the learner the actor (π_old forward pass and policy
updates), the critic (value forward pass and critic updates) and the reference
(π_ref forward pass), each in seconds. A critic recipe that wins at equal
policy steps may have paid for it in critic compute; :meth:`Ledger.compute_share`
says how much. Seconds, not FLOPs: they are what a run actually costs on the
machine it ran on, and they need no model-size bookkeeping (compare shares only
between runs on the same hardware).

Design: an immutable value. ``add`` and ``with_peak_memory`` return a new
ledger; the trainer rebinds (``ledger = ledger.add(...)``). Nothing can change a
ledger behind the trainer's back (one stored in a checkpoint's ``extra``, or in a
metrics record, stays what it was), and a resume restores it exactly with
``Ledger.from_dict``. Copying a dozen fields once per step costs nothing.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ledger:
    """The budget of one run (``ledger.json``); counters grow, settings are fixed."""

    generated_tokens: int = 0
    """Response tokens sampled, including those of filtered and rejected rollouts."""
    prompts: int = 0
    """Prompts sampled, each counted once however many samples it received."""
    rollouts: int = 0
    """Trajectories sampled (prompts × samples per prompt, plus any refills)."""
    learner_steps: int = 0
    """Policy optimizer steps taken (every ``optimizer.step()``, across all epochs)."""
    critic_steps: int = 0
    """Value-critic optimizer steps taken (0 without a critic; ledgers written before the
    critic existed have no such field and read as 0)."""
    filtered_rollouts: int = 0
    """Trajectories sampled and then dropped by the sampling axis (e.g. uniform groups)."""
    rejected_rollouts: int = 0
    """Trajectories excluded by ``reward_status != ok`` or a behaviour gate."""
    infra_error_rollouts: int = 0
    """Of those, trajectories whose reward infrastructure failed (verifier crash, environment
    failure): excluded, never scored 0."""
    timeout_rollouts: int = 0
    """Of those, trajectories whose verifier outlived ``feedback.timeout_s``."""
    aborted_rollouts: int = 0
    """Asynchronous runs: trajectories whose rollout round failed (an engine, environment or
    worker fault); they produced nothing to consume."""
    queued_at_end: int = 0
    """Asynchronous runs: trajectories finished but still queued when the run ended. With
    them the asynchronous ledger balances: finished = rollouts + queued_at_end, where
    rollouts = consumed + filtered (stale) + rejected."""
    restarted_rollouts: int = 0
    """Asynchronous runs resumed from a checkpoint: trajectories that were in flight when it
    was written; rolled out again from their prompts (their tokens so far are lost)."""
    empty_steps: int = 0
    """Learner steps with nothing to train on (every trajectory's reward failed or was
    excluded): logged as ``system/empty_step``, no optimiser step; ``rlmap diagnose`` flags
    them."""
    skipped_prompts: int = 0
    """Prompts the data order reached and rebalancing skipped (``sampling.rebalance``: stale
    ones, all correct or all wrong for several visits); never rolled out, no tokens spent."""
    judge_calls: int = 0
    """Requests sent to an AI judge (``feedback.source=judge`` or ``comparison``), retries
    included, cache hits not."""
    judge_tokens: int = 0
    """Prompt plus completion tokens the judge reported for them (its ``usage``)."""
    comparison_pairs: int = 0
    """Pairwise verdicts asked for (``feedback.comparison_pairs`` per group, and the
    position check's second orders)."""
    wall_clock_s: float = 0.0
    """Seconds spent running, summed over resumes (time while stopped is not counted)."""
    rollout_s: float = 0.0
    """Seconds sampling: engine generation, scoring and the sampling axis's filtering."""
    actor_s: float = 0.0
    """Learner seconds spent on the policy: π_old forward pass and policy updates."""
    critic_s: float = 0.0
    """Learner seconds spent on the value critic: V_old forward pass and critic updates."""
    reference_s: float = 0.0
    """Learner seconds spent on the reference policy: the π_ref forward pass."""
    peak_host_memory_kib: int = 0
    """Peak resident memory of the process, KiB (``ru_maxrss``); max over resumes."""
    peak_gpu_memory_bytes: int | None = None
    """Peak ``torch.cuda.max_memory_allocated`` on the learner's device outside the rollout
    (π_old, π_ref, values, updates, weight sync), bytes; None when no GPU was used."""
    peak_rollout_gpu_memory_bytes: int | None = None
    """The same peak during the synchronous loop's rollout (an HF engine on the learner's
    GPU), bytes; None when no GPU was used or the rollout overlaps learning (async)."""
    epochs_per_batch: int = 1
    """Passes over each batch of rollouts (PPO epochs)."""
    effective_batch: int = 0
    """Trajectories behind one optimizer step (after gradient accumulation)."""
    reduction: str = ""
    """Name of the loss reduction (e.g. ``global_token_mean``)."""
    denominator: str = ""
    """What that reduction divides by, pinned (e.g. ``fixed: 4096 tokens``)."""
    engine: str = ""
    """Rollout engine (e.g. ``hf-cpu``, ``vllm``)."""
    engine_sleep: int = 0
    """The level vLLM slept at while the learner stepped (``system.engine_sleep`` resolved);
    0: it stayed resident."""
    precision: str = ""
    """Learner / rollout precision (e.g. ``fp32``, ``bf16/bf16``)."""
    device: str = ""
    """The learner's device (``system.device`` resolved: ``cpu``, ``cuda:0``)."""
    device_name: str = ""
    """Its name (``cpu``, ``NVIDIA H200``)."""
    cuda: str | None = None
    """The CUDA version torch was built with, on a GPU; None on the CPU."""
    fp32_matmul: str = ""
    """``torch.get_float32_matmul_precision()``: ``highest`` is full float32 (no TF32)."""
    deterministic_kernels: bool = False
    """Whether PyTorch's deterministic algorithms were on (``system.deterministic_kernels``)."""

    base_model: str = ""
    """``model.path`` the policy started from (``embedded:tiny`` or a directory)."""
    base_fingerprint: str = ""
    """Content hash of the start checkpoint (:mod:`rlmap.experiments.fingerprint`)."""
    tokenizer_fingerprint: str = ""
    """Hash of the tokenizer's vocabulary, special tokens and chat template."""
    data_fingerprint: str = ""
    """Hash of the training prompts and the held-out set."""
    verifier: str = ""
    """The verifier that scored training rollouts."""
    eval_verifier: str = ""
    """The verifier that scored the held-out set (``feedback.eval_verifier`` or ``verifier``)."""
    task: str = ""
    """``data.task``: the built-in task or the data file."""

    def add(
        self,
        *,
        generated_tokens: int = 0,
        prompts: int = 0,
        rollouts: int = 0,
        learner_steps: int = 0,
        critic_steps: int = 0,
        filtered_rollouts: int = 0,
        rejected_rollouts: int = 0,
        infra_error_rollouts: int = 0,
        timeout_rollouts: int = 0,
        empty_steps: int = 0,
        skipped_prompts: int = 0,
        judge_calls: int = 0,
        judge_tokens: int = 0,
        comparison_pairs: int = 0,
        wall_clock_s: float = 0.0,
        rollout_s: float = 0.0,
        actor_s: float = 0.0,
        critic_s: float = 0.0,
        reference_s: float = 0.0,
    ) -> Ledger:
        """A new ledger with these amounts added to the counters (all must be >= 0)."""
        deltas = {
            "generated_tokens": generated_tokens,
            "prompts": prompts,
            "rollouts": rollouts,
            "learner_steps": learner_steps,
            "critic_steps": critic_steps,
            "filtered_rollouts": filtered_rollouts,
            "rejected_rollouts": rejected_rollouts,
            "infra_error_rollouts": infra_error_rollouts,
            "timeout_rollouts": timeout_rollouts,
            "empty_steps": empty_steps,
            "skipped_prompts": skipped_prompts,
            "judge_calls": judge_calls,
            "judge_tokens": judge_tokens,
            "comparison_pairs": comparison_pairs,
            "wall_clock_s": wall_clock_s,
            "rollout_s": rollout_s,
            "actor_s": actor_s,
            "critic_s": critic_s,
            "reference_s": reference_s,
        }
        negative = sorted(name for name, value in deltas.items() if value < 0)
        if negative:
            raise ValueError(f"ledger.add: counters only grow; negative {negative}")
        return dataclasses.replace(
            self, **{name: getattr(self, name) + value for name, value in deltas.items()}
        )

    def with_peak_memory(
        self, host_kib: int, gpu_bytes: int | None, rollout_gpu_bytes: int | None = None
    ) -> Ledger:
        """A new ledger whose peaks are the max of the recorded ones and these."""
        return dataclasses.replace(
            self,
            peak_host_memory_kib=max(self.peak_host_memory_kib, host_kib),
            peak_gpu_memory_bytes=_max(self.peak_gpu_memory_bytes, gpu_bytes),
            peak_rollout_gpu_memory_bytes=_max(
                self.peak_rollout_gpu_memory_bytes, rollout_gpu_bytes
            ),
        )

    def metrics(self) -> dict[str, float]:
        """The cumulative ``budget/*`` metrics logged with every step."""
        return {
            "budget/generated_tokens": float(self.generated_tokens),
            "budget/prompts": float(self.prompts),
            "budget/learner_steps": float(self.learner_steps),
            "budget/critic_steps": float(self.critic_steps),
            "budget/empty_steps": float(self.empty_steps),
            "budget/skipped_prompts": float(self.skipped_prompts),
            "budget/judge_calls": float(self.judge_calls),
            "budget/judge_tokens": float(self.judge_tokens),
            "budget/comparison_pairs": float(self.comparison_pairs),
            "budget/wall_clock_s": float(self.wall_clock_s),
            "budget/rollout_s": float(self.rollout_s),
            "budget/actor_s": float(self.actor_s),
            "budget/critic_s": float(self.critic_s),
            "budget/reference_s": float(self.reference_s),
        }

    @property
    def learner_s(self) -> float:
        """Learner compute, seconds: actor + critic + reference."""
        return self.actor_s + self.critic_s + self.reference_s

    def compute_share(self) -> dict[str, Any]:
        """Who spent the compute (``summary.json``'s ``compute_share``).

        ``actor``, ``critic``, ``reference``: each one's fraction of the learner
        compute (``x_s / learner_s``; they sum to 1). ``rollout_of_total``: sampling's
        fraction of sampling + learner compute. ``seconds``: the four counters. A
        fraction whose denominator is 0 (no step yet, or a ledger written before
        these fields) is 0.0 rather than a division by zero; then the three learner
        shares sum to 0, which says "nothing recorded".
        """
        learner, total = self.learner_s, self.learner_s + self.rollout_s
        seconds = {
            "rollout": self.rollout_s,
            "actor": self.actor_s,
            "critic": self.critic_s,
            "reference": self.reference_s,
        }
        return {
            "actor": _fraction(self.actor_s, learner),
            "critic": _fraction(self.critic_s, learner),
            "reference": _fraction(self.reference_s, learner),
            "rollout_of_total": _fraction(self.rollout_s, total),
            "seconds": seconds,
        }

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain JSON data (what ``ledger.json`` holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ledger:
        """The ledger ``to_dict`` wrote; unknown keys raise ValueError, absent ones default."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ledger: unknown fields {unknown}; known: {sorted(known)}")
        return cls(**data)


def _max(recorded: int | None, new: int | None) -> int | None:
    """The larger of two peaks, None (not measured) counting as none."""
    if new is None or recorded is None:
        return recorded if new is None else new
    return max(recorded, new)


def _fraction(part: float, whole: float) -> float:
    """part / whole, and 0.0 when whole is 0 (nothing was spent, so nobody has a share)."""
    return part / whole if whole > 0 else 0.0


def measure_peak_memory(device: Any = None) -> tuple[int, int | None]:
    """(peak resident KiB of this process, peak bytes allocated on the learner's CUDA
    ``device``, or None when the learner is not on a GPU — a vLLM engine's reservation on a
    GPU beside a CPU learner is not the learner's)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    host_kib = rss // 1024 if sys.platform == "darwin" else rss  # macOS reports bytes
    gpu_bytes = None
    if device is not None and device.type == "cuda":
        import torch

        gpu_bytes = int(torch.cuda.max_memory_allocated(device))
    return int(host_kib), gpu_bytes


def reset_peak_memory(device: Any = None) -> None:
    """Start a new CUDA peak on the learner's ``device`` (``reset_peak_memory_stats``), so
    that the next :func:`measure_peak_memory` reports the peak since now; nothing when the
    learner is not on a GPU (the call would start a CUDA context). The host's peak resident
    set cannot be reset: ``ru_maxrss`` is the process's peak since it started."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(host_kib: int, gpu_bytes: int | None) -> float:
    """``system/peak_memory_mb``, MiB: the CUDA peak when the process allocated CUDA memory
    (since :func:`reset_peak_memory`: the step's), else the host's peak resident set (the
    process's since it started, so it never falls)."""
    if gpu_bytes:
        return gpu_bytes / 2**20
    return host_kib / 2**10
