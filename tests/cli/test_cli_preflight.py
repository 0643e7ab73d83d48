"""``rlmap train --preflight``: a go / no-go table, exit 0 or 1, nothing written.

The faulty datasets run on the session's tiny model (32 positions) in the bad-input suite's
workspace (``ws``: training and the embedded warm start forbidden); the embedded default
runs as ``rlmap train`` would, on the cached warm start.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_workspace import GOOD_ROWS, Workspace, tree_hash, ws_fixture  # noqa: F401 (the ws fixture)

from rlmap.cli import main
from rlmap.experiments import preflight as pf
from rlmap.recipes import build_config

QUIET = ["data.eval_size=4", "run.progress=false"]


def run_preflight(
    capsys: pytest.CaptureFixture[str], ws: Workspace, rows: list[object], *extra: str
) -> tuple[int, str]:
    """``rlmap train --preflight --out run`` on ``rows`` as data.jsonl; asserts nothing was
    written (the workspace's hash, no ``run``); returns (status, stdout)."""
    ws.jsonl("data.jsonl", rows)
    argv = [
        "train",
        "--preflight",
        "--out",
        "run",
        f"model.path={ws.model()}",
        "data.task=data.jsonl",
        *QUIET,
        *extra,
    ]
    before = tree_hash(ws.root)
    status = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    assert tree_hash(ws.root) == before and not (ws.root / "run").exists()
    return status, out


def no_go_line(out: str) -> str:
    """The verdict line, which names the first problem."""
    line = out.splitlines()[-1]
    assert line.startswith("preflight: no-go: "), out
    return line


def test_embedded_default_goes_in_seconds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlmap.assembly.models import model_path

    monkeypatch.chdir(tmp_path)
    model_path(build_config(None, None, []))  # the cached warm start (built if absent)
    started = time.perf_counter()
    status = main(["train", "--preflight", "--out", "run", "run.progress=false"])
    seconds = time.perf_counter() - started
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.splitlines()[-1] == "preflight: go"
    for name in ("inputs", "verifier", "build", "memory", "step"):  # every check ran, and went
        assert any(line.split()[:2] == [name, "go"] for line in out.splitlines()), (name, out)
    assert list(tmp_path.iterdir()) == []  # no run directory, nothing else
    assert seconds < 30, f"{seconds:.0f} s"


def test_row_longer_than_the_context_is_named(
    capsys: pytest.CaptureFixture[str], ws: Workspace
) -> None:
    # the tiny model has 32 positions; "1+" * 100 + "1=" is ~200 tokens, on line 8
    rows = [*GOOD_ROWS[:7], {"prompt": "1+" * 100 + "1=", "answer": "101"}, *GOOD_ROWS[7:]]
    status, out = run_preflight(capsys, ws, rows)
    line = no_go_line(out)
    assert status == 1
    assert line.startswith("preflight: no-go: inputs: data.jsonl:8:") and "32-position" in line


def test_reference_the_verifier_rejects_is_named(
    capsys: pytest.CaptureFixture[str], ws: Workspace
) -> None:
    # last_number finds no number in "seventy-two": the row's own reference scores 0 (line 31)
    rows = [*GOOD_ROWS, {"prompt": "36+36=", "answer": "seventy-two"}]
    status, out = run_preflight(capsys, ws, rows, "feedback.verifier=last_number")
    assert status == 1
    assert no_go_line(out) == (
        "preflight: no-go: verifier: data.jsonl:31: the reference "
        "'seventy-two' scores 0 with last_number"
    )


@pytest.mark.parametrize("isolated", [[], ["feedback.timeout_s=10"]], ids=["in_process", "worker"])
def test_verifier_that_crashes_is_named(
    capsys: pytest.CaptureFixture[str], ws: Workspace, isolated: list[str]
) -> None:
    # regex's reference is the pattern; "(" does not compile, so every call on line 31 raises
    # (in the run's isolation worker too, with feedback.timeout_s)
    rows = [
        *[{"prompt": r["prompt"], "answer": r"\d+"} for r in GOOD_ROWS],
        {"prompt": "1+1=", "answer": "("},
    ]
    status, out = run_preflight(capsys, ws, rows, "feedback.verifier=regex", *isolated)
    line = no_go_line(out)
    assert status == 1
    assert line.startswith("preflight: no-go: verifier: data.jsonl:31: regex crashed on"), line
    assert "does not compile" in line


def test_garbage_that_scores_correct_is_a_spec_gap(
    capsys: pytest.CaptureFixture[str], ws: Workspace
) -> None:
    # contains_answer wants the reference's digits anywhere. Line 1: "20" needs a 0, which
    # "3.14159265358979" lacks; line 2: "22" needs two 2s, it has one; line 3: "24" needs a 2
    # and a 4, it has both: the first gap.
    status, out = run_preflight(capsys, ws, GOOD_ROWS, "feedback.verifier=contains_answer")
    assert status == 1
    gap = "the garbage answer '3.14159265358979' scores 1 with contains_answer (spec gap)"
    assert no_go_line(out) == f"preflight: no-go: verifier: data.jsonl:3: {gap}"


def test_step_leaves_the_weights_and_no_gradient(
    capsys: pytest.CaptureFixture[str], ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlmap.assembly.models import load_causal_lm
    from rlmap.assembly.parts import Parts, build

    built: list[Parts] = []
    monkeypatch.setattr(
        "rlmap.experiments.preflight.build",
        lambda *a, **k: built.append(build(*a, **k)) or built[-1],
    )
    status, out = run_preflight(capsys, ws, GOOD_ROWS)
    assert status == 0, out
    policy = built[0].policy
    fresh = load_causal_lm(ws.root / "model", dtype=torch.float32)
    for (name, p), q in zip(policy.named_parameters(), fresh.parameters(), strict=True):
        assert p.grad is None, name
        assert torch.equal(p.detach(), q), name


def test_spec_verifier_checks_garbage_only() -> None:
    # regex's reference "\d+" is a pattern, not an answer: scored as an answer it would fail
    # ("\d+" does not match itself), so only the garbage is tried, and none of it is digits only
    from rlmap.feedback.verifiers import regex_format

    example = SimpleNamespace(answer=r"\d+", reference=None)
    assert pf.row_problem(regex_format, "regex", "x:1", example, False, False) == ""  # type: ignore[arg-type]
    assert "the reference" in pf.row_problem(regex_format, "regex", "x:1", example, False, True)  # type: ignore[arg-type]


def test_no_reference_is_not_applicable() -> None:
    cfg = build_config(None, None, ["feedback.source=reward_model"])
    row = pf.check_verifier(cfg)
    assert (row.verdict, row.figure) == (
        "n/a",
        "feedback.source=reward_model: no reference answers",
    )


def memory_parts(free: int, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A policy and a frozen reference, each nn.Linear(10, 10), on a faked GPU of ``free``
    bytes free (of 10,000), nothing reserved."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 10_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    cfg = build_config(None, None, [])
    reference = torch.nn.Linear(10, 10).requires_grad_(False)
    return SimpleNamespace(
        policy=torch.nn.Linear(10, 10),
        reference=reference,
        critic=None,
        reward_model=None,
        device=torch.device("cuda:0"),
        cfg=cfg,
    )


@pytest.mark.parametrize(("free", "verdict"), [(2200, "go"), (2199, "no-go")])
def test_memory_against_the_free(monkeypatch: pytest.MonkeyPatch, free: int, verdict: str) -> None:
    # 110 parameters each (100 weights + 10 biases), 4 bytes: the policy keeps weight, grad
    # and two AdamW moments, 4 × 440 = 1,760 bytes; the reference its weight, 440: 2,200
    parts = memory_parts(free, monkeypatch)
    row = pf.check_memory(parts)  # type: ignore[arg-type]
    assert row.verdict == verdict, row
    assert row.figure.startswith("policy 0.0 MiB, reference 0.0 MiB: 0.0 MiB of 0.0 MiB free")
