"""What the policy wrote: a bounded sample of held-out generations per evaluation, each
failure with an error class, and ``rlmap samples`` to read them.

Every evaluation writes ``samples/step_N.jsonl`` (N the step; 0 before training): the
first sample of each of the first ``run.samples`` held-out prompts — the same prompts at
every evaluation, so one can follow a prompt through training. A line holds the prompt,
the response (observations included), the final answer, the reference, the reward and
its status, whether it was correct, its length, whether it was truncated, its turns and
tool calls, and its class; with a pointwise AI judge (``feedback.source=judge``), also
the judge's reward for the same answer (``judge``, None when it failed) and its status.

A sample is ``correct`` (positive return, reward status ok), or fails with the first of
these that applies — the order goes from "the reward cannot be trusted" to "the answer
was wrong":

- ``infra_error``: the environment or the verifier failed (status ``infra_error``);
- ``timeout``: the verifier ran out of time;
- ``unparseable``: the verifier could not parse what it was promised (status ``invalid``);
- ``truncated``: the last turn ran into the length limit, or the turn budget ran out;
- ``tool_error``: a tool call failed (malformed, or the tool refused it);
- ``format_miss``: the final answer is empty, or misses ``feedback.format_pattern``;
- ``wrong_answer``: a well-formed, complete answer the verifier rejected.

The evaluation also logs each class's share of all held-out samples
(``eval/errors/<class>_frac``; with ``eval/pass@1`` they sum to 1), so a parser bug or a
verifier loophole shows as a shift between classes before it shows in the reward.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import InputError

CORRECT = "correct"
ERROR_CLASSES = (
    "infra_error",
    "timeout",
    "unparseable",
    "truncated",
    "tool_error",
    "format_miss",
    "wrong_answer",
)
"""The failure classes, in the order they are tested."""
SAMPLES_DIR = "samples"


@dataclass(frozen=True)
class Judged:
    """What classification needs of one episode (the fields of an ``Episode`` and its text)."""

    outcome: float
    status: RewardStatus
    end: End
    eos: bool
    tool_errors: int
    answer: str


def error_class(x: Judged, format_pattern: str | None = None) -> str:
    """``correct``, or the first failure class that applies (module docstring)."""
    if x.status == RewardStatus.INFRA_ERROR:
        return "infra_error"
    if x.status == RewardStatus.TIMEOUT:
        return "timeout"
    if x.status == RewardStatus.INVALID:
        return "unparseable"
    if x.outcome > 0:
        return CORRECT
    if not x.eos or x.end == End.TRUNCATED:
        return "truncated"
    if x.tool_errors > 0:
        return "tool_error"
    answer = x.answer.strip()
    if not answer or (format_pattern is not None and re.fullmatch(format_pattern, answer) is None):
        return "format_miss"
    return "wrong_answer"


def class_fractions(classes: Sequence[str]) -> dict[str, float]:
    """``eval/errors/<class>_frac`` of every failure class over ``classes`` (all samples)."""
    counts, n = Counter(classes), max(len(classes), 1)
    return {f"eval/errors/{c}_frac": counts[c] / n for c in ERROR_CLASSES}


def write_samples(run_dir: Path, step: int, rows: Sequence[dict[str, Any]]) -> Path:
    """``samples/step_<step>.jsonl`` (replaced whole: a resumed run rewrites its step)."""
    from rlmap.runs.rundir import write_text_atomic

    path = run_dir / SAMPLES_DIR / f"step_{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"step": step, **r}, ensure_ascii=False) + "\n" for r in rows)
    write_text_atomic(path, text)
    return path


STEP_FILE = re.compile(r"step_(0|[1-9][0-9]*)\.jsonl")
"""A samples file's name: ``step_N.jsonl``, N in ASCII digits without leading zeros."""


