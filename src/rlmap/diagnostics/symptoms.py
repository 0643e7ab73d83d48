"""The map's failure symptoms as data, and the verdict types of ``rlmap diagnose``.

The map (recipe-map, "按失败现象反推接口": read a failure backwards to its
interfaces) has six rows. Each names a symptom, the interfaces to check *in
order*, and what not to touch first. They are written out here as :class:`Symptom`
values, with the metrics and settings rlmap logs for each interface, so a report
can put the run's own numbers next to each interface. The rules that decide
whether a symptom shows live in :mod:`rlmap.diagnostics.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["detected", "quiet", "not checked"]


@dataclass(frozen=True)
class Evidence:
    """One observation behind a verdict: a metric (or a setting) over some steps."""

    metric: str
    """Metric name, or ``config.yaml: <field>`` / ``ledger.json: <field>``."""
    steps: tuple[int, int] | None
    """First and last step the numbers cover (None for a setting)."""
    text: str
    """The observation in words, numbers included."""
    values: dict[str, Any] = field(default_factory=dict)
    """The numbers, by name (what ``--json`` writes)."""


@dataclass(frozen=True)
class Interface:
    """One interface the map says to check, and what rlmap logs about it."""

    name: str
    reads: tuple[str, ...] = ()
    """Metric names; ``config:<dotted.field>`` and ``ledger:<field>`` read the run's settings."""
    hint: str = ""
    """Where to look when nothing in ``reads`` was logged."""


@dataclass(frozen=True)
class Symptom:
    """A row of the map: the symptom, the interfaces to check in order, what not to touch first."""

    id: str
    title: str
    source: str
    """The map's own heading (recipe-map.zh)."""
    check: tuple[Interface, ...]
    not_first: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    """What a rule saw: detected or not, the evidence, and the steps to read interfaces over."""

    detected: bool
    evidence: tuple[Evidence, ...] = ()
    window: tuple[int, int] | None = None
    """Steps where the symptom shows (interface readings cover these); None: the whole run."""
    needs: tuple[str, ...] = ()
    """Inputs that were not logged; non-empty means the rule could not check."""


@dataclass(frozen=True)
class Check:
    """One interface to check, with what the run logged about it over the symptom's steps."""

    interface: str
    readings: tuple[Evidence, ...]
    hint: str


@dataclass(frozen=True)
class Finding:
    """The verdict of one symptom rule on one run."""

    symptom: str
    title: str
    source: str
    status: Status
    evidence: tuple[Evidence, ...]
    """Why the rule decided as it did (for ``quiet`` too: the numbers it checked)."""
    checks: tuple[Check, ...]
    """The interfaces to check, in the map's order; readings only when detected."""
    not_first: tuple[str, ...]
    needs: tuple[str, ...]
    """For ``not checked``: the inputs the rule needs."""
    window: tuple[int, int] | None = None
    """Detected: the steps where the symptom shows, when the rule names them."""


REWARD_UP_HELDOUT_DOWN = Symptom(
    id="reward_up_heldout_down",
    title="reward rises while held-out ability falls",
    source="Reward 上升，held-out 能力下降",
    check=(
        Interface(
            "verifier coverage",
            (
                "reward/outcome_mean",
                "reward/mean",
                "eval/train_verifier_pass@1",
                "config:feedback.verifier",
                "config:feedback.eval_verifier",
            ),
            "score a sample of rewarded responses with a stricter check",
        ),
        Interface(
            "reward hacking",
            ("length/mean", "eval/length", "eval/diversity"),
            "read rewarded responses that the held-out check fails",
        ),
        Interface(
            "reference drift",
            ("kl/mean", "config:kl.beta"),
            "no KL to the reference is logged: compare the policy with the reference",
        ),
        Interface(
            "contamination",
            ("config:data.eval_path", "config:data.split_seed"),
            "check the overlap between the training prompts and the held-out set",
        ),
    ),
    not_first=("the clip range: the map says not to tune clip first (不要先调 clip)",),
)

