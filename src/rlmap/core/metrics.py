# ruff: noqa: E501  (the table below: one metric a line, its meaning in full)
"""Every metric a run writes to ``metrics.jsonl``, declared once: name, kind, unit, reduction
and meaning. ``docs/metrics.md`` is generated from this table (``python -m rlmap.core.metrics``),
a test fails when a run emits a name the table lacks, and ``compare``/``diagnose`` read an old
run's rows through :func:`upgrade_row` (the old names, :data:`RENAMED`).

A name is exact (``loss/policy``) or a pattern: ``{word}`` stands for one path segment
(``eval/{task}/pass@1``), ``{a|b}`` for one of the listed words (``{env|eval}/turns``).

Kinds, and how a figure is read across steps:

- ``fraction``: a share in [0, 1] (averaged across steps);
- ``gauge``: a measured value in ``unit`` (averaged across steps);
- ``count``: how many, this step (summed across steps);
- ``timer``: seconds spent this step (summed across steps);
- ``rate``: an amount per second (averaged across steps);
- ``flag``: 0 or 1 (its mean across steps is the share of steps);
- ``total``: cumulative since the run began (the last step's is the run's);
- ``index``: the step number.

``reduction`` says how the step's figure is formed from its parts: ``mean`` / ``std`` /
``max`` / ``p50`` / ``p95`` / ``p99`` over the items named in the meaning (tokens,
trajectories, optimiser steps), ``sum`` over them, ``ratio`` of two sums, ``value`` (one number:
a setting or a single measurement) or ``cumulative``. With several learner ranks every learner
figure is global (all ranks' tokens), and rollout figures are rank 0's gather of every rank's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

KINDS = ("fraction", "gauge", "count", "timer", "rate", "flag", "total", "index")
REDUCTIONS = ("mean", "std", "max", "p50", "p95", "p99", "sum", "ratio", "value", "cumulative")


@dataclass(frozen=True)
class Metric:
    """One metric (or one family, when ``name`` is a pattern)."""

    name: str
    """The name as written to ``metrics.jsonl``, or a pattern (module docstring)."""
    kind: str
    """One of :data:`KINDS`."""
    unit: str
    """``1`` for fractions and flags; else what one unit is (``s``, ``tokens``, ``nats`` …)."""
    reduction: str
    """One of :data:`REDUCTIONS`: how the step's figure is formed from its parts."""
    meaning: str
    """What it measures, in one or two sentences; when it is logged, if not always."""
    modes: str = "sync, async"
    """The loops that emit it: ``sync``, ``async`` or both (the meaning is the same in both)."""


def _m(name: str, kind: str, unit: str, reduction: str, meaning: str, modes: str = "") -> Metric:
    return Metric(name, kind, unit, reduction, meaning, modes or "sync, async")


F, G, C, T, R = "fraction", "gauge", "count", "timer", "rate"
TRAJ = "over every trajectory generated this step (kept or not)"

