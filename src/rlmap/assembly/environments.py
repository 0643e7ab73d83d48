"""How a run's episodes are scored: its verifiers (isolated when asked), the task's
environments around them, held-out scoring and the environment's latency."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from rlmap import feedback
from rlmap.feedback.isolation import IsolatedVerifier, Verify
from rlmap.recipes.config import RecipeConfig
from rlmap.simulator.inputs import parse_duration
from rlmap.tasks.env import EnvFactory
from rlmap.tasks.kind import Scoring
from rlmap.tasks.prompts import PromptEncoder
from rlmap.tasks.registry import kind_of


def make_verifier(cfg: RecipeConfig, name: str) -> Verify:
    """The named verifier, in its own process when ``feedback.timeout_s`` is set or the
    verifier is always isolated (then with ``ISOLATION_TIMEOUT_S`` by default)."""
    entry = feedback.registry.get(name)
    timeout = cfg.feedback.timeout_s
    if timeout is None and entry.isolated:
        timeout = feedback.ISOLATION_TIMEOUT_S
    return entry.fn if timeout is None else IsolatedVerifier(entry.fn, timeout)


def environment_factory(
    cfg: RecipeConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    verifier: str | None = None,
    latency: bool = False,
) -> EnvFactory:
    """The task's environment maker (its kind's: the calculator tool task, a gym or
    verifiers environment, or one answer per prompt).

    ``verifier`` names the verifier (default ``feedback.verifier``; evaluation passes
    ``feedback.eval_verifier``); ``latency``: environment steps wait ``data.env_latency``.
    Raises ConfigError when the tokenizer cannot serve the task (checked once, here).
    """
    name = verifier or cfg.feedback.verifier
    verify, entry = make_verifier(cfg, name), feedback.registry.get(name)
    # in its own process when isolated (feedback.timeout_s): a call then waits on it
    waits = entry.waits or entry.isolated or cfg.feedback.timeout_s is not None
    encode = PromptEncoder(tokenizer)  # shared: the G episodes of a prompt encode it once
    scoring = Scoring(verify, entry.items, encode, waits, latency_source(cfg) if latency else None)
    return kind_of(cfg.data.task).environment(tokenizer, cfg.data, scoring)


def evaluation_scoring(
    cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[EnvFactory, Verify | None, bool]:
    """(held-out environments, the training verifier to rescore them with — only when
    ``feedback.eval_verifier`` names another one —, whether that verifier reads item keys).
    Evaluation never waits on latency."""
    f = cfg.feedback
    other = f.eval_verifier is not None and f.eval_verifier != f.verifier
    environment = environment_factory(cfg, tokenizer, verifier=f.eval_verifier)
    rescore = make_verifier(cfg, f.verifier) if other else None
    return environment, rescore, feedback.registry.get(f.verifier).items


def latency_source(cfg: RecipeConfig) -> Callable[[], float] | None:
    """Draws of ``data.env_latency`` (seeded by the run's seed, shared by all environments
    of the run under a lock), or None."""
    spec = cfg.data.env_latency
    if spec is None:
        return None
    stream = parse_duration(spec, flag="data.env_latency").stream(random.Random(cfg.seed))
    lock = threading.Lock()

    def draw() -> float:
        with lock:
            return next(stream)

    return draw
