"""Preference pairs from the embedded task, and the cached embedded reward model.

A pair prefers the correct answer to a plausible wrong one: the answer with its last
digit changed (the warm start's own kind of mistake, half the pairs), the answer
moved by 1 to 10 (a quarter), or another number of the same length (a quarter).
With probability ``noise`` a training pair's label is flipped — annotators disagree.
Held-out pairs come from held-out prompts and are never flipped, so their accuracy
measures what the model learned, not the noise.

The embedded default's reward model (``classic-rlhf`` without ``model.reward_path``)
is trained on these pairs from the warm-start checkpoint's trunk and cached, as the
warm start is, by a content hash of everything that determines it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlmap.embedded.warmstart import WarmStartSpec, cache_root, warm_start
from rlmap.learned.reward_model import (
    Pair,
    RewardModelSpec,
    save_reward_model,
    train_reward_model,
)
from rlmap.tasks.arithmetic import Example, make_splits

FORMAT_VERSION = 1


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer to an integer ``answer`` (never equal to it)."""
    value = int(answer)
    kind = rng.random()
    if kind < 0.5:
        digit = rng.choice([d for d in "0123456789" if d != answer[-1]])
        return answer[:-1] + digit
    if kind < 0.75:
        return str(value + rng.choice([-1, 1]) * rng.randint(1, 10))
    low, high = 10 ** (len(answer.lstrip("-")) - 1), 10 ** len(answer.lstrip("-")) - 1
    other = rng.randint(0 if low == 1 else low, high)
    return str(other) if other != abs(value) else str(other + 1)


def make_pairs(examples: Sequence[Example], n: int, noise: float, rng: random.Random) -> list[Pair]:
    """``n`` pairs over ``examples`` (cycled in a shuffled order), labels flipped w.p. ``noise``."""
    order = list(examples)
    rng.shuffle(order)
    pairs = []
    for k in range(n):
        e = order[k % len(order)]
        wrong = wrong_answer(e.answer, rng)
        flip = rng.random() < noise
        pairs.append(Pair(e.prompt, wrong, e.answer) if flip else Pair(e.prompt, e.answer, wrong))
    return pairs


@dataclass(frozen=True)
class PreferenceSpec:
    """Everything that determines the embedded reward model (besides the warm start)."""

    pairs: int = 4000
    """Training pairs (from the training prompts)."""
    heldout_pairs: int = 512
    """Noise-free pairs from the held-out prompts, for pairwise accuracy."""
    noise: float = 0.1
    """Probability that a training pair's label is flipped."""
    seed: int = 0
    train: RewardModelSpec = field(default_factory=RewardModelSpec)


def embedded_pairs(ws: WarmStartSpec, spec: PreferenceSpec) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs) of the embedded task's splits."""
    train, heldout = make_splits(
        ws.split_seed, ws.train_size, ws.eval_size, max_digits=ws.max_digits, ops=ws.ops
    )
    rng = random.Random(spec.seed)
    return (
        make_pairs(train, spec.pairs, spec.noise, rng),
        make_pairs(heldout, spec.heldout_pairs, 0.0, rng),
    )


def embedded_reward_model(
    ws: WarmStartSpec,
    spec: PreferenceSpec,
    *,
    progress: Callable[[int, int, float], None] | None = None,
) -> Path:
    """The cached reward model of the embedded default, trained now if not cached yet."""
    payload = {"warm_start": ws.digest(), "spec": asdict(spec), "format": FORMAT_VERSION}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    final = cache_root() / "reward_model" / digest
    if (final / "config.json").exists():
        return final
    base = warm_start(ws)
    train, heldout = embedded_pairs(ws, spec)
    model, tokenizer, metrics = train_reward_model(
        base, train, heldout, spec.train, progress=progress
    )
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    info: dict[str, object] = {"base": str(base), "spec": asdict(spec), **metrics}
    save_reward_model(tmp, model, tokenizer, info)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, final)
    except OSError:  # another process finished first; its model is the same
        shutil.rmtree(tmp, ignore_errors=True)
    return final