# fmt: off
METRICS: tuple[Metric, ...] = (
    _m("step", "index", "step", "value", "The learner step the row belongs to (0-based)."),
    # --- reward/*, errors/*, length/*, env/* : the step's rollouts ------------------------
    _m("reward/mean", G, "reward", "mean", "Trained (shaped) reward over the trajectories whose reward can be trusted (status OK, not aborted)."),
    _m("reward/std", G, "reward", "std", "Spread of the trained reward over the same trajectories (0 with one)."),
    _m("reward/outcome_mean", G, "reward", "mean", "The verifier's outcome before shaping, over the same trajectories."),
    _m("reward/verifier_mean", G, "reward", "mean", "With a learned reward or a judge: the task verifier's outcome over the same trajectories."),
    _m("errors/{class}_frac", F, "1", "mean", "Share of the step's rollouts failing with each error class (infra_error, timeout, unparseable, truncated, tool_error, format_miss, wrong_answer; the first that applies); the one name of each failure (e.g. errors/infra_error_frac), " + TRAJ + "."),
    _m("length/mean", G, "tokens", "mean", "Generated (action) tokens per episode, all turns, " + TRAJ + "."),
    _m("length/p95", G, "tokens", "p95", "95th percentile of the same."),
    _m("length/truncated_frac", F, "1", "mean", "Share of episodes cut by the length limit (no EOS)."),
    _m("{env|eval}/turns", G, "turns", "mean", "Multi-turn tasks: policy turns per episode (env/: training rollouts; eval/: held-out); compaction summaries count as turns, and under sampling.group_scope=branch a row's own turns only (not the replayed ones)."),
    _m("{env|eval}/tool_call_rate", F, "1", "mean", "Multi-turn tasks: share of episodes with a tool call."),
    _m("{env|eval}/tool_calls", G, "calls", "mean", "Multi-turn tasks: tool calls per episode."),
    _m("{env|eval}/tool_error_frac", F, "1", "ratio", "Multi-turn tasks: share of tool calls that failed."),
    _m("{env|eval}/turn_budget_frac", F, "1", "mean", "Multi-turn tasks: share of episodes truncated by the turn budget."),
    _m("{env|eval}/aborted_frac", F, "1", "mean", "Multi-turn tasks: share of episodes aborted by an environment failure."),
    _m("{env|eval}/segments", G, "rows", "mean", "data.context_policy=truncate_oldest|compact: training rows (segments) per episode; 1 for an episode whose context never filled."),
    _m("{env|eval}/summary_tokens", G, "tokens", "mean", "data.context_policy=compact: tokens per episode the policy wrote in its compaction summaries (actions, trained on; 0 for an episode whose context never filled)."),
    _m("{env|eval}/context_dropped_tokens", G, "tokens", "mean", "data.context_policy=truncate_oldest|compact: tokens per episode left out of the next segment's context at its boundaries (the oldest whole turns, or all but the summary and the newest observation)."),
    # --- eval/* : held-out evaluation (rows of eval steps) ---------------------------------
    _m("eval/pass@1", F, "1", "mean", "Held-out pass@1 (unbiased estimator over eval/k samples per prompt)."),
    _m("eval/pass@k", F, "1", "mean", "Held-out pass@k with k = eval/k."),
    _m("eval/k", G, "samples", "value", "Samples per held-out prompt (the k of eval/pass@k)."),
    _m("eval/length", G, "tokens", "mean", "Generated tokens per held-out sample."),
    _m("eval/diversity", G, "answers", "mean", "Distinct final answers per held-out prompt."),
    _m("eval/train_verifier_pass@1", F, "1", "mean", "With feedback.eval_verifier: pass@1 under the training verifier."),
    _m("eval/errors/{class}_frac", F, "1", "mean", "Share of held-out samples failing with each error class; with eval/pass@1 they sum to 1."),
    _m("eval/{task}/pass@1", F, "1", "mean", "Reasoning-gym composites: pass@1 on each task's own held-out items."),
    _m("eval/{task}/pass@k", F, "1", "mean", "Reasoning-gym composites: pass@k on each task's own held-out items."),
    _m("eval/judge/{calls|prompt_tokens|completion_tokens}", C, "calls or tokens", "sum", "A pointwise judge rating the held-out samples: its requests and tokens."),
    _m("eval/judge/mean", G, "score", "mean", "A pointwise judge's mean score of the held-out samples."),
    # --- sampling/* : what the step generated and kept (rlmap.sampling.filters) -----------
    _m("sampling/rounds", C, "rounds", "sum", "Times the step went back for trajectories: synchronous, rollout rounds until the group filter kept enough groups (≤ sampling.max_rounds); asynchronous, takes from the queue until the batch held B fresh trajectories (1 + refills for the stale dropped)."),
    _m("sampling/generated", C, "trajectories", "sum", "Trajectories generated (synchronous) or taken from the queue (asynchronous) this step, kept or not."),
    _m("sampling/generated_tokens", C, "tokens", "sum", "Tokens the engine generated for those trajectories: their action tokens, and under sampling.group_scope=branch each row's share of its root's (Episode.spent)."),
    _m("sampling/kept", C, "trajectories", "sum", "Trajectories trained on: valid, through the group filter, fresh enough."),
    _m("sampling/kept_frac", F, "1", "ratio", "sampling/kept / sampling/generated."),
    _m("sampling/rejected", C, "trajectories", "sum", "Generated trajectories whose reward cannot be trusted (status not OK: invalid, infra error, timeout); their split is errors/*."),
    _m("sampling/skipped", C, "prompts", "sum", "With sampling.rebalance: stale prompts the data order skipped."),
    _m("sampling/revisits", C, "prompts", "sum", "With sampling.rebalance: queued prompts drawn again."),
    _m("sampling/stale_prompts", C, "prompts", "value", "With sampling.rebalance: prompts seen often enough to be skipped with probability."),
    _m("curriculum/level", G, "level", "value", "With sampling.curriculum: the level of the step's prompts.", "sync"),
    _m("curriculum/move", G, "levels", "value", "With sampling.curriculum: -1, 0 or 1, the level's move after this step.", "sync"),
    _m("curriculum/pass_rate", F, "1", "mean", "With sampling.curriculum: the window's pass rate before the move.", "sync"),
    _m("curriculum/{setting}", G, "setting", "value", "With sampling.curriculum: each generator setting at the level (max_terms, …).", "sync"),
    # --- adv/*, group/*, loss/*, optim/*, entropy, kl/* : the learner ----------------------
    _m("adv/mean", G, "advantage", "mean", "Advantage over action tokens."),
    _m("adv/std", G, "advantage", "std", "Advantage spread over action tokens."),
    _m("group/all_correct_frac", F, "1", "mean", "Group estimators: share of groups whose every member is correct."),
    _m("group/all_wrong_frac", F, "1", "mean", "Group estimators: share of groups whose every member is wrong."),
    _m("group/zero_adv_frac", F, "1", "mean", "Group estimators: share of groups whose returns are all equal (no signal)."),
    _m("group/anchor_groups", C, "groups", "sum", "sampling.group_scope=turn: anchor states shared by two or more turns."),
    _m("group/anchor_turn_frac", F, "1", "ratio", "sampling.group_scope=turn: share of turns in an anchor group."),
    _m("group/anchor_zero_adv_frac", F, "1", "mean", "sampling.group_scope=turn: share of anchor groups whose returns are all equal."),
    _m("loss/policy", G, "loss", "mean", "The policy objective's reduced loss, mean over optimiser steps."),
    _m("loss/total", G, "loss", "mean", "Everything optimised (policy + NLL), mean over optimiser steps."),
    _m("loss/nll", G, "nats", "mean", "With behaviour.positive_nll: the positive samples' NLL, mean over optimiser steps."),
    _m("optim/grad_norm", G, "norm", "mean", "Policy gradient norm before clipping, mean over optimiser steps."),
    _m("optim/lr", G, "lr", "mean", "Policy learning rate, mean over optimiser steps."),
    _m("optim/policy_steps", C, "steps", "sum", "Policy optimiser steps this step."),
    _m("optim/critic_steps", C, "steps", "sum", "Critic optimiser steps this step."),
    _m("entropy", G, "nats", "mean", "Token entropy of π_θ over every action token of every update."),
    _m("approx_kl", G, "nats", "mean", "k3 estimate of KL(π_old ‖ π_θ): mean over every action token of every update of (r − 1) − log r, r = π_θ/π_old at the micro-batch's forward pass (docs/formulas.md §6.1). Decoupled mode: 0 when each batch gets one optimiser step and π_old is not a pass of its own. Bypass mode (π_old := μ_old): k3 of KL(μ_old ‖ π_θ), non-zero from the first step (engine–learner mismatch and staleness). rlmap's |log ρ| tails (ratio/rho/*) say more about the tails; this is the figure other trainers log."),
    _m("kl/mean", G, "nats", "mean", "KL to π_ref over action tokens: in the loss its estimator's, in the reward k1 = log π_old − log π_ref."),
    _m("kl/beta", G, "coefficient", "value", "The step's KL coefficient β (fixed, or the adaptive controller's with kl.target)."),
    # --- ratio/* : importance ratios (docs/formulas.md §1) ---------------------------------
    _m("ratio/{rho|kappa|d}/mean_abs_log", G, "nats", "mean", "|log x| over every action token of every update (ρ = π_θ/π_old, κ = π_old/μ, d = π_θ/μ); ρ and κ in decoupled mode only."),
    _m("ratio/{rho|kappa|d}/p99_abs_log", G, "nats", "p99", "99th percentile of |log x| over the same tokens."),
    _m("ratio/{rho|kappa|d}/max_abs_log", G, "nats", "max", "Largest |log x| over the same tokens."),
    _m("ratio/rho/clipped_frac", F, "1", "mean", "Share of action tokens where PPO's clip removes the gradient (either side); in bypass mode it measures d."),
    _m("ratio/rho/clipped_{high|low}_frac", F, "1", "mean", "The same, upper or lower side only."),
    _m("ratio/rho/dual_clipped_frac", F, "1", "mean", "Dual-clip PPO: share of tokens under the dual clip."),
    _m("ratio/{kappa|d}/masked_frac", F, "1", "mean", "Token-level masking corrections (IcePop …): share of action tokens masked."),
    _m("ratio/{kappa|d}/seq_masked_frac", F, "1", "mean", "Sequence-level masking (OPSM on d, masked_is on κ): share of trajectories dropped."),
    _m("ratio/kappa/capped_frac", F, "1", "mean", "Truncated IS: share of action tokens whose κ weight hit the cap."),
    _m("ratio/kappa/decoupled_capped_frac", F, "1", "mean", "Decoupled truncated IS: share of action tokens capped."),
    _m("ratio/kappa/m2", G, "nats²", "mean", "M2PO's second moment: mean (log κ)²."),
    _m("ratio/kappa/m2po_masked_frac", F, "1", "mean", "M2PO: share of action tokens dropped."),
    _m("moe/route_mismatch_frac", F, "1", "ratio", "Mixture-of-experts policies: share of (token, layer) pairs whose top-k experts under the learner's routing differ from the rollout's."),
    _m("sampling_set/mean_size", G, "ids", "mean", "behaviour.replay_sampling_set: ids per recorded top-p kept set."),
    _m("sampling_set/overflow_frac", F, "1", "mean", "behaviour.replay_sampling_set: share of action tokens whose set exceeded the cap."),
    # --- critic/* ---------------------------------------------------------------------------
    _m("critic/explained_variance", G, "1", "value", "1 − Var(return − V)/Var(return) of the values before this step's update."),
    _m("critic/value_error_{first|last}", G, "return", "mean", "Mean |V − return| at each trajectory's first / last action token."),
    _m("critic/segment_value_gap", G, "return", "mean", "Segmented episodes (data.context_policy=truncate_oldest|compact) with a critic: the state-sufficiency gap, mean over the step's segment boundaries of |V(s_0^{k+1}) − V(s_final^k)|, the critic's value at the next segment's first action token against its value at the closing segment's last token (docs/formulas.md §2.5); logged on steps with a boundary."),
    _m("critic/segment_value_gap_signed", G, "return", "mean", "The same gap's mean with its sign: below 0, the critic values the state lower from the next segment's context than from the closing one."),
    _m("critic/value_loss", G, "loss", "mean", "Critic loss, mean over its optimiser steps."),
    _m("critic/grad_norm", G, "norm", "mean", "Critic gradient norm before clipping, mean over its optimiser steps."),
    _m("critic/lr", G, "lr", "mean", "Critic learning rate, mean over its optimiser steps."),
    _m("critic/pretraining", "flag", "1", "value", "1 on critic-only warm-up steps (the policy did not move)."),
    # --- system/* : time, throughput, memory (the same meaning in both loops) --------------
    _m("system/learner_wait_s", T, "s", "value", "Seconds the learner waited for its batch: synchronous, the whole rollout (it waits behind the barrier); asynchronous, the wait on the queue."),
    _m("system/rollout_s", T, "s", "value", "Seconds generating and scoring the step's rollouts (equals system/learner_wait_s there). Synchronous only: asynchronous rollouts overlap the learner; see system/rollout_duration_*.", "sync"),
    _m("system/update_s", T, "s", "value", "Seconds of the step after its batch was in: π_old/π_ref passes, critic, policy update, the weights published. Step wall time = learner_wait_s + update_s."),
    _m("system/learner_utilisation", F, "1", "ratio", "update_s / (learner_wait_s + update_s): the share of the step the learner computed."),
    _m("system/tokens_per_s", R, "tokens/s", "ratio", "sampling/generated_tokens per second of the whole step (learner_wait_s + update_s): end-to-end throughput."),
    _m("system/rollout_tokens_per_s", R, "tokens/s", "ratio", "sampling/generated_tokens per second of system/rollout_s: generation throughput.", "sync"),
    _m("system/{old_logprobs|reference|critic_values|critic_update|policy_update}_s", T, "s", "value", "Parts of update_s, each logged on steps where it ran: π_old pass, π_ref pass, critic values, critic update, policy update."),
    _m("system/update_tokens_per_s", R, "tokens/s", "ratio", "Tokens (prompt and response, times the epochs) through the policy's forward and backward passes per second of policy_update_s."),
    _m("system/weight_sync_s", T, "s", "value", "Seconds to get the new weights to the rollout side: the learner's engine, and asynchronous, the board's snapshot for the workers."),
    _m("system/mfu", F, "1", "ratio", "GPU: the policy update's model FLOPs utilisation."),
    _m("system/peak_memory_mb", G, "MB", "max", "GPU: the step's peak allocated outside the rollout; CPU: the process's peak resident set so far."),
    _m("system/rollout_peak_memory_mb", G, "MB", "max", "GPU: the rollout's peak allocated.", "sync"),
    _m("system/empty_step", "flag", "1", "value", "1 when the step had nothing to train on."),
    _m("system/group_idle_frac", F, "1", "ratio", "Generation slots idle behind the group barrier: 1 − mean/max generated tokens.", "sync"),
    _m("system/stale_frac", F, "1", "mean", "Trajectories older than behaviour.max_staleness versions (correction axis: the staleness check)."),
    _m("system/max_version_lag", G, "versions", "max", "Largest policy-version lag of the batch's tokens (correction axis)."),
    _m("system/stale_dropped", C, "trajectories", "sum", "Trajectories taken from the queue but dropped as too stale.", "async"),
    _m("system/checkpoint_age_{mean|max}", G, "versions", "mean", "Versions between the learner and the weights that generated each taken trajectory (mean / max).", "async"),
    _m("system/accepted_token_frac", F, "1", "ratio", "Kept tokens / taken tokens.", "async"),
    _m("system/queue_length", G, "trajectories", "value", "Finished trajectories waiting when the step began.", "async"),
    _m("system/rollout_duration_{mean|p50|p95|p99}", G, "s", "mean", "Seconds each trajectory's rollout round took (finished since the last step).", "async"),
    _m("system/consumed_length_mean", G, "tokens", "mean", "Generated tokens per taken trajectory (as sampling/generated_tokens counts them).", "async"),
    _m("system/finished_length_mean", G, "tokens", "mean", "Action tokens per finished trajectory since the start (the queue's view, against length bias).", "async"),
    # --- judge/* : AI judges ------------------------------------------------------------------
    _m("judge/{calls|cache_hits|failed|invalid|prompt_tokens|completion_tokens|pairs}", C, "calls or tokens", "sum", "AI judges: requests, cache hits, failures, unparseable verdicts, tokens and pairs since the last step (rank 0's)."),
    _m("judge/{position_agreement|first_preferred_frac|self_consistency}", F, "1", "mean", "AI judges: the probes of docs/judges.md, logged when observed."),
    _m("judge/length_corr", G, "correlation", "value", "AI judges: correlation of score with length at equal verifier outcome."),
    _m("judge/heldout_{metric}_accuracy", F, "1", "mean", "Judge-model training: held-out accuracy after training."),
    _m("judge/heldout_{metric}_accuracy_before", F, "1", "mean", "Judge-model training: held-out accuracy before training."),
    # --- budget/* : the run's ledger (cumulative) ---------------------------------------------
    _m("budget/{generated_tokens|prompts|learner_steps|critic_steps|empty_steps|skipped_prompts|judge_calls|judge_tokens|comparison_pairs}", "total", "tokens, prompts, steps or calls", "cumulative", "The run's spending so far (docs/runs.md)."),
    _m("budget/{wall_clock_s|rollout_s|actor_s|critic_s|reference_s}", "total", "s", "cumulative", "The run's seconds so far: wall clock, rollout, actor, critic, reference."),
)
# fmt: on

