"""The selection table of the recipe map, as data: seven task conditions and their answers.

Each :class:`Row` is one task condition of the source's table (一张选择表), with the
baseline to establish first, the next change to try and what must not be ignored,
in the table's words (translated; ``source`` keeps the original), plus how rlmap sets
that baseline up: a preset and dotted overrides. A row's condition is a predicate
over a :class:`TaskProfile`, what the user says about the task. ``rlmap advise``
(:mod:`rlmap.advise.advice`) walks the six questions and picks from this table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from rlmap.core.errors import ConfigError

Verifier = Literal["exact", "math", "code", "reward-model", "none"]
Barrier = Literal["mild", "severe"]

LONG_RESPONSE = 4096
"""Responses of at least this many tokens count as "very long" (row 2). GRPO's paper
trains at 1k tokens, DAPO and VAPO at 16k–20k; the line sits between."""


@dataclass(frozen=True)
class TaskProfile:
    """What the user says about the task; every field is one ``rlmap advise`` flag."""

    multi_turn: bool = False
    """Episodes have several policy turns (tool calls, an environment between turns)."""
    verifier: Verifier = "exact"
    """What checks a response: exact match, a math answer, code tests, a learned reward
    model, or none (the reward is an environment's return)."""
    cheap_samples: bool = True
    """Many samples of the same prompt are cheap (a group baseline is affordable)."""
    response_length: int | None = None
    """Typical response length in tokens; None: unknown."""
    critic_unstable: bool = False
    """A value critic has been clearly unstable on this task."""
    rare_correct: bool = False
    """Correct samples are extremely rare."""
    moe_routing_mismatch: bool = False
    """A mixture-of-experts model whose expert routing differs between training and rollout."""
    separate_rollout: bool = False
    """Rollout and learner run as separate processes (another engine produces μ)."""
    barrier: Barrier = "mild"
    """How much waiting for the slowest member of a group costs: mild or severe."""
    long_context: bool = False
    """Contexts exceed the model's window (trajectories must be segmented)."""

    def __post_init__(self) -> None:
        if self.verifier not in get_args(Verifier):
            known = ", ".join(get_args(Verifier))
            raise ConfigError(f"--verifier: unknown kind '{self.verifier}'; known: {known}")
        if self.barrier not in get_args(Barrier):
            raise ConfigError(f"--barrier: expected mild or severe, got '{self.barrier}'")
        if self.response_length is not None and self.response_length < 1:
            raise ConfigError(f"--response-length: must be >= 1, got {self.response_length}")

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> TaskProfile:
        """A profile from parsed flags; a flag left out (None) keeps its default."""
        return cls(**{name: value for name, value in flags.items() if value is not None})

    @property
    def outcome_verifier(self) -> bool:
        """A deterministic checker of the final answer (not a learned or missing one)."""
        return self.verifier in ("exact", "math", "code")

    @property
    def long_responses(self) -> bool:
        """Typical responses are known to be very long (at least :data:`LONG_RESPONSE`)."""
        return self.response_length is not None and self.response_length >= LONG_RESPONSE


FLAG_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TaskProfile))


@dataclass(frozen=True)
class Watch:
    """One thing that must not be ignored, and how to watch it in rlmap."""

    item: str
    """The table's wording, translated."""
    how: str
    """The metrics or config fields that show it."""


@dataclass(frozen=True)
class Setup:
    """A set-up that a row's "in rlmap" text names, as data: a test builds every one with
    the config's own validation, so the text cannot name a preset or setting rlmap lacks."""

    preset: str | None
    """The preset; None: the recipe of the advice's baseline, whichever row or fallback
    picked it (rows 4 and 5 say how to run it, not which it is)."""
    overrides: tuple[str, ...] = ()
    """Dotted overrides, concrete where the text has a placeholder (``L`` → a level)."""