def sample_steps(run_dir: Path) -> list[int]:
    """The steps that have a samples file, in order."""
    found = []
    for p in (run_dir / SAMPLES_DIR).glob("step_*.jsonl"):
        if (m := STEP_FILE.fullmatch(p.name)) is not None:
            found.append(int(m.group(1)))
    return sorted(found)


def drop_samples_after(run_dir: Path, step: int) -> None:
    """Remove the samples of evaluations after ``step`` (a resume redoes them; -1: all),
    as ``metrics.jsonl`` is cut back."""
    for s in sample_steps(run_dir):
        if s > step:
            (run_dir / SAMPLES_DIR / f"step_{s}.jsonl").unlink(missing_ok=True)


def read_samples(run_dir: Path, step: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(step, its samples): ``step``'s, or the newest evaluation's; InputError naming what
    is missing or which line is bad."""
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    steps = sample_steps(run_dir)
    if not steps:
        raise InputError(
            f"{run_dir}: no samples (runs write {SAMPLES_DIR}/step_N.jsonl at "
            "each evaluation unless run.samples=0; older runs have none)"
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise InputError(
            f"--step: no samples at step {step} in {run_dir} (evaluated steps: "
            f"{', '.join(map(str, steps))})"
        )
    path = run_dir / SAMPLES_DIR / f"step_{step}.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 (byte {err.start})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror})") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("class"), str):
            raise InputError(f"{path}:{lineno}: not a sample (a JSON object with a class)")
        rows.append(row)
    return step, rows


def select(rows: Sequence[dict[str, Any]], wanted: str | None, n: int) -> list[dict[str, Any]]:
    """At most ``n`` samples of class ``wanted`` (None: every failure; ``all``: every
    sample), failures grouped by class in the order of ERROR_CLASSES."""
    if wanted is not None and wanted not in (*ERROR_CLASSES, CORRECT, "all"):
        raise InputError(
            f"--class: {wanted!r} is not a class; choose one of "
            f"{', '.join((*ERROR_CLASSES, CORRECT, 'all'))}"
        )
    if wanted == "all":
        return list(rows[:n])
    if wanted is not None:
        return [r for r in rows if r["class"] == wanted][:n]
    order = {c: k for k, c in enumerate(ERROR_CLASSES)}
    failures = [r for r in rows if r["class"] in order]
    return sorted(failures, key=lambda r: order[r["class"]])[:n]


def render(
    run_dir: Path,
    step: int,
    rows: Sequence[dict[str, Any]],
    shown: Sequence[dict[str, Any]],
    wanted: str | None = None,
) -> str:
    """The samples as text: the class mix of the step, then each shown sample."""
    counts = Counter(r["class"] for r in rows)
    mix = ", ".join(f"{c} {counts[c]}" for c in (CORRECT, *ERROR_CLASSES) if counts[c])
    out = [f"rlmap samples {run_dir}: step {step}, {len(rows)} samples ({mix})"]
    for r in shown:
        out.append(
            f"\n[{r['class']}] reward {r.get('reward')} ({r.get('status')}), "
            f"{r.get('length')} tokens{', truncated' if r.get('truncated') else ''}, "
            f"{r.get('turns')} turn(s), {r.get('tool_calls', 0)} tool call(s)"
        )
        out.append(f"  prompt:    {_one_line(r.get('prompt', ''))}")
        out.append(f"  response:  {_one_line(r.get('response', ''))}")
        out.append(f"  answer:    {_one_line(r.get('answer', ''))}")
        out.append(f"  reference: {_one_line(r.get('reference', ''))}")
        if "judge_status" in r:  # a pointwise judge's verdict on the same answer
            out.append(f"  judge:     {r['judge']} ({r['judge_status']})")
    if not shown:
        out.append("\n(no sample of that class)" if wanted else "\n(no failures)")
    return "\n".join(out) + "\n"


def _one_line(text: object) -> str:
    """A field on one line: newlines shown as ⏎, at most 300 characters."""
    s = str(text).replace("\n", "⏎")
    return s if len(s) <= 300 else s[:297] + "..."
