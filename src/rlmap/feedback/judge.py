"""AI judges over an OpenAI-compatible HTTP endpoint, and rewards from comparisons.

Two rewards, both :class:`rlmap.feedback.reward.Reward` s (so the trainer calls them
through ``score_batch`` like any other):

- :class:`PointwiseJudge` (``feedback.source=judge``): one request per trajectory; the
  reply's rating (:func:`parse_score`), in [lo, hi] = [``feedback.judge_min``,
  ``feedback.judge_max``], gives the reward (rating − lo) / (hi − lo) ∈ [0, 1].
- :class:`ComparisonReward` (``feedback.source=comparison``): within each group of G
  responses to one prompt, pairwise verdicts ("A", "B" or a tie: :func:`parse_choice`;
  two identical responses are a tie, never asked) on a connected design of pairs
  (:func:`pair_design`: all G(G−1)/2, or K of them), each pair shown in a seeded random
  order; the verdicts become per-response rewards, the win rate (ties ½) or the
  Bradley–Terry strength σ(s_i − s̄) fitted per group (:func:`bt_rewards`).

Failures are statuses, never zeros (``docs/rewards.md``): a reply with no parsable
verdict is ``INVALID``; a refused connection, an HTTP error or a malformed body is
``INFRA_ERROR``, a request that outlived ``feedback.judge_timeout_s`` ``TIMEOUT`` (a
deadline for the whole request, not for each socket read: :func:`read_within`), after
``feedback.judge_retries`` retries with exponential backoff. A response whose every
comparison failed takes the most severe of their statuses; one with some verdicts is
scored on those.

The client (:class:`JudgeClient`) sends at most ``feedback.judge_concurrency`` requests
at once (threads: one blocking ``urllib`` call each), and caches replies by a hash of the
request body, so a repeated (prompt, response) pair costs nothing. Each request's usage
(prompt and completion tokens) is counted; :class:`JudgeStats` turns the counts and the
bias probes into the ``judge/*`` metrics of a step:

- ``judge/position_agreement``: of the pairs shown in both orders (a fraction
  ``feedback.judge_position_check`` of them), the share whose two verdicts name the same
  response. A judge that always prefers the first shown scores 0.
- ``judge/first_preferred_frac``: the share of pairwise verdicts (ties aside) that
  preferred the first response shown (0.5 for a judge without position bias, since
  orders are random). Pairs of identical responses are ties, never asked.
- ``judge/length_corr``: the correlation between the judge's score and the response's
  length among responses to the same prompt with equal verifier outcome (pooled
  within-stratum Pearson: both centred within each stratum, then correlated), so a judge
  that rewards length, not correctness, shows up even when correct answers are longer.
- ``judge/pairs``: pairwise verdicts of the step, asked or (identical responses) tied.
- ``judge/self_consistency``: of the requests sent twice (a fraction
  ``feedback.judge_repeat_check``, the repeat bypassing the cache), the share whose two
  verdicts agree.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from rlmap.core.batch import RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.feedback.judge_client import JudgeClient, JudgeStats, Reply
from rlmap.feedback.judge_text import load_template, parse_choice, parse_score
from rlmap.feedback.params import FeedbackParams
from rlmap.feedback.reward import Score, Trajectory, on_last_turn, score_batch, worst


def _observed(score: float, t: Trajectory) -> tuple[float, float, Any]:
    """(the judge's score, the length, the stratum) of a scored response for the length
    probe: the stratum is its prompt's group and what the task's verifier said of it (the
    environment's return), so the probe compares responses to one prompt, equally right."""
    return (
        score,
        float(t.length),
        (t.metadata.get("group"), float(sum(t.metadata.get("rewards", ())))),
    )


@dataclass
class PointwiseJudge:
    """R = (score − lo) / (hi − lo), the judge's rating of the last turn (module docstring)."""

    client: JudgeClient
    template: str
    lo: float = 0.0
    hi: float = 10.0
    repeat_check: float = 0.0
    seed: int = 0
    name: str = "judge"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        prompts = [
            self.template.format(
                prompt=t.prompt,
                response=t.response,
                reference=t.reference,
                lo=f"{self.lo:g}",
                hi=f"{self.hi:g}",
            )
            for t in batch
        ]
        replies = self.client.ask(prompts)
        parse = lambda r: None if r.text is None else parse_score(r.text, self.lo, self.hi)  # noqa: E731
        scores = [parse(r) for r in replies]
        rng = random.Random(_batch_seed(self.seed, prompts))
        again = [i for i in range(len(batch)) if rng.random() < self.repeat_check]
        repeats = self.client.ask([prompts[i] for i in again], fresh=[True] * len(again))
        stats = self.client.stats
        with stats.lock:
            for i, r in zip(again, repeats, strict=True):
                if scores[i] is not None and r.text is not None:
                    stats.repeats.append(parse(r) == scores[i])
            for t, s, r in zip(batch, scores, replies, strict=True):
                stats.invalid += r.text is not None and s is None
                if s is not None:
                    stats.scored.append(_observed(s, t))
        out = []
        for t, s, r in zip(batch, scores, replies, strict=True):
            if r.text is None:
                out.append(Score.failed(r.status, r.reason))
            elif s is None:
                out.append(
                    Score.failed(
                        RewardStatus.INVALID,
                        f"judge: no score in [{self.lo:g}, {self.hi:g}] in {r.text[:60]!r}",
                    )
                )
            else:
                out.append(on_last_turn(Score(s), t))
        return out


Verdict = tuple[int, int, float]
"""(i, j, w): w = 1 when i won the comparison, 0 when j did, ½ a tie."""


def pair_design(g: int, k: int | None = None) -> list[tuple[int, int]]:
    """Pairs (i, j), i ≠ j, of a group of ``g``: all g(g−1)/2 for ``k`` None, else the first
    ``k`` of the cyclic order — (i, i+1) for i < g−1 first (a path: every response in a
    comparison, the design connected), then the pair closing the ring, then distance 2, 3, …
    so the comparisons spread evenly over the responses. Needs g − 1 ≤ k ≤ g(g−1)/2."""
    everything = [(i, (i + d) % g) for d in range(1, g // 2 + 1) for i in range(g)]
    seen: set[frozenset[int]] = set()
    ordered = []
    for i, j in everything:  # distance g/2 lists each pair twice when g is even
        if frozenset((i, j)) not in seen:
            seen.add(frozenset((i, j)))
            ordered.append((min(i, j), max(i, j)))
    if k is None:
        return ordered
    if not g - 1 <= k <= len(ordered):
        raise ValueError(f"pair_design: need {g - 1} <= k <= {len(ordered)} for a group of {g}")
    return ordered[:k]


def bounded_pairs(k: int | None, g: int) -> int | None:
    """``k`` pairs (None: all) for a group of ``g``, within what :func:`pair_design` takes
    (config asks G − 1 ≤ K ≤ G(G−1)/2 of the full group; a smaller group gets what fits)."""
    return None if k is None else min(max(k, g - 1), g * (g - 1) // 2)


def win_rates(g: int, verdicts: Sequence[tuple[int, int, float]]) -> list[float | None]:
    """Each response's share of its comparisons won; ``verdicts`` are (i, j, w) with w = 1
    when i won, 0 when j won, ½ a tie. None for a response in no comparison."""
    won, played = [0.0] * g, [0] * g
    for i, j, w in verdicts:
        won[i] += w
        won[j] += 1.0 - w
        played[i] += 1
        played[j] += 1
    return [w / n if n else None for w, n in zip(won, played, strict=True)]


def bt_rewards(
    g: int, verdicts: Sequence[tuple[int, int, float]], prior: float = 0.1, iterations: int = 50
) -> list[float | None]:
    """Bradley–Terry strengths fitted to the group's verdicts, as σ(s_i − s̄) ∈ (0, 1).

    Maximises Σ_(i,j,w) [w·log σ(s_i − s_j) + (1 − w)·log σ(s_j − s_i)] − (prior/2)·Σ s_i²
    by Newton's method (the objective is concave; the ridge ``prior`` keeps the strengths
    finite when one response wins all its comparisons, and 0 gives the maximum-likelihood
    fit, unique up to a shift when the comparisons connect the group). None for a response
    in no comparison."""
    wins = torch.zeros(g, g, dtype=torch.float64)  # wins[i, j]: i over j, ties ½ each
    for i, j, w in verdicts:
        wins[i, j] += w
        wins[j, i] += 1.0 - w
    n = wins + wins.T
    s = torch.zeros(g, dtype=torch.float64)
    for _ in range(iterations):
        p = torch.sigmoid(s[:, None] - s[None, :])  # p[i, j] = P(i beats j)
        grad = (wins - n * p).sum(1) - prior * s
        c = n * p * (1 - p)
        hessian = c - torch.diag(c.sum(1)) - prior * torch.eye(g, dtype=torch.float64)
        step = torch.linalg.lstsq(hessian, grad[:, None]).solution[:, 0]  # min-norm: no shift
        s = s - step
        if float(step.abs().max()) < 1e-10:
            break
    strength = torch.sigmoid(s - s.mean()).tolist()
    played = n.sum(1)
    return [x if played[i] > 0 else None for i, x in enumerate(strength)]


AGGREGATE: dict[str, Callable[[int, Sequence[Verdict]], list[float | None]]] = {
    "winrate": win_rates,
    "bt": bt_rewards,
}


@dataclass
class ComparisonReward:
    """Per-response rewards from pairwise verdicts within each group (module docstring).

    Trajectories are grouped by ``metadata["group"]`` (the prompt's group id); a
    trajectory without one is a group of its own, and so has no comparison (``INVALID``
    would be the model's fault: it is ``INFRA_ERROR``, a misuse)."""

    client: JudgeClient
    template: str
    aggregate: Literal["winrate", "bt"] = "winrate"
    pairs: int | None = None
    position_check: float = 0.0
    repeat_check: float = 0.0
    seed: int = 0
    name: str = "comparison"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        groups = _groups(batch)
        asks: list[tuple[int, int]] = []  # (first shown, second shown), batch indices
        ties: list[Verdict] = []  # the same text twice: a tie, never asked
        rng = random.Random(_batch_seed(self.seed, [t.prompt + t.response for t in batch]))
        for members in groups.values():
            if len(members) < 2:
                continue
            for i, j in pair_design(len(members), bounded_pairs(self.pairs, len(members))):
                a, b = members[i], members[j]
                if batch[a].response == batch[b].response:
                    ties.append((a, b, 0.5))
                else:
                    asks.append((a, b) if rng.random() < 0.5 else (b, a))
        swapped = [(b, a) for a, b in asks if rng.random() < self.position_check]
        again = [x for x in asks if rng.random() < self.repeat_check]
        shown = asks + swapped
        prompts = [self._prompt(batch, a, b) for a, b in shown + again]
        replies = self.client.ask(prompts, fresh=[False] * len(shown) + [True] * len(again))
        choices = [None if r.text is None else parse_choice(r.text) for r in replies]
        self._record(shown, again, choices, replies, len(ties))
        n = len(shown)
        return self._scores(batch, groups, shown, choices[:n], replies[:n], ties)

    def _prompt(self, batch: Sequence[Trajectory], a: int, b: int) -> str:
        t = batch[a]
        return self.template.format(
            prompt=t.prompt, first=t.response, second=batch[b].response, reference=t.reference
        )

    def _record(
        self,
        shown: list[tuple[int, int]],
        again: list[tuple[int, int]],
        choices: list[float | None],
        replies: list[Reply],
        ties: int,
    ) -> None:
        n = len(shown)
        outcome: dict[tuple[int, int], int | None] = {}  # (a, b) as shown → preferred; None: tie
        for (a, b), c in zip(shown, choices[:n], strict=True):
            if c is not None:
                outcome[a, b] = None if c == 0.5 else (a, b)[int(c)]
        stats = self.client.stats
        with stats.lock:
            stats.pairs += n + ties
            stats.invalid += sum(
                r.text is not None and c is None for r, c in zip(replies, choices, strict=True)
            )
            stats.first_preferred += [c == 0 for c in choices[:n] if c is not None and c != 0.5]
            for (a, b), w in outcome.items():
                if (b, a) in outcome and a < b:  # shown both ways: one observation per pair
                    stats.position.append(w == outcome[b, a])
            for (a, b), c in zip(again, choices[n:], strict=True):
                if c is not None and (a, b) in outcome:
                    stats.repeats.append((None if c == 0.5 else (a, b)[int(c)]) == outcome[a, b])

    def _scores(
        self,
        batch: Sequence[Trajectory],
        groups: dict[Any, list[int]],
        shown: list[tuple[int, int]],
        choices: list[float | None],
        replies: list[Reply],
        ties: list[Verdict],
    ) -> list[Score]:
        failures: dict[int, list[Reply]] = {}
        verdicts: dict[int, list[tuple[int, int, float]]] = {}  # by first shown: (a, b, w_a)
        for a, b, w in ties:
            verdicts.setdefault(a, []).append((a, b, w))
        for (a, b), c, r in zip(shown, choices, replies, strict=True):
            if c is None:
                why = f"judge: no A, B or TIE in {(r.text or '')[:60]!r}"
                bad = r if r.text is None else Reply(None, RewardStatus.INVALID, why)
                failures.setdefault(a, []).append(bad)
                failures.setdefault(b, []).append(bad)
            else:
                verdicts.setdefault(a, []).append((a, b, 1.0 - c))  # c = 0: a, the first, won
        out: list[Score | None] = [None] * len(batch)
        aggregate = AGGREGATE[self.aggregate]
        for members in groups.values():
            local = {k: m for m, k in enumerate(members)}
            seen = [(local[a], local[b], w) for k in members for a, b, w in verdicts.get(k, ())]
            rewards = aggregate(len(members), seen)
            for k, reward in zip(members, rewards, strict=True):
                if reward is not None:
                    out[k] = on_last_turn(Score(reward), batch[k])
                    with self.client.stats.lock:
                        self.client.stats.scored.append(_observed(reward, batch[k]))
                    continue
                lost = failures.get(k, [])
                status = worst(r.status for r in lost) if lost else RewardStatus.INFRA_ERROR
                reason = lost[0].reason if lost else "comparison: no other response to compare with"
                out[k] = Score.failed(status, reason)
        return [s for s in out if s is not None]


@dataclass
class LearnedComparison:
    """Per-response rewards from a learned pairwise model's verdicts within each group: the
    Bradley–Terry reward model's P(i ≻ j) = σ(r_i − r_j) on the same pair design, as a soft
    verdict (w = that probability), aggregated as :class:`ComparisonReward` does. The
    scores r come in ``metadata["learned"]`` (the loop scores the batch first); a
    trajectory without one is ``INFRA_ERROR``. No position probe: the verdict is symmetric
    by construction."""

    aggregate: Literal["winrate", "bt"] = "winrate"
    pairs: int | None = None
    stats: JudgeStats = field(default_factory=JudgeStats)
    name: str = "comparison"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        groups = _groups(batch)
        out: list[Score] = [Score.failed(RewardStatus.INFRA_ERROR, "comparison: no score")] * len(
            batch
        )
        for members in groups.values():
            scored = [k for k in members if "learned" in batch[k].metadata]
            if len(scored) < 2:
                continue
            pairs = pair_design(len(scored), bounded_pairs(self.pairs, len(scored)))
            r = [float(batch[k].metadata["learned"]) for k in scored]
            verdicts = [(i, j, 1.0 / (1.0 + math.exp(r[j] - r[i]))) for i, j in pairs]
            with self.stats.lock:
                self.stats.pairs += len(pairs)
            for k, reward in zip(
                scored, AGGREGATE[self.aggregate](len(scored), verdicts), strict=True
            ):
                if reward is not None:
                    out[k] = on_last_turn(Score(reward), batch[k])
                    with self.stats.lock:
                        self.stats.scored.append(_observed(reward, batch[k]))
        return out


def _groups(batch: Sequence[Trajectory]) -> dict[Any, list[int]]:
    """Batch indices by ``metadata["group"]``, in batch order; no group: a group of one."""
    groups: dict[Any, list[int]] = {}
    for k, t in enumerate(batch):
        groups.setdefault(t.metadata.get("group", ("alone", k)), []).append(k)
    return groups


def _batch_seed(seed: int, texts: Sequence[str]) -> int:
    """A seed of the run's seed and the batch's texts: the probes' draws repeat with them."""
    h = hashlib.blake2b(str(seed).encode(), digest_size=8)
    for text in texts:
        h.update(text.encode())
    return int.from_bytes(h.digest(), "big")


def api_key(f: FeedbackParams) -> str | None:
    """The key in ``feedback.judge_api_key_env``'s variable; a one-line ConfigError naming
    the field when it is not set."""
    if f.judge_api_key_env is None:
        return None
    key = os.environ.get(f.judge_api_key_env)
    if not key:
        raise ConfigError(
            f"feedback.judge_api_key_env: the environment variable {f.judge_api_key_env} is not set"
        )
    return key


def judge_reward(
    f: FeedbackParams, seed: int
) -> PointwiseJudge | ComparisonReward | LearnedComparison:
    """The reward of ``feedback.source=judge`` (pointwise) or ``comparison`` (pairwise), its
    client built from the ``feedback.judge_*`` fields (validated in config); comparisons
    by the learned reward model need no client."""
    pairs = None if f.comparison_pairs == "all" else f.comparison_pairs
    if not f.uses_judge:
        return LearnedComparison(aggregate=f.comparison, pairs=pairs)
    assert f.judge_url is not None  # validated: a judged source needs one
    client = JudgeClient(
        f.judge_url,
        f.judge_model,
        timeout_s=f.judge_timeout_s,
        retries=f.judge_retries,
        concurrency=f.judge_concurrency,
        max_tokens=f.judge_max_tokens,
        temperature=f.judge_temperature,
        api_key=api_key(f),
    )
    if f.source == "judge":
        return PointwiseJudge(
            client,
            load_template(f.judge_template, "pointwise"),
            lo=f.judge_min,
            hi=f.judge_max,
            repeat_check=f.judge_repeat_check,
            seed=seed,
        )
    return ComparisonReward(
        client,
        load_template(f.judge_template, "pairwise"),
        aggregate=f.comparison,
        pairs=pairs,
        position_check=f.judge_position_check,
        repeat_check=f.judge_repeat_check,
        seed=seed,
    )


def judge_samples(reward: object, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Add a pointwise judge's verdict on each held-out sample row (its final answer) as
    ``judge`` (the reward, or None) and ``judge_status``, and return what that cost
    (``eval/judge/calls``, ``eval/judge/prompt_tokens``, ``eval/judge/completion_tokens``)
    and the mean verdict (``eval/judge/mean``); nothing for other rewards. The requests go
    through the training judge's cache, not into its ``judge/*`` (the bias probes read
    training rollouts only)."""
    if not isinstance(reward, PointwiseJudge) or not rows:
        return {}
    own = replace(reward, client=replace(reward.client, stats=JudgeStats()), repeat_check=0.0)
    seen = [
        Trajectory(
            prompt=r["prompt"],
            turns=(r["answer"],),
            reference=r["reference"],
            length=r["length"],
            max_length=max(r["length"], 1),
            metadata={"rewards": (r["reward"],)},
        )
        for r in rows
    ]
    scores = score_batch(own, seen)
    for row, score in zip(rows, scores, strict=True):
        row["judge"] = score.value if score.ok else None
        row["judge_status"] = score.status.name.lower()
    spent = own.client.stats.drain()
    ok = [s.value for s in scores if s.ok]
    return {
        f"eval/{k}": spent[k]
        for k in ("judge/calls", "judge/prompt_tokens", "judge/completion_tokens")
    } | ({"eval/judge/mean": sum(ok) / len(ok)} if ok else {})


def judge_metrics(reward: object) -> dict[str, float]:
    """The ``judge/*`` metrics since the last call, when ``reward`` is a judge or a learned
    comparison; else none."""
    client = getattr(reward, "client", None)
    stats = client.stats if isinstance(client, JudgeClient) else getattr(reward, "stats", None)
    return stats.drain() if isinstance(stats, JudgeStats) else {}
