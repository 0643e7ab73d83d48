"""``rlmap diagnose RUN_DIR``: every symptom rule on one run, as text or JSON."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rlmap.core.errors import InputError
from rlmap.diagnostics.rules import check_all
from rlmap.diagnostics.run import RunData, load_run
from rlmap.diagnostics.symptoms import Finding
from rlmap.runs.rundir import to_jsonable
from rlmap.runs.samples import read_samples, sample_steps


@dataclass(frozen=True)
class Report:
    """The verdict of every symptom rule on one run."""

    run_dir: str
    composition: str
    steps: tuple[int, int]
    records: int
    findings: tuple[Finding, ...]
    samples: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Per detected symptom, the held-out samples to read as evidence: the samples files of
    the evaluations just before and just after the steps where it shows (the newest when
    the rule names no steps), each with its class mix and the command that prints it."""

    @property
    def detected(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "detected")


def diagnose_run(run: RunData, run_dir: str = "") -> Report:
    """Every rule on an already loaded run."""
    return Report(run_dir, run.composition, run.steps, len(run.records), check_all(run))


def diagnose(run_dir: Path) -> Report:
    """Every rule on the run in ``run_dir`` (InputError, naming the file, if it cannot be read),
    citing its held-out samples where a rule fires."""
    report = diagnose_run(load_run(Path(run_dir)), str(run_dir))
    cited = {
        f.symptom: lines
        for f in report.detected
        if (lines := cite_samples(Path(run_dir), f.window))
    }
    return dataclasses.replace(report, samples=cited)


def cite_samples(run_dir: Path, window: tuple[int, int] | None) -> tuple[str, ...]:
    """The samples files of the evaluations that bracket ``window`` — the last at or before
    its start, the first at or after its end — or the newest (``window`` None), each as
    ``samples/step_N.jsonl: <class mix> (rlmap samples RUN --step N)``."""
    steps = sample_steps(run_dir)
    if window is None:
        chosen = steps[-1:]
    else:
        before = [s for s in steps if s <= window[0]][-1:]
        after = [s for s in steps if s >= window[1]][:1]
        chosen = sorted(set(before + after))
    out = []
    for step in chosen:
        try:
            _, rows = read_samples(run_dir, step)
        except InputError:  # a damaged samples file is no evidence; the rest of the report is
            continue
        counts = Counter(r["class"] for r in rows)
        mix = ", ".join(f"{c} {n}" for c, n in counts.most_common())
        command = f"rlmap samples {shlex.quote(str(run_dir))} --step {step}"
        out.append(f"samples/step_{step}.jsonl: {mix} ({command})")
    return tuple(out)


def render_json(report: Report) -> str:
    """The report as strict JSON (non-finite numbers become null)."""
    data = to_jsonable(dataclasses.asdict(report))
    return json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False)


def render_text(report: Report) -> str:
    """Detected symptoms in full (evidence, interfaces in order with readings, not first),
    then one line for each quiet or unchecked rule."""
    first, last = report.steps
    lines = [f"rlmap diagnose {report.run_dir}: {report.records} records, steps {first}–{last}"]
    if report.composition:
        lines.append(f"  {report.composition}")
    counts = {
        s: sum(f.status == s for f in report.findings) for s in ("detected", "quiet", "not checked")
    }
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    for finding in report.detected:
        lines += ["", *_detected_lines(finding)]
        cited = report.samples.get(finding.symptom, ())
        if cited:
            lines.append("  samples to read:")
            lines += [f"    - {text}" for text in cited]
    rest = [f for f in report.findings if f.status != "detected"]
    if rest:
        lines.append("")
    for finding in rest:
        if finding.status == "quiet":
            lines.append(f"quiet        {finding.title}")
            lines += [f"               {e.text}" for e in finding.evidence]
        else:
            lines.append(f"not checked  {finding.title} — needs {'; '.join(finding.needs)}")
    return "\n".join(lines) + "\n"


def _detected_lines(finding: Finding) -> list[str]:
    lines = [f"DETECTED  {finding.title} [{finding.symptom}] ({finding.source})", "  evidence:"]
    lines += [f"    - {e.text}" for e in finding.evidence]
    lines.append("  check, in this order:")
    for number, item in enumerate(finding.checks, start=1):
        lines.append(f"    {number}. {item.interface}")
        lines += [f"       {r.text}" for r in item.readings]
        if not item.readings:
            lines.append(f"       (nothing logged{': ' + item.hint if item.hint else ''})")
    lines.append("  not first:")
    lines += [f"    - {text}" for text in finding.not_first]
    return lines
