"""Nothing is overwritten silently: every command that writes refuses an existing target
unless given ``--force``; and the error path itself: ``--debug``, the last-resort lines."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import yaml
from cli_workspace import Workspace, tree_hash, ws_fixture  # noqa: F401 (the ws fixture)

from rlmap.cli import main


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


def test_advise_refuses_an_existing_config_and_force_replaces_it(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    ws.file("run.yaml", "recipe: dapo  # hand-tuned\n")
    assert main(["advise", "--emit-config", "run.yaml"]) == 2
    assert _err(capsys) == "rlmap: error: run.yaml: exists; use --force to overwrite it\n"
    assert (ws.root / "run.yaml").read_text() == "recipe: dapo  # hand-tuned\n"
    assert main(["advise", "--emit-config", "run.yaml", "--force"]) == 0
    assert "config written to run.yaml" in capsys.readouterr().out
    text = (ws.root / "run.yaml").read_text()
    assert text.startswith("# rlmap advise: ") and "recipe" in yaml.safe_load(text)
    assert sorted(p.name for p in ws.root.iterdir()) == ["run.yaml"]  # no temporary left


def test_reward_pairs_refuse_either_file_and_force_replaces_both(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["reward-model", "pairs", "--out", "pairs.jsonl", "--n", "4", "--heldout", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    first = tree_hash(ws.root)
    assert main([*argv, "--noise", "0.5", "--seed", "1"]) == 2
    assert "pairs.jsonl: exists; use --force" in _err(capsys)
    (ws.root / "pairs.jsonl").unlink()  # only the held-out sibling is left: still refused
    assert main(argv) == 2
    assert "pairs.heldout.jsonl: exists; use --force" in _err(capsys)
    assert not (ws.root / "pairs.jsonl").exists()  # nothing written when one file exists
    assert main([*argv, "--force"]) == 0
    assert tree_hash(ws.root) == first  # same seed, same pairs: both files rewritten
    assert main([*argv, "--seed", "1", "--force"]) == 0
    assert tree_hash(ws.root) != first


def test_simulate_plot_refuses_existing_pngs_and_force_replaces_them(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--sweep-workers", "1,2", "--steps", "5", "--plot", "plots"]
    assert main(argv) == 0
    from rlmap.simulator.report import PLOTS  # the names checked before the sweep

    names = sorted(p.name for p in (ws.root / "plots").iterdir())
    assert names == sorted(f"{name}.png" for name in PLOTS)
    capsys.readouterr()
    before = tree_hash(ws.root)
    assert main(argv) == 2
    assert "plots/throughput.png: exists; use --force" in _err(capsys)
    assert tree_hash(ws.root) == before
    assert main([*argv, "--force"]) == 0


def test_compare_out_refused_when_it_holds_files_unless_force(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    ws.run("a")
    ws.file("report/notes.md", "mine")
    assert main(["compare", "a", "--out", "report"]) == 2
    assert "report: report directory exists" in _err(capsys)
    assert main(["compare", "a", "--out", "report", "--force"]) == 0
    assert (ws.root / "report" / "report.md").is_file()
    assert (ws.root / "report" / "notes.md").read_text() == "mine"


def test_compare_on_bad_input_creates_no_report_directory(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    ws.run("a", ledger="{")
    assert main(["compare", "a"]) == 2  # the default reports/<time> is not made either
    assert "a/ledger.json" in _err(capsys)
    assert not (ws.root / "reports").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_then_the_line(
    where: str, ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    ws.dir("conf.yaml")
    argv = ["config", "--config", "conf.yaml"]
    assert main(["--debug", *argv] if where == "before" else [*argv, "--debug"]) == 2
    err = _err(capsys)
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1] == "rlmap: error: conf.yaml: is a directory, not a config file"


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def fail(*args: object) -> None:
        raise exc

    return fail


@pytest.mark.parametrize(
    ("exc", "status", "line"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "out/x.md"),
            1,
            "rlmap: error: out/x.md: No space left on device",
        ),
        (
            RuntimeError("boom\nsecond line"),
            1,
            "rlmap: error: internal error (RuntimeError: boom; second line); "
            "rerun with --debug for the traceback",
        ),
    ],
)
def test_last_resort_errors_are_one_line(
    exc: BaseException,
    status: int,
    line: str,
    ws: Workspace,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rlmap.recipes.catalog as catalog

    monkeypatch.setattr(catalog, "paper_index_markdown", _raise(exc))
    assert main(["papers"]) == status
    err = _err(capsys)
    assert err == line + "\n" and "Traceback" not in err


def test_help_exits_zero_without_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help"]) == 0
    assert "--out" in capsys.readouterr().out


def test_a_written_file_never_leaves_a_temporary_behind(
    ws: Workspace, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlmap.runs.rundir as rundir

    def crash(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(rundir.os, "replace", crash)
    assert main(["advise", "--emit-config", "run.yaml"]) == 1
    assert _err(capsys) == "rlmap: error: run.yaml: Input/output error\n"
    assert list(Path(ws.root).iterdir()) == []
