"""The seeds of the asynchronous loop's rounds, for its repeatable mode
(``system.deterministic``, :mod:`rlmap.system.async_loop`): each round samples under
generators seeded from (run seed, worker, round), in-process or in a Ray actor."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def round_seed(seed: int, worker: int, round_: int) -> int:
    """A seed of its own for each (run seed, worker, round), below 2⁶³ as torch takes them: a
    63-bit hash, so distinct triples collide with probability ~2⁻⁶³."""
    digest = hashlib.blake2b(f"{seed}/{worker}/{round_}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Python's, numpy's and torch's generators seeded with ``seed`` inside the block, and
    as they were afterwards (the learner's own draws do not depend on the rounds run).
    CUDA's generators are saved only where CUDA has started (a round on a GPU engine
    started it; a CPU run never does, and reading them would start it)."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # CUDA's generators too (lazily, where CUDA has not started)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
