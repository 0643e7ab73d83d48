"""The budget ledger: immutable updates, JSON round trip, peak memory."""

from __future__ import annotations

import json

import pytest
import torch

from rlmap.experiments.ledger import Ledger, measure_peak_memory


def test_add_returns_a_new_ledger_and_leaves_the_old_one() -> None:
    start = Ledger(epochs_per_batch=2, effective_batch=64, reduction="global_token_mean")
    one = start.add(generated_tokens=100, prompts=8, rollouts=64, learner_steps=2, wall_clock_s=1.5)
    two = one.add(generated_tokens=50, filtered_rollouts=16, rejected_rollouts=1, wall_clock_s=0.5)
    assert start.generated_tokens == 0 and one.generated_tokens == 100
    assert (two.generated_tokens, two.prompts, two.rollouts, two.learner_steps) == (150, 8, 64, 2)
    assert (two.filtered_rollouts, two.rejected_rollouts, two.wall_clock_s) == (16, 1, 2.0)
    # settings ride along unchanged
    assert (two.epochs_per_batch, two.effective_batch, two.reduction) == (
        2,
        64,
        "global_token_mean",
    )


def test_counters_only_grow_and_fields_are_frozen() -> None:
    with pytest.raises(ValueError, match=r"negative \['prompts'\]"):
        Ledger().add(prompts=-1)
    with pytest.raises(AttributeError):
        Ledger().prompts = 3  # type: ignore[misc]


def test_peak_memory_is_the_max_over_measurements() -> None:
    ledger = Ledger().with_peak_memory(1000, None)
    assert (ledger.peak_host_memory_kib, ledger.peak_gpu_memory_bytes) == (1000, None)
    ledger = ledger.with_peak_memory(800, 5).with_peak_memory(900, 3)
    assert (ledger.peak_host_memory_kib, ledger.peak_gpu_memory_bytes) == (1000, 5)


def test_measure_peak_memory_reports_this_process() -> None:
    host_kib, gpu_bytes = measure_peak_memory()
    assert host_kib > 10_000  # a process that imported torch holds more than 10 MiB
    assert (gpu_bytes is None) == (not torch.cuda.is_available())


def test_dict_round_trip_through_json() -> None:
    ledger = Ledger(engine="hf-cpu", precision="fp32", denominator="fixed: 4096 tokens")
    ledger = ledger.add(generated_tokens=7, wall_clock_s=0.25).with_peak_memory(123, None)
    assert Ledger.from_dict(json.loads(json.dumps(ledger.to_dict()))) == ledger
    assert Ledger.from_dict({"prompts": 3}) == Ledger(prompts=3)  # absent fields default


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match=r"unknown fields \['tokens'\]"):
        Ledger.from_dict({"tokens": 3})


def test_budget_metrics() -> None:
    ledger = Ledger().add(generated_tokens=10, prompts=2, learner_steps=1, critic_steps=4,
                          wall_clock_s=3)  # fmt: skip
    assert ledger.metrics() == {
        "budget/generated_tokens": 10.0,
        "budget/prompts": 2.0,
        "budget/learner_steps": 1.0,
        "budget/critic_steps": 4.0,
        "budget/wall_clock_s": 3.0,
    }


def test_a_ledger_written_before_the_critic_existed_reads_with_zero_critic_steps() -> None:
    old = Ledger(engine="hf").add(generated_tokens=5, learner_steps=2).to_dict()
    del old["critic_steps"]  # what ledger.json held before the field was added
    ledger = Ledger.from_dict(old)
    assert (ledger.critic_steps, ledger.learner_steps, ledger.generated_tokens) == (0, 2, 5)
    assert ledger.add(critic_steps=3).critic_steps == 3