@dataclass(frozen=True)
class Row:
    """One task condition of the selection table (or a fallback when none applies)."""

    number: int | None
    """Row of the table, 1–7; None for a fallback that is not in the table."""
    condition: str
    """The task condition, translated."""
    applies: Callable[[TaskProfile], bool]
    """Whether the condition holds for a profile."""
    baseline: str
    """The baseline to establish first, in the table's words."""
    next_change: str
    """The next change to try, in the table's words."""
    must_not_ignore: tuple[Watch, ...]
    """What must not be ignored, in the table's order."""
    preset: str | None
    """The rlmap preset of the baseline; None: the row keeps the base recipe and only
    adds its overrides (it says how to run, not which recipe)."""
    overrides: tuple[str, ...] = ()
    """Dotted overrides on top of the preset (or of the base recipe)."""
    baseline_in_rlmap: str = ""
    """How rlmap sets the baseline up, and what it lacks."""
    next_in_rlmap: str = ""
    """How to try the next change in rlmap, and what it lacks."""
    source: str = ""
    """The row as the source states it (Chinese), for traceability."""
    named: tuple[Setup, ...] = ()
    """Every preset and setting that ``baseline_in_rlmap`` and ``next_in_rlmap`` name, as
    set-ups that ``rlmap train`` accepts (tests/advise/test_advise.py builds them
    and checks that the texts name nothing else)."""


_ALL_EQUAL = Watch(
    "all-equal groups",
    "group/all_correct_frac, group/all_wrong_frac, group/zero_adv_frac: a group with one "
    "reward value has zero advantage",
)
_VALUE_CALIBRATION = Watch(
    "value calibration",
    "critic/explained_variance, critic/value_error_first and _last: a critic that does not "
    "explain the returns adds bias instead of removing variance",
)

_SEGMENTS = ("credit.time_unit=turn", "data.task=calculator", "data.context_policy=truncate_oldest")
"""Row 7's set-up: per-turn GAE on rlmap's multi-turn task, in segments past the window."""
_COMPACT = (*_SEGMENTS[:2], "data.context_policy=compact")
"""Row 7's next change: the same, the policy writing each next segment's context."""

_REPLAY = ("behaviour.routing_replay=true", "model.path=embedded:tiny-moe")
"""Row 4's routing replay, on the built-in MoE."""

