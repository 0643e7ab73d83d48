"""Run directory creation, atomic writes and the metrics log (torn lines, truncation)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
from pathlib import Path

import pytest
import torch

from rlmap.core.errors import InputError
from rlmap.runs import rundir
from rlmap.runs.rundir import (
    MetricsLog,
    append_jsonl,
    create_run_dir,
    read_jsonl,
    write_json_atomic,
    write_text_atomic,
)


def test_out_is_created_when_absent_or_empty(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    assert create_run_dir(None, out) == out and out.is_dir()
    assert create_run_dir(None, out) == out  # still empty: accepted


def test_existing_nonempty_out_is_refused_with_resume_hint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("keep me\n")
    with pytest.raises(InputError) as err:
        create_run_dir(None, out)
    assert str(err.value) == f"{out}: run directory exists; use --resume {out} to continue it"
    assert (out / "metrics.jsonl").read_text() == "keep me\n"  # nothing touched


def test_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "file"
    out.write_text("x")
    with pytest.raises(InputError, match="exists and is not a directory"):
        create_run_dir(None, out)


def test_new_run_dirs_are_unique_and_named_by_utc_time(tmp_path: Path) -> None:
    made = {create_run_dir(tmp_path / "runs", None) for _ in range(5)}
    assert len(made) == 5
    for path in made:
        assert path.parent == tmp_path / "runs" and path.is_dir()
        assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", path.name)


def test_default_root_is_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = create_run_dir(None, None)
    assert path.parent == Path("runs") and (tmp_path / path).is_dir()


def test_write_json_atomic_converts_tensors_and_non_finite(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"a": torch.tensor(0.5), "b": math.nan, "c": (1, math.inf), "p": path})
    assert json.loads(path.read_text()) == {"a": 0.5, "b": None, "c": [1, None], "p": str(path)}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left


def test_failed_atomic_write_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    write_text_atomic(path, "old\n")

    def crash(*args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(rundir.os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_metrics_append_plain_numbers(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.append(1, {"reward/mean": torch.tensor(0.25), "n": 3, "bad": torch.tensor(math.nan)})
    log.append(2, {"reward/mean": 0.5, "inf": math.inf})
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 1, "reward/mean": 0.25, "n": 3, "bad": None}
    assert json.loads(lines[1]) == {"step": 2, "reward/mean": 0.5, "inf": None}
    assert MetricsLog.read(path) == [json.loads(line) for line in lines]


def test_metrics_reject_non_scalars_and_step_key(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    with pytest.raises(TypeError, match="'x'"):
        log.append(1, {"x": torch.ones(2)})
    with pytest.raises(TypeError, match="'y'"):
        log.append(1, {"y": "text"})
    with pytest.raises(ValueError, match="step"):
        log.append(1, {"step": 3})


def test_torn_last_line_is_ignored_and_repaired_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.append(1, {"a": 1.0})
    log.append(2, {"a": 2.0})
    with open(path, "a") as f:
        f.write('{"step": 3, "a": 3.')  # kill -9 in the middle of the write
    assert [r["step"] for r in MetricsLog.read(path)] == [1, 2]
    MetricsLog(path).append(3, {"a": 3.5})  # a resumed run reopens the log
    assert [r["step"] for r in MetricsLog.read(path)] == [1, 2, 3]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_malformed_middle_line_is_an_error_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: invalid JSON"):
        MetricsLog.read(path)
    path.write_text('{"step": 1}\n[1, 2]\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics record"):
        MetricsLog.read(path)


def test_read_missing_file_is_empty(tmp_path: Path) -> None:
    assert MetricsLog.read(tmp_path / "nope.jsonl") == []
    assert MetricsLog.truncate_after(tmp_path / "nope.jsonl", 3) == []
    assert not (tmp_path / "nope.jsonl").exists()


def test_truncate_after_keeps_steps_up_to_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for step in range(1, 6):
        log.append(step, {"a": float(step)})
    with open(path, "a") as f:
        f.write('{"step": 6, "a"')  # torn, dropped too
    kept = MetricsLog.truncate_after(path, 3)
    assert [r["step"] for r in kept] == [1, 2, 3]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    MetricsLog(path).append(4, {"a": 4.0})  # the resumed run redoes step 4
    assert [r["step"] for r in MetricsLog.read(path)] == [1, 2, 3, 4]


# --- issue 27: every JSON-lines log appends after a newline ----------------------------------


def test_append_jsonl_cuts_a_torn_last_line_and_keeps_one_that_lost_only_its_newline(
    tmp_path: Path,
) -> None:
    # Before: resumes.jsonl was appended onto a torn line, leaving two unparseable halves.
    path = tmp_path / "resumes.jsonl"
    path.write_text('{"from": "step_2"}\n{"from": "st')  # kill -9 in the middle of a line
    assert [v for _, v in read_jsonl(path)] == [{"from": "step_2"}]  # read as metrics are
    append_jsonl(path, {"from": "step_4"})
    assert path.read_text() == '{"from": "step_2"}\n{"from": "step_4"}\n'
    path.write_text('{"from": "step_2"}')  # complete, only its newline lost: kept
    append_jsonl(path, {"from": "step_4"})
    assert path.read_text() == '{"from": "step_2"}\n{"from": "step_4"}\n'
    path.write_text('{"from": "st')  # a torn first line: nothing before it
    append_jsonl(path, {"from": None})
    assert path.read_text() == '{"from": null}\n'


def test_append_jsonl_names_the_log_when_the_disk_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real = builtins.open

    def full(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if "a" in mode:  # as a full disk fails the flush: no file name on the error
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", full)
    with pytest.raises(OSError) as err:
        append_jsonl(tmp_path / "metrics.jsonl", {"step": 1})
    assert err.value.filename == str(tmp_path / "metrics.jsonl")
    assert err.value.errno == errno.ENOSPC