ENTROPY_COLLAPSE = Symptom(
    id="entropy_collapse",
    title="entropy collapses quickly",
    source="Entropy 快速塌缩",
    check=(
        Interface(
            "positive-advantage ratio",
            ("adv/mean",),
            "the share of tokens with A > 0 is not logged; adv/mean > 0 leans positive",
        ),
        Interface("upper clip", ("ratio/rho/clipped_high_frac", "config:behaviour.clip_high")),
        Interface(
            "sampling temperature", ("config:generation.temperature", "config:generation.top_p")
        ),
        Interface(
            "prompt difficulty", ("group/all_correct_frac", "group/all_wrong_frac", "reward/mean")
        ),
        Interface(
            "duplicate candidates", ("eval/diversity",), "count distinct responses per group"
        ),
    ),
    not_first=(
        "Clip-Higher (raising the upper clip) as the fix: the map calls it only one possible "
        "option (Clip-Higher 只是可能选项)",
    ),
)

ZERO_GROUP_LOSS = Symptom(
    id="zero_group_loss",
    title="group losses often zero",
    source="GRPO loss 经常为零",
    check=(
        Interface(
            "all-correct / all-wrong fractions",
            ("group/all_correct_frac", "group/all_wrong_frac", "sampling/kept_frac"),
        ),
        Interface("group size", ("config:sampling.group_size",)),
        Interface(
            "reward parser",
            ("reward/outcome_mean", "reward/std", "config:feedback.verifier"),
            "read responses the verifier scored 0 that look right",
        ),
        Interface(
            "sampling diversity", ("eval/diversity", "entropy", "config:generation.temperature")
        ),
    ),
    not_first=(
        "dynamic sampling (a mixed-group filter): it only selects mixed groups; it cannot fix "
        "a wrong verifier",
    ),
)

LENGTH_DRIFT = Symptom(
    id="length_drift",
    title="response length keeps drifting",
    source="Response length 持续漂移",
    check=(
        Interface("reward–length correlation", ("reward/mean", "length/mean")),
        Interface(
            "the reduction's denominator (response / token / fixed)",
            ("ledger:reduction", "ledger:denominator"),
        ),
        Interface(
            "truncation reward",
            (
                "length/truncated_frac",
                "length/p95",
                "config:feedback.overlong_cache",
                "config:generation.max_new_tokens",
            ),
        ),
        Interface(
            "EOS probability",
            ("length/truncated_frac",),
            "the EOS probability is not logged; truncated_frac counts responses without EOS",
        ),
        Interface(
            "positive NLL",
            ("loss/nll", "config:behaviour.positive_nll"),
            "loss/nll is logged only when positive NLL is on",
        ),
    ),
    not_first=("changing one of these alone: the map says to check them together (同时查)",),
)

LATE_COLLAPSE = Symptom(
    id="late_collapse",
    title="PPO stable at first, then collapses",
    source="PPO 初期稳定，随后突然崩",
    check=(
        Interface(
            "critic error",
            (
                "critic/explained_variance",
                "critic/value_error_first",
                "critic/value_error_last",
                "critic/value_loss",
            ),
            "no critic in this run",
        ),
        Interface(
            "reuse epochs", ("ledger:epochs_per_batch", "config:optim.minibatches_per_epoch")
        ),
        Interface(
            "policy staleness",
            ("system/checkpoint_age_mean", "system/checkpoint_age_max"),
            "synchronous run: the batch is at most one update stale",
        ),
        Interface(
            "train–rollout log-prob gap (κ)",
            ("ratio/kappa/mean_abs_log", "ratio/kappa/p99_abs_log", "ratio/kappa/max_abs_log"),
        ),
        Interface(
            "ratio tails",
            ("ratio/rho/p99_abs_log", "ratio/rho/max_abs_log", "ratio/rho/clipped_frac"),
        ),
        Interface(
            "a trust region on the tails (DPPO) or a second-moment mask (M2PO)",
            (
                "config:behaviour.objective",
                "config:behaviour.corrections",
                "ratio/kappa/m2",
                "ratio/kappa/m2po_masked_frac",
            ),
            "behaviour.objective=dppo_tv bounds the probability gap, corrections=[m2po] drops "
            "the tokens of largest (log κ)² over each mini-batch",
        ),
        Interface("optimiser step size", ("optim/grad_norm", "optim/lr")),
    ),
    not_first=(
        "mean KL (kl/mean) as the all-clear: it can hide a few extreme tokens (mean KL 可能掩盖"
        "少数极端 token); read the ratio tails (p99 and max |log ratio|)",
    ),
)