RENAMED: dict[str, str] = {
    "reward/infra_error_frac": "errors/infra_error_frac",
    "reward/timeout_frac": "errors/timeout_frac",
    "reward/invalid_frac": "errors/unparseable_frac",
}
"""Old names with the same meaning under a new one (the old run's value is copied)."""

DROPPED: dict[str, str] = {
    "sampling/infra_errors": "errors/infra_error_frac × sampling/generated",
    "sampling/timeouts": "errors/timeout_frac × sampling/generated",
}
"""Old counts now derived from a fraction (:func:`upgrade_row` derives the fraction)."""


def _regex(name: str) -> str:
    """A name pattern as a regular expression (module docstring)."""
    out, pos = [], 0
    for m in re.finditer(r"\{([^{}]+)\}", name):
        out.append(re.escape(name[pos : m.start()]))
        words = m.group(1).split("|")
        out.append(f"(?:{'|'.join(map(re.escape, words))})" if len(words) > 1 else r"[^/]+")
        pos = m.end()
    return "".join(out) + re.escape(name[pos:])


@cache
def _compiled(names: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{_regex(n)})" for n in names))


def lookup(name: str, metrics: tuple[Metric, ...] = METRICS) -> Metric | None:
    """The entry declaring ``name`` (an exact entry before a pattern), or None."""
    exact = [m for m in metrics if m.name == name]
    if exact:
        return exact[0]
    return next((m for m in metrics if re.fullmatch(_regex(m.name), name)), None)


