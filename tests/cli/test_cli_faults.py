"""Faults that need a process of their own: a 50 MiB prompt, a read-only and a full disk.

The 50 MiB prompt once stalled or aborted (SIGABRT) the process inside the tokenizer
library; here a subprocess must end within the timeout with the one-line error. The
disks are real: a read-only and a nearly full tmpfs, mounted in a private mount
namespace (``unshare -m``, or ``unshare -rm`` for a user without root), so nothing
outside the test sees them; the cases run in one process (``fault_driver.py``), which
hashes the watched trees before and after each case inside the namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlmap

HERE = Path(__file__).parent
TOY = ["optim.steps=1", "data.eval_size=4", "run.progress=false"]
SOURCE = Path(rlmap.__file__).parents[1]
"""Where this process's rlmap lives: the subprocesses run the very same code."""
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join([str(SOURCE), str(HERE)]),
}


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlmap: error: "), err[-2000:]
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def test_a_50_mib_prompt_is_refused_before_the_tokenizer(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(10, 30)]
    rows.insert(5, {"prompt": "1" * (50 << 20), "answer": "1"})
    data = tmp_path / "huge.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [
        "train",
        "--out",
        str(tmp_path / "run"),
        f"model.path={tiny_model_dir}",
        f"data.task={data}",
        *TOY,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rlmap.cli", *argv],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]  # not -6 (SIGABRT), not a hang
    line = _one_line(proc.stderr)
    assert f"{data}:6: row longer than" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.jsonl"]  # no run directory