TABLE: tuple[Row, ...] = (
    Row(
        number=1,
        condition="single-turn, outcome verifier, many samples per prompt are cheap",
        applies=lambda p: not p.multi_turn and p.outcome_verifier and p.cheap_samples,
        baseline="RLOO / GRPO",
        next_change="DAPO-style sampling/reduction",
        must_not_ignore=(
            _ALL_EQUAL,
            Watch(
                "total rollout tokens",
                "budget/generated_tokens: dynamic sampling discards groups, "
                "so compare runs at equal generated tokens, not at equal steps",
            ),
        ),
        preset="rloo",
        baseline_in_rlmap="rloo (on-policy, leave-one-out baseline, no clip, no KL); "
        "run grpo beside it",
        next_in_rlmap="dapo (mixed-group dynamic sampling, token mean, Clip-Higher, soft "
        "overlong punishment); dr-grpo for the fixed-budget denominator alone",
        source="单轮、终局 verifier、同题多采便宜 | RLOO / GRPO | DAPO-style sampling/reduction "
        "| 全同组、总 rollout token",
        named=(Setup("rloo"), Setup("grpo"), Setup("dapo"), Setup("dr-grpo")),
    ),
    Row(
        number=2,
        condition="single-turn with very long responses, and a critic clearly unstable",
        applies=lambda p: not p.multi_turn and p.long_responses and p.critic_unstable,
        baseline="PPO + GAE",
        next_change="VAPO-style critic/λ design",
        must_not_ignore=(
            _VALUE_CALIBRATION,
            Watch(
                "the definition of length",
                "the adaptive λ needs credit.length_unit = credit.time_unit; length/mean, "
                "length/truncated_frac: a truncation is not a terminal",
            ),
        ),
        preset="ppo",
        baseline_in_rlmap="ppo (value critic + GAE γ = 1, λ = 0.95 + PPO clip + token mean, "
        "one response per prompt)",
        next_in_rlmap="vapo (value pre-training on Monte-Carlo returns, λ_critic = 1, "
        "length-adaptive λ_policy, Clip-Higher, positive NLL)",
        source="单轮很长、critic 明显失稳 | PPO + GAE | VAPO-style critic/λ 设计 "
        "| value calibration、长度定义",
        named=(Setup("ppo"), Setup("vapo")),
    ),
    Row(
        number=3,
        condition="correct samples are extremely rare",
        applies=lambda p: p.rare_correct,
        baseline="group sampling / curriculum",
        next_change="positive NLL, search, data rebalancing",
        must_not_ignore=(
            Watch(
                "verifier loopholes",
                "read the rewarded samples: when correct answers are rare, "
                "a loophole is the easiest reward to find",
            ),
            Watch(
                "prompt coverage",
                "group/all_wrong_frac, eval/pass@k: a prompt no sample solves gives no signal",
            ),
        ),
        preset="grpo",
        overrides=("sampling.group_size=16",),
        baseline_in_rlmap="grpo with G = 16 (twice the embedded G), so that a group more "
        "often holds a correct sample; on a reasoning-gym task also sampling.curriculum=true "
        "with sampling.curriculum_top=L, the level you evaluate on (the task's own "
        "curriculum, its level following the rolling pass rate; data.task_args then holds "
        "level L's settings, the held-out set included)",
        next_in_rlmap="behaviour.positive_nll=0.1 (VAPO's μ: NLL on the correct samples); "
        "sampling.rebalance=true (prompts all wrong or all right visit after visit mostly "
        "skipped, rare successes drawn again); search changes the data, outside rlmap",
        source="正确样本极稀少 | group sampling / curriculum | positive NLL、搜索、数据重平衡 "
        "| verifier 漏洞、prompt coverage",
        named=(
            Setup("grpo", ("sampling.group_size=16",)),
            Setup(
                "grpo",
                (
                    "sampling.group_size=16",
                    "data.task=reasoning_gym:chain_sum",
                    "sampling.curriculum=true",
                    "sampling.curriculum_top=3",
                ),
            ),
            Setup("grpo", ("sampling.group_size=16", "behaviour.positive_nll=0.1")),
            Setup("grpo", ("sampling.group_size=16", "sampling.rebalance=true")),
        ),
    ),
    Row(
        number=4,
        condition="MoE whose expert routing differs between training and rollout",
        applies=lambda p: p.moe_routing_mismatch,
        baseline="a small synchronous experiment",
        next_change="R3 + probability correction",
        must_not_ignore=(
            Watch(
                "router metadata",
                "record the rollout engine's top-k experts per token and "
                "layer: replaying the routing needs them",
            ),
            Watch(
                "objective shift",
                "replayed routes change the function being trained: judge by "
                "held-out eval/pass@1, not by κ alone",
            ),
        ),
        preset=None,
        overrides=("system.mode=sync", "behaviour.mode=decoupled"),
        baseline_in_rlmap="system.mode=sync and behaviour.mode=decoupled: the learner "
        "recomputes π_old, so κ = π_old/μ shows the mismatch (ratio/kappa/*) before anything "
        "corrects it",
        next_in_rlmap="behaviour.routing_replay=true (R3: the HF engine records each "
        "token's experts per layer, the learner replays them; any transformers MoE with "
        "top-k routers, e.g. model.path=embedded:tiny-moe) with behaviour.corrections=[tis] "
        "or [icepop]; moe/route_mismatch_frac and ratio/kappa/* show what it changed",
        source="MoE 训推 route 不一致 | 同步小实验 | R3 + probability correction "
        "| router metadata、目标偏移",
        named=(
            Setup(None, ("system.mode=sync", "behaviour.mode=decoupled")),
            Setup(None, (*_REPLAY, "behaviour.corrections=[tis]")),
            Setup(None, (*_REPLAY, "behaviour.corrections=[icepop]")),
        ),
    ),
    Row(
        number=5,
        condition="rollout and learner are separate processes",
        applies=lambda p: p.separate_rollout,
        baseline="record the real behaviour",
        next_change="TIS/IcePop or direct correction",
        must_not_ignore=(
            Watch(
                "processor",
                "temperature, top-p and other logits processors change μ; the "
                "log-probs the engine reports must include them",
            ),
            Watch(
                "support",
                "tokens outside μ's support (top-p truncation) give unbounded ratios: "
                "ratio/kappa/max_abs_log",
            ),
            Watch(
                "staleness",
                "system/max_version_lag, system/stale_frac: a stale trajectory "
                "was sampled by an older policy",
            ),
        ),
        preset=None,
        overrides=("behaviour.mode=decoupled",),
        baseline_in_rlmap="rlmap stores each token's log μ as the engine reports it when "
        "sampling; behaviour.mode=decoupled recomputes π_old, so κ and ρ are reported apart "
        "(ratio/kappa/*, ratio/rho/*)",
        next_in_rlmap="behaviour.corrections=[tis] or [icepop]; or the direct ratio "
        "d = π_θ/μ: behaviour.objective=direct_gate with behaviour.mode=bypass",
        source="rollout 与 learner 分离 | 记录真实 behavior | TIS/IcePop 或 direct correction "
        "| processor、support、staleness",
        named=(
            Setup(None, ("behaviour.mode=decoupled",)),
            Setup(None, ("behaviour.corrections=[tis]",)),
            Setup(None, ("behaviour.corrections=[icepop]",)),
            Setup(None, ("behaviour.objective=direct_gate", "behaviour.mode=bypass")),
        ),
    ),
    Row(
        number=6,
        condition="multi-turn agent, severe group barrier",
        applies=lambda p: p.multi_turn and p.barrier == "severe",
        baseline="single-rollout actor–critic",
        next_change="SAO-style async",
        must_not_ignore=(
            Watch(
                "selection bias",
                "an asynchronous queue admits short trajectories first: "
                "compare length/mean of accepted and generated trajectories",
            ),
            Watch(
                "critic cold start",
                "critic/explained_variance over the first steps; "
                "critic.warmup_steps trains the critic before the policy moves",
            ),
        ),
        preset="ppo",
        overrides=("sampling.group_size=1",),
        baseline_in_rlmap="ppo with one trajectory per prompt: a value critic, GAE over "
        "action tokens (observations skipped), synchronous",
        next_in_rlmap="sao (asynchronous queue, direct ratio, double-sided gate, staleness "
        "filter) with data.task=calculator: its rollout workers run as threads in the "
        "learner's process, or as Ray actors with system.backend=ray",
        source="多轮 agent、group barrier 严重 | single-rollout actor–critic | SAO-style async "
        "| 选择偏差、critic cold start",
        named=(
            Setup("ppo", ("sampling.group_size=1",)),
            Setup("sao", ("data.task=calculator",)),
            Setup("sao", ("data.task=calculator", "system.backend=ray")),
        ),
    ),
    Row(
        number=7,
        condition="contexts exceed the model's window",
        applies=lambda p: p.long_context,
        baseline="segment/turn value baseline",
        next_change="learned compaction",
        must_not_ignore=(
            Watch(
                "state sufficiency",
                "the context kept at a segment boundary must still determine "
                "the value, or the critic fits noise",
            ),
            Watch(
                "credit across segments",
                "a segment boundary is a truncation, not a terminal: "
                "bootstrap from the next segment's value",
            ),
        ),
        preset="ppo",
        overrides=_SEGMENTS,
        baseline_in_rlmap="ppo with one GAE step per assistant turn (credit.time_unit=turn) "
        "on a multi-turn task (data.task=calculator stands for yours), cut into segments "
        "when the next turn would not fit (data.context_policy=truncate_oldest): the oldest "
        "whole turns are dropped, and a boundary is a truncation that bootstraps from the "
        "critic's value at the next segment's start (docs/formulas.md §2.5)",
        next_in_rlmap="data.context_policy=compact: at a boundary the policy writes a "
        "summary (its turn starts with the task's lead) and the next segment goes on from the "
        "prompt, the summary and the newest observation; the summary trains with the credit "
        "of what follows (docs/formulas.md §2.5); env/summary_tokens shows what it writes, "
        "critic/segment_value_gap whether the state survived",
        source="context 超窗 | segment/turn value baseline | learned compaction "
        "| state sufficiency、跨段信用",
        named=(Setup("ppo", _SEGMENTS), Setup("ppo", _COMPACT)),
    ),
)

