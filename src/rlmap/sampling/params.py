"""The sampling settings: how many responses per prompt, and which groups are kept."""

from __future__ import annotations

from dataclasses import dataclass


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
    max_rounds: int = 4
    """Dynamic sampling: at most this many generation rounds per training step."""

    @property
    def rollouts_per_round(self) -> int:
        """Trajectories generated per round: G · prompts_per_step."""
        return self.group_size * self.prompts_per_step
