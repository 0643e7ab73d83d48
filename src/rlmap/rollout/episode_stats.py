"""Statistics of some episodes as a whole — turns, tool calls, how they ended, segments —
which the caller prefixes ``env/`` (training rollouts, :mod:`rlmap.system.step_metrics`) or
``eval/`` (held-out, :mod:`rlmap.rollout.evaluate`)."""

from __future__ import annotations

from collections.abc import Sequence

from rlmap.core.batch import End
from rlmap.rollout.episodes import Episode


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Multi-turn statistics of some episodes (the caller prefixes ``env/`` or ``eval/``).

    ``turns``: mean policy turns per episode; ``tool_call_rate``: fraction of episodes
    with at least one tool call; ``tool_calls``: mean calls per episode;
    ``tool_error_frac``: fraction of calls that failed (0 without calls);
    ``turn_budget_frac``: fraction truncated after a completed turn (the turn budget, or
    the context full);
    ``aborted_frac``: fraction aborted by an environment failure.
    """
    n = max(len(episodes), 1)
    calls = sum(e.tool_calls for e in episodes)
    return {
        "turns": sum(e.turns for e in episodes) / n,
        "tool_call_rate": sum(e.tool_calls > 0 for e in episodes) / n,
        "tool_calls": calls / n,
        "tool_error_frac": sum(e.tool_errors for e in episodes) / max(calls, 1),
        "turn_budget_frac": sum(e.end == End.TRUNCATED and e.eos for e in episodes) / n,
        "aborted_frac": sum(e.end == End.ABORTED for e in episodes) / n,
    }


def segment_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``segments``: mean rows (segments) per episode, 1 where no context was cut;
    ``summary_tokens``: mean tokens per episode the policy wrote in compaction summaries;
    ``context_dropped_tokens``: mean tokens per episode left out of a next segment's context
    (``data.context_policy``; the caller prefixes ``env/`` or ``eval/``)."""
    n = max(len(episodes), 1)
    return {
        "segments": sum(len(e.rows) for e in episodes) / n,
        "summary_tokens": sum(e.summary_tokens for e in episodes) / n,
        "context_dropped_tokens": sum(e.dropped_tokens for e in episodes) / n,
    }