BASE_PRECEDENCE: tuple[int, ...] = (7, 6, 3, 2, 1)
"""Which matching row supplies the recipe, most specific first: a context past the
window and a severe agent barrier constrain the structure of the trajectory; rare
correct samples leave a group baseline with nothing to compare; row 1 is the plain
case. Rows 4 and 5 never supply the recipe (they qualify how any recipe runs)."""

FALLBACKS: tuple[Row, ...] = (
    Row(
        number=None,
        condition="the reward is a learned reward model",
        applies=lambda p: p.verifier == "reward-model",
        baseline="classic RLHF: learned reward + value critic + GAE + PPO clip + KL in the reward",
        next_change="a deterministic verifier wherever the task allows one (RLVR)",
        must_not_ignore=(
            Watch(
                "reward hacking",
                "check held-out samples by hand or by a verifier: a rising "
                "reward/mean is the reward model's score, not the task's",
            ),
            Watch(
                "distribution shift",
                "kl/mean: the reward model was trained on other outputs "
                "than the policy's current ones",
            ),
        ),
        preset="classic-rlhf",
    ),
    Row(
        number=None,
        condition="many samples per prompt are cheap",
        applies=lambda p: p.cheap_samples,
        baseline="a group baseline: REINFORCE with batch baseline, RLOO or GRPO",
        next_change="Dr. GRPO or DAPO-style sampling/reduction",
        must_not_ignore=(
            _ALL_EQUAL,
            Watch(
                "non-reproducible states",
                "multi-turn: a group compares episodes of one prompt, the same state only "
                "at the first turn; sampling.group_scope=turn (identical histories) or "
                "branch (a replayed state) compares later ones",
            ),
        ),
        preset="rloo",
    ),
    Row(
        number=None,
        condition="each state affords one trajectory",
        applies=lambda p: True,
        baseline="PPO + GAE",
        next_change="VAPO-style value warm-up and adaptive GAE, or SAO-style async",
        must_not_ignore=(
            _VALUE_CALIBRATION,
            Watch(
                "terminal vs truncated",
                "a truncated episode still bootstraps from its last "
                "value; only a true terminal stops it (length/truncated_frac)",
            ),
        ),
        preset="ppo",
    ),
)


def table_markdown() -> str:
    """The selection table as implemented, then as the source states it (docs/advise.md
    includes both verbatim; a test checks that they agree)."""
    lines = [
        "| # | task condition | first (rlmap) | next change (rlmap) | must not ignore |",
        "|---|---|---|---|---|",
    ]
    for row in TABLE:
        first = f"{row.baseline} — `{row.preset}`" if row.preset else row.baseline
        first += "".join(f" `{o}`" for o in row.overrides)
        watch = "; ".join(w.item for w in row.must_not_ignore)
        following = f"{row.next_change} — {row.next_in_rlmap}"
        lines.append(f"| {row.number} | {row.condition} | {first} | {following} | {watch} |")
    lines += ["", "As the source states it:", ""]
    lines += [
        "| # | 任务条件 | 优先建立的 baseline | 下一步改动 | 不应忽略 |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {row.number} | {row.source} |" for row in TABLE]
    return "\n".join(lines) + "\n"
