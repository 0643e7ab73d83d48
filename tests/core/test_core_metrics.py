"""The metric registry (rlmap.core.metrics): docs/metrics.md is its output, the check that
catches an undeclared name, and an old run's rows read under today's names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from metric_names import assert_declared, undeclared_names

from rlmap.core.metrics import (
    KINDS,
    METRICS,
    REDUCTIONS,
    lookup,
    markdown,
    unregistered,
    upgrade_row,
)

ROOT = Path(__file__).resolve().parents[2]


def test_docs_metrics_md_is_the_registry_generated() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert text == markdown(), "regenerate: python -m rlmap.core.metrics > docs/metrics.md"


def test_every_entry_is_well_formed_and_declared_once() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    for m in METRICS:
        assert m.kind in KINDS and m.reduction in REDUCTIONS, m.name
        assert m.meaning.endswith(".") and m.unit, m.name
        assert set(m.modes.split(", ")) <= {"sync", "async"}, m.name


def test_exact_names_and_patterns_match_and_a_planted_name_does_not() -> None:
    assert lookup("approx_kl") is not None
    assert lookup("errors/wrong_answer_frac") is not None  # errors/{class}_frac
    assert lookup("eval/leg_counting/pass@k") is not None  # eval/{task}/pass@k
    assert lookup("ratio/kappa/p99_abs_log") is not None  # ratio/{rho|kappa|d}/...
    assert lookup("ratio/pi/p99_abs_log") is None  # not one of the listed words
    assert lookup("errors/a/b_frac") is None  # {class} is one path segment
    # the one name of each failure: the old ones are not declared any more
    planted = ["reward/infra_error_frac", "sampling/infra_errors", "system/made_up_s"]
    assert unregistered(["step", "loss/policy", *planted]) == sorted(planted)


def test_the_run_check_fails_on_a_planted_name(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "reward/mean": 0.5}, {"step": 1, "system/tokens_per_s": 3.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{torn")
    assert_declared(tmp_path)  # declared names, and a torn last line skipped
    with (run / "metrics.jsonl").open("a") as f:
        f.write('\n{"step": 2, "sampling/kept_groups": 1}\n')
    assert undeclared_names(tmp_path) == {str(run / "metrics.jsonl"): ["sampling/kept_groups"]}
    with pytest.raises(AssertionError, match="sampling/kept_groups"):
        assert_declared(tmp_path)


# An old synchronous row: 8 rollouts, 1 infra error, 2 timeouts, 400 tokens generated in
# rollout_s = 2 s (old tokens_per_s = 400 / 2 = 200), update_s = 3 s.
OLD_SYNC = {
    "step": 1,
    "sampling/generated": 8,
    "sampling/generated_tokens": 400,
    "sampling/infra_errors": 1,
    "sampling/timeouts": 2,
    "reward/invalid_frac": 0.125,
    "system/rollout_s": 2.0,
    "system/update_s": 3.0,
    "system/tokens_per_s": 200.0,
}
# An old asynchronous row: rollout_s was the learner's wait (= learner_wait_s), tokens_per_s
# already per second of the whole step.
OLD_ASYNC = {
    "step": 1,
    "sampling/generated": 4,
    "sampling/generated_tokens": 100,
    "reward/infra_error_frac": 0.25,
    "system/rollout_s": 0.5,
    "system/learner_wait_s": 0.5,
    "system/queue_length": 3.0,
    "system/update_s": 1.5,
    "system/tokens_per_s": 50.0,
}


def test_an_old_synchronous_row_reads_under_todays_names() -> None:
    new = upgrade_row(OLD_SYNC)
    assert new["errors/infra_error_frac"] == 1 / 8 and new["errors/timeout_frac"] == 2 / 8
    assert new["errors/unparseable_frac"] == 0.125
    assert new["system/learner_wait_s"] == 2.0 and new["system/rollout_s"] == 2.0
    assert new["system/rollout_tokens_per_s"] == 200.0
    assert new["system/tokens_per_s"] == 80.0  # 400 tokens / (2 + 3) s
    assert new["system/learner_utilisation"] == 0.6  # 3 / (2 + 3)
    assert unregistered(new) == []
    assert not {"sampling/infra_errors", "reward/invalid_frac"} & set(new)


def test_an_old_asynchronous_row_loses_its_rollout_s_and_keeps_its_throughput() -> None:
    new = upgrade_row(OLD_ASYNC)
    assert "system/rollout_s" not in new and new["system/learner_wait_s"] == 0.5
    assert new["system/tokens_per_s"] == 50.0 and new["errors/infra_error_frac"] == 0.25
    assert unregistered(new) == []


def test_todays_rows_are_left_alone() -> None:
    today = {
        "step": 1,
        "errors/infra_error_frac": 0.5,
        "system/rollout_s": 2.0,
        "system/learner_wait_s": 2.0,
        "system/tokens_per_s": 10.0,
    }
    assert upgrade_row(today) == today
    # a new name already there wins over an old one beside it
    both = {"reward/timeout_frac": 0.9, "errors/timeout_frac": 0.1}
    assert upgrade_row(both) == {"errors/timeout_frac": 0.1}


def test_compare_and_diagnose_read_an_old_run_under_todays_names(tmp_path: Path) -> None:
    from rlmap.diagnostics.run import load_run

    (tmp_path / "metrics.jsonl").write_text(json.dumps(OLD_SYNC) + "\n")
    (record,) = load_run(tmp_path).records
    assert record["errors/infra_error_frac"] == 1 / 8 and record["system/tokens_per_s"] == 80.0


def test_every_metric_diagnose_reads_is_declared() -> None:
    from rlmap.diagnostics.rules import registry

    reads = {
        name
        for rule_name in registry.names()
        for interface in registry.get(rule_name).symptom.check
        for name in interface.reads
        if not name.startswith(("config:", "ledger:"))
    }
    assert "errors/infra_error_frac" in reads  # the empty-steps symptom's reward failures
    assert unregistered(reads) == []