ASYNC_EFFICIENCY = Symptom(
    id="async_efficiency",
    title="async throughput up, sample efficiency down",
    source="异步吞吐提高，样本效率下降",
    check=(
        Interface(
            "checkpoint age",
            (
                "system/checkpoint_age_mean",
                "system/checkpoint_age_max",
                "config:behaviour.max_staleness",
            ),
        ),
        Interface(
            "direct ratio",
            (
                "ratio/d/mean_abs_log",
                "ratio/d/p99_abs_log",
                "ratio/d/max_abs_log",
                "ratio/d/masked_frac",
            ),
        ),
        Interface("accepted fraction", ("system/accepted_token_frac", "sampling/rejected")),
        Interface(
            "stale-data correction (M2PO, DPPO on μ)",
            (
                "config:behaviour.corrections",
                "config:behaviour.objective",
                "ratio/kappa/m2po_masked_frac",
            ),
            "corrections=[m2po] for stale batches; dppo_tv in bypass mode anchors the trust "
            "region on the policy that sampled",
        ),
        Interface("queue preference for short trajectories", ("length/mean", "eval/length")),
        Interface(
            "capability gain per generated token", ("eval/pass@1", "budget/generated_tokens")
        ),
    ),
    not_first=(
        "treating the throughput as free: asynchrony trades idle time for distribution shift, "
        "queue selection bias and version management (不存在“异步免费提高吞吐”); profile "
        "rollout p50/p95/p99, group idle fraction and learner utilisation first",
    ),
)

MOE_ROUTE_MISMATCH = Symptom(
    id="moe_route_mismatch",
    title="MoE train/rollout routes disagree",
    source="MoE 训推 route 不一致",
    check=(
        Interface(
            "router metadata",
            ("moe/route_mismatch_frac",),
            "only mixture-of-experts policies log it (the rollout engine records the routes)",
        ),
        Interface("routing replay (R3)", ("config:behaviour.routing_replay",)),
        Interface(
            "top-p kept-set replay",
            (
                "config:generation.top_p",
                "config:behaviour.replay_sampling_set",
                "sampling_set/mean_size",
            ),
            "with top_p < 1 the engine's μ is renormalised over the kept set: without replay "
            "κ carries −log of the set's mass (docs/mismatch.md)",
        ),
        Interface(
            "train–rollout log-prob gap (κ)",
            ("ratio/kappa/mean_abs_log", "ratio/kappa/p99_abs_log", "ratio/kappa/max_abs_log"),
        ),
        Interface("probability correction", ("config:behaviour.corrections",)),
        Interface("held-out score", ("eval/pass@1",)),
    ),
    not_first=(
        "the learning rate or the clip range: the mismatch is in the forward pass (which "
        "experts a token goes through), not in the size of the step; replayed routes change "
        "the function being trained, so judge the fix by the held-out score, not by κ alone",
    ),
)

EMPTY_STEPS = Symptom(
    id="empty_steps",
    title="learner steps with nothing to train on",
    source="（不在表中：运行完整性检查）",
    check=(
        Interface(
            "reward failures",
            ("sampling/rejected", "errors/infra_error_frac", "errors/timeout_frac"),
            "an empty step is one whose every trajectory's reward failed or was excluded",
        ),
        Interface("staleness filter", ("system/stale_dropped", "config:behaviour.max_staleness")),
        Interface("budget", ("budget/empty_steps", "budget/learner_steps")),
    ),
    not_first=(
        "the learning rate or the step count: an empty step changes no weight, so a run with "
        "them trained fewer steps than it says; fix what failed the rewards (the verifier, "
        "the environment, the judge) first",
    ),
)