def _unshare() -> list[str]:
    """The command that gives a private mount namespace here, or skip the test."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    for cmd in (["unshare", "-m"], ["unshare", "-rm"]):
        probe = subprocess.run(
            [*cmd, "sh", "-c", "mount -t tmpfs tmpfs /mnt 2>/dev/null"], capture_output=True
        )
        if probe.returncode == 0:
            return cmd
    pytest.skip("no mount namespace here (needs root or unprivileged user namespaces)")


def test_read_only_and_full_disks_give_one_line_naming_the_path(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    unshare = _unshare()
    ws, ro, full = tmp_path / "ws", tmp_path / "ro", tmp_path / "full"
    for d in (ws, ro, full):
        d.mkdir()
    model = ws / "model"
    shutil.copytree(tiny_model_dir, model)
    run = ws / "run"
    run.mkdir()
    (run / "config.yaml").write_text("# grpo: x\nrecipe: grpo\nseed: 0\n")
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/pass@1": 0.1}\n')
    (run / "summary.json").write_text('{"after": {"eval/pass@1": 0.2}}\n')
    (ws / "pairs.jsonl").write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n')
    sweep = ["simulate", "--sweep-workers", "1,2", "--steps", "5", "--plot"]
    pairs = ["reward-model", "pairs", "--n", "4", "--heldout", "2", "--out"]
    rm = [
        "reward-model",
        "train",
        "--pairs",
        str(ws / "pairs.jsonl"),
        "--base",
        str(model),
        "--out",
    ]
    train = ["train", f"model.path={model}", *TOY, "--out"]
    # (argv, the path the line must name, the reason it must give, exit status)
    ro_fs, no_space = "Read-only file system", "No space left on device"
    cases = [
        ([*train, f"{ro}/run"], f"{ro}/run", ro_fs, 2),
        (["advise", "--emit-config", f"{ro}/run.yaml"], f"{ro}/run.yaml", ro_fs, 1),
        ([*pairs, f"{ro}/pairs.jsonl"], f"{ro}/pairs.jsonl", ro_fs, 1),
        (["compare", str(run), "--out", f"{ro}/report"], f"{ro}/report", ro_fs, 2),
        ([*sweep, f"{ro}/plots"], f"{ro}/plots", ro_fs, 2),
        ([*rm, f"{ro}/rm"], f"{ro}/rm", ro_fs, 2),
        (["advise", "--emit-config", f"{full}/run.yaml"], f"{full}/run.yaml", no_space, 1),
        ([*pairs, f"{full}/pairs.jsonl"], f"{full}/pairs.jsonl", no_space, 1),
        (["compare", str(run), "--out", f"{full}/report"], f"{full}/report/", no_space, 1),
        ([*sweep, f"{full}/plots"], f"{full}/plots/", no_space, 1),
        ([*train, f"{full}/run"], f"{full}/run/config.yaml", no_space, 1),
    ]
    spec = tmp_path / "cases.json"
    watch = [str(ws), str(ro), str(full)]
    spec.write_text(json.dumps([{"argv": argv, "watch": watch} for argv, *_ in cases]))
    script = (
        f"mount -t tmpfs -o ro,size=1m tmpfs {ro} && "
        f"mount -t tmpfs -o size=256k tmpfs {full} && "
        f"(dd if=/dev/zero of={full}/filler bs=4k 2>/dev/null; true) && "
        f'exec "{sys.executable}" {HERE / "fault_driver.py"} {spec}'
    )
    env = {**ENV, "RLMAP_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [*unshare, "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    for (argv, path, reason, status), result in zip(cases, results, strict=True):
        line = _one_line(result["err"])
        assert result["status"] == status, (argv, line)
        assert path in line and reason in line, (argv, line)
        assert result["changed"] == [], (argv, line, result["changed"])


# issue 27: checkpoint write on a full disk
# Before: `internal error (SafetensorError: ... No space left on device)`, naming no path.
# Each case gets a 1 MiB tmpfs filled but for 64 KiB: room for the config, the metrics
# lines and the samples (under 24 KiB here), none for a checkpoint (about 170 KiB).


def test_a_full_disk_mid_checkpoint_names_the_checkpoint_and_keeps_the_previous(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    unshare = _unshare()
    fresh, again, done = tmp_path / "fresh", tmp_path / "again", tmp_path / "done"
    fresh.mkdir()
    again.mkdir()
    model = [f"model.path={tiny_model_dir}", *TOY]  # one step: its checkpoint is step_1
    train = [sys.executable, "-m", "rlmap.cli", "train"]
    made = subprocess.run(
        [*train, "--out", str(done), *model], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert made.returncode == 0, made.stderr[-2000:]
    config = done / "config.yaml"
    config.write_text(config.read_text().replace("steps: 1\n", "steps: 2\n"))  # one step more
    run = again / "run"
    cases = [  # (argv, watched: must not change)
        (["train", "--out", str(fresh / "run"), *model], []),
        (["train", "--resume", str(run)], [str(run / "checkpoints" / "step_1")]),
    ]
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps([{"argv": argv, "watch": watch} for argv, watch in cases]))
    fill = "; ".join(
        f"dd if=/dev/zero of={d}/slack bs=4k count=16 2>/dev/null; "
        f"dd if=/dev/zero of={d}/filler bs=4k 2>/dev/null; rm {d}/slack"
        for d in (fresh, again)
    )
    listing = (
        "import json, os, sys; print(json.dumps([sorted(os.listdir(d)) for d in sys.argv[1:]]))"
    )
    script = (
        f"mount -t tmpfs -o size=1m tmpfs {fresh} && mount -t tmpfs -o size=1m tmpfs {again} && "
        f"cp -a {done} {run} && {{ {fill}; }} && "
        f'"{sys.executable}" {HERE / "fault_driver.py"} {spec} && '
        f'"{sys.executable}" -c "{listing}" {fresh}/run/checkpoints {run}/checkpoints'
    )
    env = {**ENV, "RLMAP_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [*unshare, "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    *_, results, left = proc.stdout.splitlines()
    (first, second), (fresh_left, again_left) = json.loads(results), json.loads(left)
    no_space = "No space left on device"
    assert first["status"] == 1
    assert _one_line(first["err"]) == f"rlmap: error: {fresh}/run/checkpoints/step_1: {no_space}"
    assert fresh_left == []  # no step_1, no .tmp-step_1-* left behind
    assert second["status"] == 1
    assert _one_line(second["err"]) == f"rlmap: error: {run}/checkpoints/step_2: {no_space}"
    assert again_left == ["step_1"] and second["changed"] == []  # the previous one intact
