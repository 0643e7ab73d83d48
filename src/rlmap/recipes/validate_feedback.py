"""Combination checks of the feedback axis: verifiers, process rewards, judges and
comparisons (:func:`rlmap.recipes.validate.validate` runs them with the rest)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from rlmap.feedback import process
from rlmap.feedback.params import FeedbackParams
from rlmap.recipes.config import RecipeConfig


def check_feedback(cfg: RecipeConfig) -> Iterator[str]:
    f = cfg.feedback
    if f.source == "process_reward" and f.process_reward is None:
        yield "feedback.process_reward: feedback.source=process_reward needs a scorer name"
    scorer = f.process_reward if f.source == "process_reward" else None
    if scorer is not None and scorer in process.registry:
        tasks = process.registry.get(scorer).tasks
        if cfg.data.task not in tasks:
            yield (
                f"feedback.process_reward: '{scorer}' reads records that only data.task="
                f"{' or '.join(tasks)} keeps, got data.task={cfg.data.task}"
            )
    for term, weight in (("format_pattern", "format_weight"), ("length_target", "length_weight")):
        value, w = getattr(f, term), getattr(f, weight)
        if (value is None) != (w == 0):
            yield (
                f"feedback.{weight}: goes with feedback.{term} (a term needs a non-zero "
                f"weight), got {term}={value!r}, {weight}={w}"
            )
    if f.format_pattern is not None:
        try:
            re.compile(f.format_pattern)
        except re.error as exc:
            yield f"feedback.format_pattern: not a regular expression ({exc})"
    timeout = cfg.feedback.timeout_s
    if timeout is not None and timeout <= 0:
        yield f"feedback.timeout_s: must be > 0 (or null: in-process), got {timeout}"
    yield from judge(cfg)
    cache = cfg.feedback.overlong_cache
    if cache is not None and not 0 < cache < cfg.generation.max_new_tokens:
        yield (
            f"feedback.overlong_cache: L_c must be in (0, generation.max_new_tokens="
            f"{cfg.generation.max_new_tokens}), got {cache}"
        )


JUDGE_DEFAULTS = FeedbackParams()


def judge(cfg: RecipeConfig) -> Iterator[str]:
    f = cfg.feedback
    if f.source not in ("judge", "comparison"):
        why = "only a judge uses it (feedback.source=judge or comparison), not "
        why += f"feedback.source={f.source}"
        yield from _unused(f, ("judge_", "comparison"), why)
        return
    yield from _comparisons(cfg)
    if not f.uses_judge:  # comparisons by the learned reward model
        why = "only an AI judge uses it, not feedback.comparison_model=reward_model"
        yield from _unused(f, ("judge_",), why)
        return
    yield from _judge_roles(f)
    yield from _judge_endpoint(cfg)


def _unused(f: FeedbackParams, prefixes: tuple[str, ...], why: str) -> Iterator[str]:
    """The first judge setting (named by ``prefixes``) changed from its default: ``why``."""
    for name in (x.name for x in dataclasses.fields(FeedbackParams) if x.name.startswith(prefixes)):
        if getattr(f, name) != getattr(JUDGE_DEFAULTS, name):
            yield f"feedback.{name}: {why}"
            return


def _judge_roles(f: FeedbackParams) -> Iterator[str]:
    """Settings of the other kind of judge: pairwise ones on a pointwise judge, and back."""
    pairwise_only = ("comparison", "comparison_model", "comparison_pairs", "judge_position_check")
    for name in pairwise_only if f.source == "judge" else ():
        if getattr(f, name) != getattr(JUDGE_DEFAULTS, name):
            yield (
                f"feedback.{name}: only pairwise comparisons use it "
                f"(feedback.source=comparison), not feedback.source=judge"
            )
    for name in ("judge_min", "judge_max") if f.source == "comparison" else ():
        if getattr(f, name) != getattr(JUDGE_DEFAULTS, name):
            yield (
                f"feedback.{name}: only a pointwise judge rates (feedback.source=judge), "
                f"not feedback.source=comparison"
            )


def _judge_endpoint(cfg: RecipeConfig) -> Iterator[str]:
    """Where the judge's requests go, and how they are made."""
    f = cfg.feedback
    s = cfg.system
    if s.backend == "ray" or s.learners > 1:
        where = "system.backend" if s.backend == "ray" else "system.learners"
        yield (
            f"{where}: a judge's requests would be made (and counted) outside the "
            f"learner's process; with feedback.source={f.source} use "
            f"system.backend=inprocess and system.learners=1"
        )
    if f.judge_url is None:
        yield f"feedback.judge_url: feedback.source={f.source} needs the judge's endpoint"
    elif not f.judge_url.startswith(("http://", "https://")):
        yield f"feedback.judge_url: an http(s):// URL ending in /v1, got {f.judge_url!r}"
    if not f.judge_min < f.judge_max:
        yield f"feedback.judge_max: must exceed judge_min={f.judge_min}, got {f.judge_max}"
    for name in ("judge_position_check", "judge_repeat_check"):
        if not 0.0 <= getattr(f, name) <= 1.0:
            yield f"feedback.{name}: a fraction in [0, 1], got {getattr(f, name)}"
    for name, low in (("judge_concurrency", 1), ("judge_retries", 0), ("judge_max_tokens", 1)):
        if getattr(f, name) < low:
            yield f"feedback.{name}: must be >= {low}, got {getattr(f, name)}"
    if not f.judge_timeout_s > 0 or f.judge_temperature < 0:
        yield (
            f"feedback.judge_timeout_s: must be > 0 (and judge_temperature >= 0), got "
            f"{f.judge_timeout_s} ({f.judge_temperature})"
        )


def _comparisons(cfg: RecipeConfig) -> Iterator[str]:
    f, g = cfg.feedback, cfg.sampling.group_size
    if f.source != "comparison":
        return
    if g < 2:
        yield f"sampling.group_size: feedback.source=comparison compares within a group, got {g}"
    k = f.comparison_pairs
    if k != "all" and g >= 2 and not g - 1 <= k <= g * (g - 1) // 2:
        yield (
            f"feedback.comparison_pairs: a group of {g} needs {g - 1} to {g * (g - 1) // 2} "
            f"pairs (connected, at most all), got {k}"
        )
