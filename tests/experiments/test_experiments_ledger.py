"""The budget ledger: immutable updates, JSON round trip, peak memory, compute shares."""

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
    assert ledger.peak_rollout_gpu_memory_bytes is None  # never measured
    ledger = ledger.with_peak_memory(0, None, 8).with_peak_memory(0, 2, None)
    assert (ledger.peak_gpu_memory_bytes, ledger.peak_rollout_gpu_memory_bytes) == (5, 8)


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
    ledger = Ledger().add(
        generated_tokens=10,
        prompts=2,
        learner_steps=1,
        critic_steps=4,
        wall_clock_s=3,
        empty_steps=1,
        judge_calls=6,
        judge_tokens=70,
        comparison_pairs=5,
        skipped_prompts=9,
    )
    assert ledger.metrics() == {
        "budget/generated_tokens": 10.0,
        "budget/prompts": 2.0,
        "budget/learner_steps": 1.0,
        "budget/critic_steps": 4.0,
        "budget/empty_steps": 1.0,
        "budget/skipped_prompts": 9.0,
        "budget/judge_calls": 6.0,
        "budget/judge_tokens": 70.0,
        "budget/comparison_pairs": 5.0,
        "budget/wall_clock_s": 3.0,
        "budget/rollout_s": 0.0,
        "budget/actor_s": 0.0,
        "budget/critic_s": 0.0,
        "budget/reference_s": 0.0,
    }
    spent = ledger.add(rollout_s=2.5, actor_s=1.0, critic_s=0.5, reference_s=0.25).metrics()
    assert (spent["budget/rollout_s"], spent["budget/actor_s"]) == (2.5, 1.0)
    assert (spent["budget/critic_s"], spent["budget/reference_s"]) == (0.5, 0.25)


def test_a_ledger_written_before_the_critic_existed_reads_with_zero_critic_steps() -> None:
    old = Ledger(engine="hf").add(generated_tokens=5, learner_steps=2).to_dict()
    del old["critic_steps"]  # what ledger.json held before the field was added
    ledger = Ledger.from_dict(old)
    assert (ledger.critic_steps, ledger.learner_steps, ledger.generated_tokens) == (0, 2, 5)
    assert ledger.add(critic_steps=3).critic_steps == 3


def test_add_accumulates_compute_seconds_per_model() -> None:
    one = Ledger().add(rollout_s=4.0, actor_s=1.5, critic_s=0.5, reference_s=0.25)
    two = one.add(rollout_s=2.0, actor_s=0.5, critic_s=1.5)  # no reference this step
    assert (one.rollout_s, one.actor_s, one.critic_s, one.reference_s) == (4.0, 1.5, 0.5, 0.25)
    assert (two.rollout_s, two.actor_s, two.critic_s, two.reference_s) == (6.0, 2.0, 2.0, 0.25)
    assert two.learner_s == 4.25  # 2.0 + 2.0 + 0.25
    with pytest.raises(ValueError, match=r"negative \['critic_s'\]"):
        two.add(critic_s=-1.0)


def test_compute_share_by_hand() -> None:
    # actor 3 s, critic 4 s, reference 1 s: learner compute 8 s, so the shares are
    # 3/8 = 0.375, 4/8 = 0.5, 1/8 = 0.125. Sampling 24 s of 24 + 8 = 32 s: 0.75.
    ledger = Ledger().add(rollout_s=24.0, actor_s=3.0, critic_s=4.0, reference_s=1.0)
    share = ledger.compute_share()
    assert share == {
        "actor": 0.375,
        "critic": 0.5,
        "reference": 0.125,
        "rollout_of_total": 0.75,
        "seconds": {"rollout": 24.0, "actor": 3.0, "critic": 4.0, "reference": 1.0},
    }


def test_learner_shares_sum_to_one() -> None:
    # Awkward seconds (none an exact binary fraction of the sum): the shares still sum to 1.
    ledger = Ledger().add(rollout_s=0.7, actor_s=0.1, critic_s=0.2, reference_s=0.3)
    share = ledger.compute_share()
    assert share["actor"] + share["critic"] + share["reference"] == pytest.approx(1.0, abs=1e-12)
    assert share["reference"] > share["critic"] > share["actor"] > 0


def test_without_a_critic_or_reference_the_actor_has_all_the_learner_compute() -> None:
    share = Ledger().add(rollout_s=1.0, actor_s=3.0).compute_share()
    assert (share["actor"], share["critic"], share["reference"]) == (1.0, 0.0, 0.0)
    assert share["rollout_of_total"] == 0.25  # 1 / (1 + 3)


def test_compute_share_with_nothing_spent_is_all_zero_not_a_division_by_zero() -> None:
    share = Ledger().compute_share()  # a run of 0 steps, or a ledger from before the fields
    assert share == {
        "actor": 0.0,
        "critic": 0.0,
        "reference": 0.0,
        "rollout_of_total": 0.0,
        "seconds": {"rollout": 0.0, "actor": 0.0, "critic": 0.0, "reference": 0.0},
    }
    only_sampling = Ledger().add(rollout_s=2.0).compute_share()  # learner never ran
    assert (only_sampling["actor"], only_sampling["rollout_of_total"]) == (0.0, 1.0)


def test_a_ledger_written_before_compute_seconds_existed_reads_with_zeros() -> None:
    old = Ledger(engine="hf").add(generated_tokens=5, learner_steps=2, critic_steps=1).to_dict()
    for name in ("rollout_s", "actor_s", "critic_s", "reference_s"):
        del old[name]  # what ledger.json held before the fields were added
    ledger = Ledger.from_dict(old)
    assert (ledger.rollout_s, ledger.actor_s, ledger.critic_s, ledger.reference_s) == (0, 0, 0, 0)
    assert (ledger.generated_tokens, ledger.learner_steps, ledger.critic_steps) == (5, 2, 1)
    assert ledger.add(actor_s=1.0, critic_s=3.0).compute_share()["critic"] == 0.75  # 3 / (1 + 3)


@pytest.mark.parametrize(
    ("generated", "kept", "rejected", "filtered"),
    [
        # nothing filtered: 24 − 23 − 1 = 0, where int(24 · (1 − 23/24)) − 1 gave −1 (the
        # fraction rounds down: 24 · (1/24) = 0.99999…) and broke the ledger ("counters only
        # grow")
        (24, 23, 1, 0),
        (10, 9, 1, 0),  # 10 − 9 − 1 = 0, where int(10 · (1 − 0.9)) − 1 gave −1 likewise
        (48, 40, 3, 5),  # 48 − 40 − 3 = 5
    ],
)
def test_filtered_rollouts_are_counted_not_rounded(
    generated: int, kept: int, rejected: int, filtered: int
) -> None:
    from rlmap.experiments.train_step import filtered_rollouts

    metrics = {
        "sampling/generated": float(generated),
        "sampling/kept": float(kept),
        "sampling/rejected": float(rejected),
    }
    n = filtered_rollouts(metrics)
    assert n == filtered
    Ledger().add(filtered_rollouts=n, rejected_rollouts=rejected)  # accepted
