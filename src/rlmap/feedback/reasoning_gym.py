"""reasoning-gym's own scoring, as verifiers: ``reasoning_gym`` and ``reasoning_gym_partial``.

The reference of a reasoning-gym example is its item's key — task, generator settings, seed,
dataset size, index — as JSON (:func:`item_key`), from which the item is regenerated exactly,
metadata and all, in whichever process scores it (the verifiers run in their isolation
worker: code rlmap does not control). reasoning-gym gives partial credit on some tasks (its
default: a response that *contains* the answer scores len(answer)/len(response));
``reasoning_gym`` (:func:`score_full`) counts only a full score, 1 or 0, which is what
pass@k means; ``reasoning_gym_partial`` (:func:`score`) passes the score through.
The tasks themselves are :mod:`rlmap.tasks.reasoning_gym`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from rlmap.core.errors import ConfigError


def require() -> Any:
    """The ``reasoning_gym`` module, or a ConfigError saying how to get it."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "data.task: reasoning-gym tasks need the reasoning-gym package "
            "(pip install reasoning-gym==0.1.25)"
        ) from None
    return reasoning_gym


@functools.lru_cache(maxsize=64)
def dataset(name: str, args: str, seed: int, size: int) -> Any:
    """A reasoning-gym dataset (``args``: its settings as JSON, so that it caches);
    ConfigError naming ``data.task_args`` on settings its config refuses."""
    rg = require()
    try:
        return rg.create_dataset(name, seed=seed, size=size, **json.loads(args))
    except (TypeError, ValueError, AssertionError) as exc:
        why = str(exc) or type(exc).__name__
        raise ConfigError(
            f"data.task_args: reasoning-gym's {name} refuses its settings ({why})"
        ) from None


def item_key(name: str, args: str, seed: int, size: int, index: int) -> str:
    """The reference of item ``index`` of ``dataset(name, args, seed, size)``."""
    key = {"task": name, "args": json.loads(args), "seed": seed, "size": size, "index": index}
    return json.dumps(key, sort_keys=True)


@functools.lru_cache(maxsize=65536)
def _entry(reference: str) -> tuple[Any, dict[str, Any]]:
    """(its dataset, item) of the item a reference names."""
    try:
        key = json.loads(reference)
        items = dataset(
            key["task"], json.dumps(key["args"], sort_keys=True), key["seed"], key["size"]
        )
        return items, dict(items[key["index"]])
    except (ValueError, KeyError, TypeError, ConfigError) as exc:
        raise ValueError(
            f"reasoning_gym: the reference is not a reasoning-gym item's key ({exc}); this "
            "verifier needs data.task=reasoning_gym:..."
        ) from None


def score(response: str, reference: str) -> float:
    """reasoning-gym's own ``score_answer`` of the response for the item ``reference``
    names (its key, as :func:`item_key` writes it); partial credit included. The dataset
    that made the item scores it: some tasks score by their settings (a tolerance, a
    precision), which ``reasoning_gym.get_score_answer_fn`` would take at their defaults."""
    items, entry = _entry(reference)
    return float(items.score_answer(response.strip(), entry))


def score_full(response: str, reference: str) -> float:
    """1.0 when reasoning-gym gives the response the full score, else 0.0."""
    return float(score(response, reference) >= 1.0)
