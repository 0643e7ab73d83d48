"""The sampling settings: how many responses per prompt, and which groups are kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SamplingParams:
    """How a rollout batch is drawn and filtered (docs/formulas.md §7).

    Plain data: the recipe validator checks the values (G >= 1, a filter that needs
    a group has G >= 2, ...) and names the field at fault.
    """

    group_size: int = 8
    """G, responses sampled per prompt (1 = a single rollout per prompt)."""
    prompts_per_step: int = 8
    """Prompts per rollout batch; with dynamic sampling, the number of groups to keep."""
    filter: str = "none"
    """Group filter: ``none`` (keep every valid trajectory) or ``mixed`` (DAPO dynamic sampling:
    keep only groups whose rewards are not all equal)."""
    group_scope: Literal["prompt", "turn", "branch"] = "prompt"
    """What a group baseline compares: ``prompt`` (the G samples of a prompt) or ``turn``
    (also the turns of those samples that reached the same state — equal observation
    histories —, GiGPO's step advantage; multi-turn tasks and the group estimators
    grpo, dr_grpo and rloo; docs/formulas.md §2.4) or ``branch`` (G continuations of one
    state: a root trajectory's turn k, drawn uniformly, replayed in G fresh environments;
    replayable multi-turn environments, ``data.context_policy=fail``)."""
    max_rounds: int = 4
    """Dynamic sampling: at most this many generation rounds per training step."""
    curriculum: bool = False
    """Drive the reasoning-gym task's own curriculum (:mod:`rlmap.sampling.curriculum`): the
    training prompts start at level ``curriculum_start`` and climb towards
    ``curriculum_top``, whose settings ``data.task_args`` then holds (the held-out set)."""
    curriculum_start: int = 0
    """The level the training prompts start at."""
    curriculum_top: int | None = None
    """The highest level, the one evaluated on; None: the curriculum's highest (set when the
    config is built, so a saved config names it)."""
    curriculum_up: float = 0.8
    """One level up when the rolling pass rate at the current level is at least this."""
    curriculum_down: float = 0.2
    """One level down when the rolling pass rate at the current level is at most this."""
    curriculum_window: int = 64
    """Trajectories at the current level the rolling pass rate is taken over (a move empties
    it: each decision rests on this many outcomes of its level)."""
    rebalance: bool = False
    """Prompt rebalancing (:mod:`rlmap.sampling.rebalance`): prompts whose groups were all
    correct or all wrong for ``rebalance_after`` visits in a row are mostly skipped, and
    prompts with a rare success are drawn again the next step."""
    rebalance_after: int = 2
    """Consecutive uniform visits after which a prompt is stale."""
    rebalance_keep: float = 0.25
    """Probability that a stale prompt is visited when the data order reaches it."""
    rebalance_rare: float = 0.25
    """A group pass rate in (0, this] is a rare success: its prompt is drawn again."""

    @property
    def rollouts_per_round(self) -> int:
        """Trajectories generated per round: G · prompts_per_step."""
        return self.group_size * self.prompts_per_step
