"""The synchronous loop's prompt draw (:func:`rlmap.system.sync.draw_prompts`): the data
order, epoch by epoch, and with rebalancing the revisits first and the stale prompts
skipped; and the loop state that carries the visits across a resume."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import torch

from rlmap.assembly.parts import Parts
from rlmap.recipes import build_config
from rlmap.sampling.rebalance import Visits
from rlmap.system.loop_state import LoopState
from rlmap.system.step_metrics import step_times
from rlmap.system.sync import draw_prompts
from rlmap.tasks.arithmetic import Example

POOL = [Example(prompt=f"{i}+0=", answer=str(i)) for i in range(10)]
"""Ten prompts, "i+0=" at index i, so a prompt names its index."""

EPOCH_0 = [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]
EPOCH_1 = [5, 6, 1, 2, 0, 8, 9, 3, 7, 4]
"""The data order of POOL at seed 0 (the grpo preset's): epoch e is
torch.randperm(10) under a generator seeded seed + e, written out here."""


def _parts(*extra: str) -> Parts:
    """What draw_prompts reads of the run's parts: its config, nothing else."""
    return cast(Parts, SimpleNamespace(cfg=build_config("grpo", None, list(extra))))


def test_the_written_out_orders_are_torchs_seeded_permutations() -> None:
    # the premise of the hand-written draws below: if torch's generator ever changes,
    # this says so first
    for seed, order in ((0, EPOCH_0), (1, EPOCH_1)):
        assert torch.randperm(10, generator=torch.Generator().manual_seed(seed)).tolist() == order


def test_without_rebalancing_the_draw_is_the_data_order() -> None:
    p = _parts()
    assert p.cfg.seed == 0 and not p.cfg.sampling.rebalance
    draw = draw_prompts(p, POOL, 3, Visits(), 4)
    # positions 3..6 of epoch 0: 5, 3, 9, 0
    assert [e.prompt for e in draw.examples] == ["5+0=", "3+0=", "9+0=", "0+0="]
    assert (draw.cursor, draw.skipped, draw.revisits) == (7, 0, 0)
    # across the epoch's end: positions 8, 9 of epoch 0 (6, 2), then 0, 1 of epoch 1 (5, 6)
    draw = draw_prompts(p, POOL, 8, Visits(), 4)
    assert [e.prompt for e in draw.examples] == ["6+0=", "2+0=", "5+0=", "6+0="]
    assert draw.cursor == 12


def test_a_draw_takes_revisits_first_and_skips_stale_prompts() -> None:
    p = _parts("sampling.rebalance=true", "sampling.rebalance_keep=0.01")
    stale = ("1+0=", "4+0=", "7+0=")  # the first three of epoch 0: 4, 1, 7
    visits = Visits(tuple((t, 5) for t in stale), ("gone", "7+0=", "8+0="))
    draw = draw_prompts(p, POOL, 0, visits, 4)
    # 4 // 2 = 2 revisits (of those in the pool, "gone" is not), then the order:
    # its three stale prompts are skipped (kept at 1 %: none of these three draws), and the
    # next two, 5 and 3, are taken; the cursor stands after the fifth
    assert [e.prompt for e in draw.examples] == ["7+0=", "8+0=", "5+0=", "3+0="]
    assert (draw.cursor, draw.skipped, draw.revisits) == (5, 3, 2)
    assert draw.visits.revisit == ()  # "gone" is another level's: dropped
    # a queue longer than half the step keeps the rest, in order
    long = Visits((), ("1+0=", "2+0=", "3+0="))
    assert draw_prompts(p, POOL, 0, long, 4).visits.revisit == ("3+0=",)


def test_a_saved_loop_state_comes_back_with_its_visits() -> None:
    from dataclasses import asdict

    state = LoopState(step=2, visits=Visits((("a", 2),), ("b",)))
    assert LoopState.saved(asdict(state)) == state
    old = {k: v for k, v in asdict(LoopState()).items() if k != "visits"}  # before rebalancing
    assert LoopState.saved(old) == LoopState()


def test_both_loops_split_a_step_into_the_wait_and_the_rest_by_hand() -> None:
    # waited 3 s for the batch (sync: the rollout; async: the queue), 1 s for the rest,
    # 200 tokens generated: utilisation 1 / (3 + 1) = 0.25, throughput 200 / 4 = 50 tokens/s
    assert step_times(3.0, 1.0, 200.0) == {
        "system/learner_wait_s": 3.0,
        "system/update_s": 1.0,
        "system/learner_utilisation": 0.25,
        "system/tokens_per_s": 50.0,
    }
