"""Held-out samples: error classes, the samples files, and ``rlmap samples``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmap.cli import main
from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import InputError
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.runs.samples import (
    ERROR_CLASSES,
    Judged,
    class_fractions,
    error_class,
    read_samples,
    select,
    write_samples,
)

OK, BAD = RewardStatus.OK, RewardStatus.INFRA_ERROR


def judged(
    outcome: float = 0.0,
    status: RewardStatus = OK,
    end: End = End.TERMINAL,
    eos: bool = True,
    tool_errors: int = 0,
    answer: str = "42",
) -> Judged:
    return Judged(outcome, status, end, eos, tool_errors, answer)


@pytest.mark.parametrize(
    ("x", "klass"),
    [
        (judged(outcome=1.0), "correct"),
        (judged(status=BAD), "infra_error"),
        (judged(status=RewardStatus.TIMEOUT), "timeout"),
        (judged(status=RewardStatus.INVALID), "unparseable"),
        (judged(eos=False), "truncated"),  # the last turn ran into the length limit
        (judged(end=End.TRUNCATED), "truncated"),  # the turn budget ran out
        (judged(tool_errors=1), "tool_error"),
        (judged(answer="  "), "format_miss"),  # nothing to compare
        (judged(answer="41"), "wrong_answer"),
        # the order: the reward's trust first (a crash beats a positive outcome), then
        # correctness, then the cause of the miss
        (judged(outcome=1.0, status=BAD), "infra_error"),
        (judged(outcome=1.0, eos=False), "correct"),  # a cut answer the verifier accepted
        (judged(eos=False, tool_errors=2, answer=""), "truncated"),
        (judged(tool_errors=1, answer=""), "tool_error"),
    ],
)
def test_each_failure_gets_the_first_class_that_applies(x: Judged, klass: str) -> None:
    assert error_class(x) == klass


def test_a_format_pattern_makes_a_format_miss() -> None:
    assert error_class(judged(answer="x = 41"), r"-?\d+") == "format_miss"
    assert error_class(judged(answer="41"), r"-?\d+") == "wrong_answer"


def test_class_fractions_are_shares_of_all_samples() -> None:
    # 5 samples: 2 correct, 2 wrong, 1 truncated -> 0.4 wrong, 0.2 truncated, 0 elsewhere
    shares = class_fractions(["correct", "wrong_answer", "truncated", "correct", "wrong_answer"])
    assert shares["eval/errors/wrong_answer_frac"] == 0.4
    assert shares["eval/errors/truncated_frac"] == 0.2
    assert set(shares) == {f"eval/errors/{c}_frac" for c in ERROR_CLASSES}
    assert sum(shares.values()) == pytest.approx(0.6)  # + pass@1's 0.4 = 1


def test_samples_files_round_trip_and_select_groups_failures(tmp_path: Path) -> None:
    classes = ["wrong_answer", "correct", "truncated", "wrong_answer", "infra_error"]
    rows = [{"class": c, "k": k} for k, c in enumerate(classes)]
    write_samples(tmp_path, 0, rows[:1])
    write_samples(tmp_path, 20, rows)
    step, back = read_samples(tmp_path)
    assert step == 20 and [r["k"] for r in back] == [0, 1, 2, 3, 4] and back[0]["step"] == 20
    assert read_samples(tmp_path, 0)[1] == [{"step": 0, **rows[0]}]
    # failures in the classes' order (infra first), the correct one left out
    assert [r["k"] for r in select(back, None, 10)] == [4, 2, 0, 3]
    assert [r["k"] for r in select(back, None, 2)] == [4, 2]
    assert [r["k"] for r in select(back, "wrong_answer", 10)] == [0, 3]
    assert [r["k"] for r in select(back, "all", 3)] == [0, 1, 2]
    with pytest.raises(InputError, match="--class: 'nope' is not a class"):
        select(back, "nope", 1)


Toy = Callable[..., list[str]]


def test_a_run_writes_its_samples_and_rlmap_samples_reads_them(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [
        *toy(tiny_calc_model_dir, steps=2),
        "data.task=calculator",
        "data.max_turns=2",
        "generation.max_new_tokens=6",
        "run.eval_every=2",
        "run.samples=3",
    ]
    run = tmp_path / "run"
    run_training(build_config("grpo", None, overrides), run)
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_0.jsonl", "step_2.jsonl"]
    _, rows = read_samples(run)
    assert len(rows) == 3  # run.samples prompts (the eval set has 4)
    for r in rows:
        assert r["class"] in (*ERROR_CLASSES, "correct") and isinstance(r["prompt"], str)
        assert r["correct"] == (r["class"] == "correct") and r["length"] >= 1
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    shares = sum(v for k, v in records[-1].items() if k.startswith("eval/errors/"))
    assert shares + records[-1]["eval/pass@1"] == pytest.approx(1.0)  # every sample once
    for r in records[1:]:  # the training rollouts' mix, every step
        assert {f"errors/{c}_frac" for c in ERROR_CLASSES} <= set(r)
    assert (run / "plots" / "errors.png").is_file()

    assert main(["samples", str(run), "--class", "all"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rlmap samples {run}: step 2, 3 samples (")
    assert out.count("\n[") == 3 and "  prompt:    " in out and "  reference: " in out
    assert main(["samples", str(run), "--step", "0", "--json", "--class", "all", "--n", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(json.loads(x)["step"] == 0 for x in lines)


def test_training_rollouts_log_their_error_mix() -> None:
    from types import SimpleNamespace

    from rlmap.embedded.tokenizer import build_tokenizer
    from rlmap.engines.engine import Completion
    from rlmap.rollout.episodes import single_turn
    from rlmap.rollout.packing import Scored
    from rlmap.system.step_metrics import rollout_errors

    tok = build_tokenizer()
    eos = int(tok.eos_token_id)

    def scored(
        text: str, outcome: float, status: RewardStatus = OK, stopped: bool = True
    ) -> Scored:
        ids = tuple(tok(text, add_special_tokens=False)["input_ids"]) + ((eos,) if stopped else ())
        c = Completion(
            prompt_ids=(1,),
            response_ids=ids,
            logprobs=(0.0,) * len(ids),
            stopped=stopped,
            version=0,
        )
        return Scored(single_turn(c, outcome, status), 0, outcome, outcome, status)

    p = SimpleNamespace(cfg=build_config("grpo", None, []), tokenizer=tok)
    # 4 rollouts: correct, wrong, cut by the length limit, a crashed verifier
    mix = rollout_errors(
        [
            scored("12", 1.0),
            scored("13", 0.0),
            scored("1", 0.0, stopped=False),
            scored("12", 0.0, BAD),
        ],
        p,
    )  # type: ignore[arg-type]
    assert mix["errors/wrong_answer_frac"] == 0.25 and mix["errors/truncated_frac"] == 0.25
    assert mix["errors/infra_error_frac"] == 0.25 and sum(mix.values()) == 0.75
    # a learned reward model scored a wrong answer 0.9: still a wrong answer (the
    # environment's return decides, as for held-out samples)
    wrong = scored("13", 0.0)
    liked = Scored(wrong.episode, 0, 0.9, 0.9, OK)
    assert rollout_errors([liked], p)["errors/wrong_answer_frac"] == 1.0  # type: ignore[arg-type]


def test_samples_of_redone_evaluations_are_dropped(tmp_path: Path) -> None:
    from rlmap.runs.samples import drop_samples_after, sample_steps

    for step in (0, 2, 4, 6):
        write_samples(tmp_path, step, [{"class": "correct"}])
    (tmp_path / "samples" / "step_007.jsonl").write_text("")  # not a samples file's name
    drop_samples_after(tmp_path, 3)
    assert sample_steps(tmp_path) == [0, 2]
    drop_samples_after(tmp_path, -1)
    assert sample_steps(tmp_path) == []
    assert (tmp_path / "samples" / "step_007.jsonl").exists()  # left alone


def test_run_samples_zero_writes_none(tiny_model_dir: Path, tmp_path: Path, toy: Toy) -> None:
    run_training(
        build_config("grpo", None, [*toy(tiny_model_dir), "run.samples=0"]), tmp_path / "run"
    )
    assert not (tmp_path / "run" / "samples").exists()
    with pytest.raises(InputError, match=r"unless run\.samples=0"):
        read_samples(tmp_path / "run")


def test_a_resume_drops_the_samples_of_the_steps_it_redoes(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, crash_in_step: Callable[..., None]
) -> None:
    from rlmap.runs.samples import sample_steps

    cfg = build_config(
        "grpo", None, [*toy(tiny_model_dir, steps=4), "run.checkpoint_every=2", "run.eval_every=1"]
    )
    crash_in_step(cfg, tmp_path / "run", 4)
    assert sample_steps(tmp_path / "run") == [0, 1, 2, 3]  # step 3 evaluated after step_2
    stale = tmp_path / "run" / "samples" / "step_3.jsonl"
    stale.write_text('{"class": "correct", "marker": 1}\n')
    run_training(cfg, tmp_path / "run", resume=True)
    assert sample_steps(tmp_path / "run") == [0, 1, 2, 3, 4]
    assert "marker" not in stale.read_text()  # step 3 was redone and written anew