def unregistered(names: Iterable[str], metrics: tuple[Metric, ...] = METRICS) -> list[str]:
    """The names no entry declares, sorted (what the "every emitted name is declared" test
    reports)."""
    known = _compiled(tuple(m.name for m in metrics))
    return sorted({n for n in names if known.fullmatch(n) is None})


def upgrade_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An old run's ``metrics.jsonl`` row under today's names, for ``compare``/``diagnose``.

    - :data:`RENAMED` names move to the new one (the new one wins when both are there);
    - ``sampling/infra_errors`` / ``sampling/timeouts`` (counts) become the fractions
      ``errors/infra_error_frac`` / ``errors/timeout_frac`` when those are missing;
    - an old synchronous row (``system/rollout_s`` without ``system/learner_wait_s``) gets
      ``system/learner_wait_s`` = ``rollout_s``, ``system/rollout_tokens_per_s`` = its old
      ``tokens_per_s`` (generated tokens per rollout second), and ``system/tokens_per_s``
      recomputed per second of the whole step (rollout_s + update_s);
    - an old asynchronous row (``system/rollout_s`` beside ``system/queue_length``: there it
      was the learner's wait, which ``system/learner_wait_s`` also holds) loses ``rollout_s``.

    A row with none of these is returned unchanged (a copy).
    """
    out = dict(row)
    for old, new in RENAMED.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    generated = out.get("sampling/generated")
    for old, new in (
        ("sampling/infra_errors", "errors/infra_error_frac"),
        ("sampling/timeouts", "errors/timeout_frac"),
    ):
        count = out.pop(old, None)
        if new not in out and isinstance(count, int | float) and isinstance(generated, int | float):
            out[new] = count / generated if generated else 0.0
    return _upgrade_system(out)


def _upgrade_system(out: dict[str, Any]) -> dict[str, Any]:
    """The ``system/*`` part of :func:`upgrade_row`."""
    rollout = out.get("system/rollout_s")
    if not isinstance(rollout, int | float):
        return out
    if "system/queue_length" in out:  # old asynchronous: rollout_s was the learner's wait
        wait = out.pop("system/rollout_s")
        out.setdefault("system/learner_wait_s", wait)
        return out
    if "system/learner_wait_s" in out:  # already today's synchronous row
        return out
    out["system/learner_wait_s"] = rollout
    old_rate, tokens = out.get("system/tokens_per_s"), out.get("sampling/generated_tokens")
    update = out.get("system/update_s")
    if isinstance(old_rate, int | float):
        out["system/rollout_tokens_per_s"] = old_rate
    if isinstance(tokens, int | float) and isinstance(update, int | float):
        out["system/tokens_per_s"] = tokens / max(rollout + update, 1e-9)
        out.setdefault("system/learner_utilisation", update / max(rollout + update, 1e-9))
    else:  # the old per-rollout-second rate must not pass for today's whole-step one
        out.pop("system/tokens_per_s", None)
    return out


def markdown(metrics: tuple[Metric, ...] = METRICS) -> str:
    """``docs/metrics.md``: the table, grouped by prefix, with the renames."""
    lines = [
        "# Metrics",
        "",
        "Generated from `src/rlmap/core/metrics.py` by `python -m rlmap.core.metrics > "
        "docs/metrics.md`; do not edit by hand (a test compares them).",
        "",
        "Every row of a run's `metrics.jsonl` holds only these names (a test runs the loops "
        "and checks). `{word}` stands for one path segment, `{a|b}` for one of the words.",
        "",
        "Kinds, read across steps: fraction, gauge and rate are averaged; count and timer "
        "summed; flag's mean is the share of steps; total is cumulative (the last step's is "
        "the run's). Reduction: how the step's figure is formed from its parts (tokens, "
        "trajectories, optimiser steps), over every learner rank.",
        "",
    ]
    groups: dict[str, list[Metric]] = {}
    for m in metrics:
        head = (
            m.name.split("/")[0].strip("{}").replace("|", ", ") if "/" in m.name else "(top level)"
        )
        groups.setdefault(head, []).append(m)
    for head, members in groups.items():
        lines += [
            "",
            f"## {head}",
            "",
            "| name | kind | unit | reduction | loops | meaning |",
            "|---|---|---|---|---|---|",
        ]
        lines += [_row(m) for m in members]
    lines += [
        "",
        "## Old names",
        "",
        "`rlmap compare` and `rlmap diagnose` read an older run's rows under today's names:",
        "",
        "| old | now |",
        "|---|---|",
    ]
    lines += [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]
    lines += [f"| `{old}` (count) | {new} |" for old, new in DROPPED.items()]
    lines += [
        "| `system/rollout_s` (asynchronous: the learner's wait) | `system/learner_wait_s` |",
        "| `system/tokens_per_s` (synchronous: per rollout second) | "
        "`system/rollout_tokens_per_s`; `system/tokens_per_s` is now per second of the whole "
        "step in both loops |",
        "",
        "`sampling/filtered` and `sampling/kept_groups` were documented but never logged; they "
        "are gone (`sampling/generated` − `sampling/kept` is the first).",
    ]
    return "\n".join(lines) + "\n"


def _row(m: Metric) -> str:
    """One table row; a ``|`` in a pattern or meaning escaped for Markdown."""
    name, meaning = m.name.replace("|", "\\|"), m.meaning.replace("|", "\\|")
    return f"| `{name}` | {m.kind} | {m.unit} | {m.reduction} | {m.modes} | {meaning} |"


if __name__ == "__main__":
    print(markdown(), end="")
