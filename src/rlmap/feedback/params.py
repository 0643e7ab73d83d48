"""Hyper-parameters of the feedback axis: where the reward comes from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RewardSource = Literal[
    "verifier", "reward_model", "process_reward", "environment", "judge", "comparison"
]


@dataclass(frozen=True)
class FeedbackParams:
    """Where the reward comes from and how it is shaped."""

    source: RewardSource = "verifier"
    """Kind of feedback: deterministic verifier, learned reward model, process reward,
    environment return, an AI judge's rating (``judge``), or pairwise verdicts within
    each group (``comparison``; :mod:`rlmap.feedback.judge`)."""
    verifier: str = "exact_match"
    """Name in ``rlmap.feedback.registry`` when ``source`` is ``verifier``."""
    eval_verifier: str | None = None
    """The verifier of the held-out evaluation (``eval/*``); None uses ``verifier``. A
    stricter one than training's makes reward hacking visible: ``reward/*`` rises while
    ``eval/pass@1`` does not (``eval/train_verifier_pass@1`` scores the same held-out
    samples with the training verifier)."""
    timeout_s: float | None = None
    """Run the verifier in its own process with this per-call timeout (seconds): a hang
    becomes status ``timeout``, a crash ``infra_error``, and training goes on. None runs
    it in-process (the built-in pure-Python verifiers need no more)."""
    overlong_cache: int | None = None
    """L_c of DAPO's soft overlong punishment (L_max is ``generation.max_new_tokens``);
    None turns the shaping off."""
    format_pattern: str | None = None
    """A regular expression the final answer must fully match for the format reward."""
    format_weight: float = 0.0
    """Weight of the format reward (1 on a match, else 0); non-zero with ``format_pattern``."""
    length_target: int | None = None
    """Generated-token target of the length reward −|L − target| / target."""
    length_weight: float = 0.0
    """Weight of the length reward; non-zero with ``length_target``."""
    process_reward: str | None = None
    """A per-turn scorer (``rlmap.feedback.process.registry``) for ``source=process_reward``:
    its per-turn scores sit at each turn's last token (turn-level credit)."""
    judge_url: str | None = None
    """The judge's OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8000/v1``, for
    ``source=judge`` and ``source=comparison``; a run does not start if nothing answers."""
    judge_api_key_env: str | None = None
    """The environment variable holding the endpoint's API key (sent as a bearer token);
    None sends none. The key itself never goes in a config."""
    judge_model: str = "judge"
    """The ``model`` named in each request (a server may serve several)."""
    judge_template: str | None = None
    """A prompt template file (``str.format`` text: pointwise ``{prompt}``, ``{response}``,
    ``{reference}``, ``{lo}``, ``{hi}``; pairwise ``{prompt}``, ``{first}``, ``{second}``,
    ``{reference}``); None uses the built-in one of the mode, ``embedded`` the embedded
    judge's short one (``rlmap judge-model``)."""
    judge_min: float = 0.0
    """The lowest rating a pointwise judge may give (reward 0)."""
    judge_max: float = 10.0
    """The highest rating (reward 1); a rating outside [min, max] is unparseable (invalid)."""
    judge_concurrency: int = 8
    """Requests in flight at once, at most."""
    judge_retries: int = 2
    """Retries of a request that failed in transport or with HTTP 5xx / 429 (backoff 0.25 s,
    doubling); a 4xx is not retried."""
    judge_timeout_s: float = 30.0
    """Seconds per request; a request that outlives it (every retry) is ``timeout``."""
    judge_max_tokens: int = 16
    """The reply's token limit."""
    judge_temperature: float = 0.0
    """The judge's sampling temperature."""
    judge_position_check: float = 0.1
    """Comparisons: the fraction of pairs also shown in the other order
    (``judge/position_agreement``); both verdicts count in the rewards."""
    judge_repeat_check: float = 0.0
    """The fraction of requests sent twice, the repeat past the cache
    (``judge/self_consistency``; meaningful with ``judge_temperature`` > 0)."""
    comparison_model: Literal["judge", "reward_model"] = "judge"
    """Who gives ``source=comparison``'s pairwise verdicts: the AI judge at ``judge_url``,
    or the learned Bradley–Terry reward model (``model.reward_path``; on the embedded
    default, its own), whose verdict on a pair is P(i ≻ j) = σ(r_i − r_j)."""
    comparison: Literal["winrate", "bt"] = "winrate"
    """How ``source=comparison`` turns a group's verdicts into rewards: each response's win
    rate (ties ½), or Bradley–Terry strengths fitted per group, σ(s_i − s̄)."""
    comparison_pairs: int | Literal["all"] = "all"
    """Pairs judged per group: all G(G−1)/2, or K (G − 1 ≤ K ≤ G(G−1)/2) of a connected
    design in which every response is compared about equally often."""

    @property
    def uses_reward_model(self) -> bool:
        """A learned reward model scores the rollouts: as the reward, or as the comparisons'
        verdicts."""
        return self.source == "reward_model" or (
            self.source == "comparison" and self.comparison_model == "reward_model"
        )

    @property
    def uses_judge(self) -> bool:
        """An AI judge over HTTP gives the reward or the comparisons' verdicts."""
        return self.source == "judge" or (
            self.source == "comparison" and self.comparison_model == "judge"
        )
