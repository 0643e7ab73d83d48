"""A verifier that crashes and hangs on some samples: training goes on, failures are
counted, and excluded from the loss and from their group's statistics."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlmap import estimators, feedback
from rlmap.core.batch import Batch, RewardStatus
from rlmap.estimators import CreditParams
from rlmap.experiments.train import run_training
from rlmap.feedback.verifiers import exact_match
from rlmap.recipes import build_config
from rlmap.system import sync

Toy = Callable[..., list[str]]


def faulty(response: str, reference: str) -> float:
    """Crashes on responses of length 0 mod 3, hangs on 1 mod 3, judges the rest."""
    if len(response) % 3 == 0:
        raise RuntimeError("verifier bug")
    if len(response) % 3 == 1:
        time.sleep(60)
    return exact_match(response, reference)


def test_a_faulty_verifier_costs_samples_not_the_run(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(feedback.registry._items, "faulty", feedback.Verifier(faulty, "test"))
    batches: list[Batch] = []
    real_learn = sync.learn

    def spy(p: Any, batch: Batch, state: Any, *rest: Any) -> dict[str, float]:
        batches.append(batch)
        return real_learn(p, batch, state, *rest)

    monkeypatch.setattr(sync, "learn", spy)
    overrides = [
        *toy(tiny_model_dir, steps=3),
        "feedback.verifier=faulty",
        "feedback.timeout_s=0.3",
    ]
    run_training(build_config("grpo", None, overrides), tmp_path / "run")

    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    steps = records[1:]
    assert len(steps) == 3  # the run finished
    # one name per failure: errors/<class>_frac of the step's generated rollouts
    infra = sum(round(r["errors/infra_error_frac"] * r["sampling/generated"]) for r in steps)
    timeouts = sum(round(r["errors/timeout_frac"] * r["sampling/generated"]) for r in steps)
    assert infra > 0 and timeouts > 0  # both faults happened ...
    assert ledger["infra_error_rollouts"] == infra and ledger["timeout_rollouts"] == timeouts
    assert ledger["rejected_rollouts"] == infra + timeouts  # ... and were counted
    for r in steps:  # the old names are gone: one failure, one name
        assert not {"reward/infra_error_frac", "sampling/infra_errors"} & set(r)

    # Excluded from the loss and from group statistics: failed rollouts never enter the
    # batch, so a group with a failed member is trained on its remaining members alone,
    # and the count of trained rows is generated − rejected.
    assert sum(b.size for b in batches) == sum(
        r["sampling/generated"] - r["sampling/rejected"] for r in steps
    )
    shrunk = 0
    for batch in batches:
        assert (batch.reward_status == RewardStatus.OK).all()
        credit = estimators.registry.get("grpo").fn(batch, CreditParams(estimator="grpo"))
        for g in torch.unique(batch.group_id):
            rows = batch.group_id == g
            shrunk += int(rows.sum()) < 4  # G = 4 in the toy config
            alone = estimators.registry.get("grpo").fn(batch.select(rows), CreditParams("grpo"))
            torch.testing.assert_close(credit.advantages[rows], alone.advantages)
    assert shrunk > 0  # some group did lose a member to a failure