JUDGE_BIAS = Symptom(
    id="judge_bias",
    title="the AI judge is biased",
    source="AI 反馈：评审偏差、一致性",
    check=(
        Interface(
            "position bias",
            (
                "judge/position_agreement",
                "judge/first_preferred_frac",
                "config:feedback.judge_position_check",
            ),
            "pairwise judges (feedback.source=comparison) log it on the pairs shown both ways",
        ),
        Interface("the judge's prompt template", ("config:feedback.judge_template",)),
        Interface("length bias", ("judge/length_corr", "length/mean")),
        Interface("agreement with the verifier", ("reward/verifier_mean", "reward/mean")),
        Interface(
            "self-consistency",
            ("judge/self_consistency", "config:feedback.judge_temperature"),
            "logged when feedback.judge_repeat_check > 0",
        ),
    ),
    not_first=(
        "the policy's learning rate, clip range or KL: the policy is learning what the judge "
        "rewards; fix the judge (randomise or average the order, change the template, or "
        "another judge model) and check it against the verifier before tuning the learner",
    ),
)

SEGMENT_STATE_LOSS = Symptom(
    id="segment_state_loss",
    title="a segment boundary loses the state",
    source="（不在失败表中：选择表第 7 行，state sufficiency）",
    check=(
        Interface(
            "what the next segment's context keeps — try data.context_policy=compact (under "
            "compact: what its summaries hold, env/summary_tokens and the samples), or a "
            "model with a longer context",
            (
                "config:data.context_policy",
                "env/context_dropped_tokens",
                "env/summary_tokens",
                "env/segments",
            ),
            "read episodes whose answer needed a turn the next segment's context dropped",
        ),
        Interface(
            "the critic's two readings of one state",
            (
                "critic/segment_value_gap",
                "critic/segment_value_gap_signed",
                "critic/value_error_last",
                "critic/explained_variance",
            ),
        ),
        Interface(
            "critic warm-up — try critic.warmup_steps or critic.pretrain_mc when the signed "
            "gap is far from 0 (the critic reads the context's form, not only its content)",
            ("config:critic.warmup_steps", "config:critic.pretrain_mc", "critic/pretraining"),
        ),
        Interface(
            "held-out score at equal generated tokens",
            ("eval/pass@1", "eval/segments", "budget/generated_tokens"),
            "compare the context policies over seeds with rlmap compare",
        ),
    ),
    not_first=(
        "credit.lam: the trace is cut at a boundary whatever λ, so no λ carries across it "
        "what the next segment's context dropped",
    ),
)

SEGMENT_CREDIT_CUT = Symptom(
    id="segment_credit_cut",
    title="credit stops at segment boundaries",
    source="（不在失败表中：选择表第 7 行，跨段信用）",
    check=(
        Interface(
            "the critic at the boundary — try critic.warmup_steps or critic.pretrain_mc",
            (
                "critic/explained_variance",
                "critic/value_error_first",
                "critic/segment_value_gap",
                "config:critic.warmup_steps",
                "config:critic.pretrain_mc",
            ),
        ),
        Interface(
            "the estimator — try an outcome estimator (credit.estimator=grpo or rloo), which "
            "puts the episode's return on every segment",
            ("config:credit.estimator", "config:credit.lam_critic", "config:credit.time_unit"),
        ),
        Interface(
            "boundaries per episode — try data.context_policy=compact (a summary in place "
            "of the dropped turns leaves room for more turns per segment), or a model with "
            "a longer context",
            ("env/segments", "env/context_dropped_tokens", "config:data.context_policy"),
        ),
    ),
    not_first=(
        "credit.lam (λ_policy): the trace is cut at every boundary whatever λ; a larger λ "
        "carries credit further within a segment, never across one",
    ),
)
