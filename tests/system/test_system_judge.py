"""Training on an AI judge's verdicts over HTTP (a real server on loopback): pointwise and
pairwise; a judge that dies mid-run costs counted failures, never zeros; a biased judge is
flagged by ``rlmap diagnose``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from judge_server import JudgeServer, always_first, correct_first, correct_score

from rlmap.assembly.checks import check_inputs
from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.diagnostics.report import diagnose
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config

Toy = Callable[..., list[str]]


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _train(run: Path, url: str, toy: Toy, model: Path, *extra: str, steps: int = 3) -> None:
    cfg = build_config(
        "grpo", None, [*toy(model, steps=steps), f"feedback.judge_url={url}", *extra]
    )
    check_inputs(cfg)
    run_training(cfg, run)


def test_a_pointwise_judge_trains_and_its_calls_are_in_the_ledger(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    with JudgeServer(correct_score) as server:
        _train(tmp_path / "run", server.url, toy, tiny_model_dir, "feedback.source=judge")
    records = _records(tmp_path / "run")
    steps = records[1:]
    assert len(steps) == 3
    for r in steps:  # 2 prompts × 4 samples scored by the judge, the verifier beside it
        assert r["judge/calls"] + r["judge/cache_hits"] == 8 and r["judge/failed"] == 0
        assert "reward/verifier_mean" in r and r["errors/infra_error_frac"] == 0
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    spent = [r.get(k, 0.0) for r in records for k in ("judge/calls", "eval/judge/calls")]
    assert ledger["judge_calls"] == sum(spent) == server.requests  # rollouts and samples
    assert records[0]["eval/judge/calls"] > 0  # the held-out samples before training
    tokens = [
        r.get(f"{e}judge/{k}_tokens", 0.0)
        for r in records
        for e in ("", "eval/")
        for k in ("prompt", "completion")
    ]
    assert ledger["judge_tokens"] == sum(tokens) > 0
    assert records[-1]["budget/judge_calls"] == ledger["judge_calls"]
    sample = json.loads((tmp_path / "run" / "samples" / "step_3.jsonl").read_text().splitlines()[0])
    assert sample["judge_status"] == "ok"  # the judge's verdict beside the verifier's
    assert sample["judge"] == (1.0 if sample["correct"] else 0.2)  # correct_score: 10 or 2


@pytest.mark.parametrize("comparison", ["winrate", "bt"])
def test_comparisons_train_with_a_bounded_number_of_pairs(
    comparison: str, tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    with JudgeServer(correct_first) as server:
        _train(
            tmp_path / "run",
            server.url,
            toy,
            tiny_model_dir,
            "feedback.source=comparison",
            f"feedback.comparison={comparison}",
            "feedback.comparison_pairs=4",
            "feedback.judge_position_check=0.5",
        )
    steps = _records(tmp_path / "run")[1:]
    for r in steps:  # 2 groups × 4 pairs, and about half of them again the other way round
        assert 8 <= r["judge/pairs"] <= 16 and r["sampling/rejected"] == 0
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["comparison_pairs"] == sum(r["judge/pairs"] for r in steps)


def test_a_judge_killed_mid_run_costs_counted_failures_never_zeros(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    server = JudgeServer(correct_score).__enter__()

    def kill_after_two_steps() -> None:  # 8 requests a step
        while server.requests < 16:
            threading.Event().wait(0.01)
        server.__exit__(None, None, None)

    killer = threading.Thread(target=kill_after_two_steps, daemon=True)
    killer.start()
    _train(
        tmp_path / "run",
        server.url,
        toy,
        tiny_model_dir,
        "feedback.source=judge",
        "feedback.judge_retries=1",
        "feedback.judge_timeout_s=2",
        steps=4,
    )
    killer.join(timeout=5)
    steps = _records(tmp_path / "run")[1:]
    assert len(steps) == 4  # the run went on
    assert steps[0]["errors/infra_error_frac"] == 0
    dead = steps[-1]  # every request failed; a reply still cached (the same response) did not
    failed = round(
        (dead["errors/infra_error_frac"] + dead["errors/timeout_frac"]) * dead["sampling/generated"]
    )
    assert failed == dead["judge/failed"] > 0 and dead["judge/calls"] == 2 * failed  # 1 retry
    assert failed + dead["judge/cache_hits"] == dead["sampling/generated"]
    assert dead["sampling/rejected"] == failed  # excluded and counted, never scored 0
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["infra_error_rollouts"] + ledger["timeout_rollouts"] >= 8
    assert ledger["empty_steps"] >= 1


def test_a_position_biased_judge_is_flagged_by_diagnose(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, capsys: pytest.CaptureFixture[str]
) -> None:
    with JudgeServer(always_first) as server:
        _train(
            tmp_path / "run",
            server.url,
            toy,
            tiny_model_dir,
            "feedback.source=comparison",
            "feedback.judge_position_check=1",
        )
    steps = _records(tmp_path / "run")[1:]
    assert all(r["judge/position_agreement"] == 0.0 for r in steps)
    assert all(r["judge/first_preferred_frac"] == 1.0 for r in steps)
    assert [f.symptom for f in diagnose(tmp_path / "run").detected] == ["judge_bias"]
    assert main(["diagnose", str(tmp_path / "run")]) == 0
    assert "DETECTED  the AI judge is biased [judge_bias]" in capsys.readouterr().out


def test_a_dead_judge_or_a_bad_setting_stops_the_run_before_it_starts(
    tiny_model_dir: Path, toy: Toy, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["train", "--recipe", "grpo", *toy(tiny_model_dir)]
    cases = {
        "feedback.judge_url: no server answers at": [
            "feedback.source=judge",
            "feedback.judge_url=http://127.0.0.1:9/v1",
        ],
        "feedback.judge_url: feedback.source=comparison needs": ["feedback.source=comparison"],
        "feedback.judge_model: only a judge uses it": ["feedback.judge_model=gpt"],
        "feedback.comparison_pairs: a group of 4 needs 3 to 6": [
            "feedback.source=comparison",
            "feedback.judge_url=http://127.0.0.1:9/v1",
            "feedback.comparison_pairs=2",
        ],
        "feedback.comparison: only pairwise comparisons use it": [
            "feedback.source=judge",
            "feedback.judge_url=http://127.0.0.1:9/v1",
            "feedback.comparison=bt",
        ],
        "system.backend: a judge's requests would be made": [
            "feedback.source=judge",
            "feedback.judge_url=http://127.0.0.1:9/v1",
            "system.backend=ray",
        ],
        "feedback.judge_api_key_env: the environment variable RLMAP_NO_SUCH_KEY": [
            "feedback.source=judge",
            "feedback.judge_url=http://127.0.0.1:9/v1",
            "feedback.judge_api_key_env=RLMAP_NO_SUCH_KEY",
        ],
    }
    for message, args in cases.items():
        assert main([*base, *args]) == 2, message
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    with pytest.raises(ConfigError, match=r"feedback\.judge_max: must exceed"):
        check_inputs(
            build_config(
                "grpo",
                None,
                [
                    *toy(tiny_model_dir),
                    "feedback.source=judge",
                    "feedback.judge_url=http://x/v1",
                    "feedback.judge_max=0",
                ],
            )
        )
