"""run.loggers: wandb (offline) and mlflow (a local SQLite store) record what metrics.jsonl
records, step by step, with the config and the summary; bad names, missing packages and a
failing run. trackio pins pillow < 13 and is not installed for the tests: its adapter runs
against a stand-in module that records the calls (as TensorBoard's does, not installed
either)."""

from __future__ import annotations

import json
import math
import struct
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.experiments.records import StepRecords
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.runs import trackers

Toy = Callable[..., list[str]]


@pytest.fixture(scope="module")
def tracker_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """wandb offline and quiet, its config and cache out of the home directory; mlflow on
    its default store; the working directory an empty folder (nothing may land there)."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    cwd = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        for name in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_DIR"):
            mp.delenv(name, raising=False)
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_CONFIG_DIR", str(tmp_path_factory.mktemp("wandb-config")))
        mp.setenv("WANDB_CACHE_DIR", str(tmp_path_factory.mktemp("wandb-cache")))
        mp.setenv("WANDB_DATA_DIR", str(tmp_path_factory.mktemp("wandb-data")))
        yield cwd


@pytest.fixture(scope="module")
def tracked(
    tracker_env: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, toy: Toy
) -> Path:
    """A 2-step run with run.loggers=wandb,mlflow (shared by the tests below)."""
    run = tmp_path_factory.mktemp("tracked") / "run"
    overrides = [*toy(tiny_model_dir), "run.loggers=wandb,mlflow", "run.project=toy"]
    run_training(build_config("grpo", None, overrides), run)
    return run


def _logged(run: Path) -> dict[tuple[str, int], float]:
    """metrics.jsonl's finite values by (name, step)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        out |= {(k, step): v for k, v in record.items() if v is not None and math.isfinite(v)}
    return out


def _same(got: Mapping[tuple[str, int], float], want: Mapping[tuple[str, int], float]) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=0.0), key


# --- wandb: the offline run's transaction log, read record by record ---------------------


def _wandb_records(run: Path) -> list[Any]:
    """Every record of the one offline run's ``.wandb`` file: a LevelDB-style log (a 7-byte
    file header, then 32 KiB blocks of records, each with a 7-byte header: CRC, length,
    type 1 full / 2 first / 3 middle / 4 last) of ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, block, chunks, out = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # a block's tail too short for a header is padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_records_every_metric_with_its_step(tracked: Path) -> None:
    got = {}
    for record in _wandb_records(tracked):
        if record.WhichOneof("record_type") == "history":
            row = {_key(item): json.loads(item.value_json) for item in record.history.item}
            step = row.pop("_step")
            got |= {(k, step): v for k, v in row.items() if not k.startswith("_")}
    want = _logged(tracked)
    assert {step for _, step in want} == {0, 1, 2}
    kinds = Counter(record.WhichOneof("record_type") for record in _wandb_records(tracked))
    assert got, f"no history in the offline run; its records: {dict(kinds)}"
    _same(got, want)


def test_wandb_run_holds_the_config_and_the_summary(tracked: Path) -> None:
    records = _wandb_records(tracked)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "run" and run.project == "toy"
    config = {_key(item): json.loads(item.value_json) for item in run.config.update}
    config.pop("_wandb")
    assert config == yaml.safe_load((tracked / "config.yaml").read_text())
    assert config["optim"]["steps"] == 2  # toy(steps=2)
    assert config["run"]["loggers"] == "wandb,mlflow"
    summary: dict[str, Any] = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            summary |= {_key(item): json.loads(item.value_json) for item in record.summary.update}
    written = json.loads((tracked / "summary.json").read_text())
    for key in written:
        assert summary[key] == written[key], key
    (end,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 0


# --- mlflow: the run's SQLite store, through mlflow's client ------------------------------


def _mlflow_run(run: Path) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("toy")
    (found,) = client.search_runs([experiment.experiment_id])
    return client, found


def test_mlflow_records_every_metric_with_its_step(tracked: Path) -> None:
    client, found = _mlflow_run(tracked)
    assert found.info.run_name == "run" and found.info.status == "FINISHED"
    want = _logged(tracked)
    got = {}
    for name in {name for name, _ in want}:
        # '@' is not an MLflow name character: eval/pass@1 is logged as eval/pass_at_1
        history = client.get_metric_history(found.info.run_id, name.replace("@", "_at_"))
        got |= {(name, m.step): m.value for m in history}
    _same(got, want)
    summary_keys = {k for k in found.data.metrics if k.startswith("summary/")}
    assert summary_keys  # and nothing but the summary's and the logged names
    assert set(found.data.metrics) - summary_keys == {n.replace("@", "_at_") for n, _ in want}


def test_mlflow_run_holds_the_config_and_the_summary(tracked: Path, tiny_model_dir: Path) -> None:
    client, found = _mlflow_run(tracked)
    params = found.data.params
    assert params["optim.steps"] == "2"  # numbers as JSON, strings as they are
    assert params["model.path"] == str(tiny_model_dir)
    assert params["run.loggers"] == "wandb,mlflow"
    assert params["reduction.max_len"] == "null"
    config = yaml.safe_load((tracked / "config.yaml").read_text())
    assert len(params) == sum(1 for _ in _leaves(config))  # one param per leaf
    written = json.loads((tracked / "summary.json").read_text())
    after = written["after"]["eval/pass@1"]
    history = client.get_metric_history(found.info.run_id, "summary/after/eval/pass_at_1")
    assert [(m.step, m.value) for m in history] == [(2, after)]  # at the last step
    assert not any("device_name" in k for k in found.data.metrics)  # text is not a metric
    artifact = client.download_artifacts(found.info.run_id, "summary.json", str(tracked))
    assert json.loads(Path(artifact).read_text()) == written
    assert (tracked / "mlartifacts").is_dir()


def _leaves(tree: Any) -> Iterator[Any]:
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    else:
        yield tree


def test_nothing_lands_outside_the_run_directory(tracked: Path, tracker_env: Path) -> None:
    assert list(tracker_env.iterdir()) == []  # no ./mlruns, ./wandb, ./mlflow.db


def test_a_failing_run_ends_its_tracker_runs_as_failed(
    tracker_env: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    toy: Toy,
    crash_in_step: Callable[..., None],
) -> None:
    run = tmp_path / "run"
    cfg = build_config(
        "grpo", None, [*toy(tiny_model_dir, steps=3), "run.loggers=mlflow,wandb", "run.project=toy"]
    )
    crash_in_step(cfg, run, 2)
    _, found = _mlflow_run(run)
    assert found.info.status == "FAILED" and found.info.end_time is not None
    assert found.data.metrics["budget/generated_tokens"] > 0  # step 1 was logged
    records = _wandb_records(run)
    (end,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 1


# --- names, modes and the config -----------------------------------------------------------


def test_mlflow_names_map_at_signs_and_other_characters() -> None:
    assert trackers.mlflow_name("eval/pass@1") == "eval/pass_at_1"
    assert trackers.mlflow_name("ratio/kappa/max_abs_log") == "ratio/kappa/max_abs_log"
    assert trackers.mlflow_name("a b-c.d:e%f") == "a b-c.d_e_f"  # ':' is refused on Windows


def test_mlflow_params_are_dotted_json_and_cut() -> None:
    config = {"a": {"b": "x" * 7000, "c": [1, 2], "d": None}, "pass@k": 2}
    assert trackers.mlflow_params(config) == {
        "a.b": "x" * 6000,  # MLflow 3 refuses a param value over 6000 characters
        "a.c": "[1, 2]",
        "a.d": "null",
        "pass_at_k": "2",
    }


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({}, "offline"),
        ({"WANDB_API_KEY": "k"}, "online"),
        ({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}, None),
        ({"WANDB_MODE": ""}, "offline"),
    ],
)
def test_wandb_mode_is_offline_without_a_key(env: dict[str, str], mode: str | None) -> None:
    assert trackers.wandb_mode(env) == mode  # None: wandb reads WANDB_MODE itself


def test_summary_numbers_are_the_numeric_leaves() -> None:
    summary = {
        "after": {"eval/pass@1": 0.5, "eval/k": 2},
        "device": {"cuda": False, "device_name": "cpu"},
        "ev": None,
        "bad": math.nan,
        "tokens": 7,
    }
    numbers = {"summary/after/eval/pass@1": 0.5, "summary/after/eval/k": 2.0, "summary/tokens": 7.0}
    assert trackers.summary_numbers(summary) == numbers


@pytest.mark.parametrize(
    ("loggers", "message"),
    [
        (
            "wandb,nope",
            r"^run\.loggers: unknown tracker 'nope'; known: tensorboard, wandb, mlflow, "
            r"trackio$",
        ),
        ("mlflow, wandb,mlflow", r"^run\.loggers: 'mlflow' is named twice$"),
    ],
)
def test_bad_logger_names_are_config_errors(loggers: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config("grpo", None, [f"run.loggers={loggers}"])


def test_an_empty_project_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^run\.project: must not be empty"):
        build_config("grpo", None, ["run.project= "])


def test_loggers_take_a_list_or_a_comma_string_and_tensorboard_is_an_alias() -> None:
    listed = build_config("grpo", None, ["run.loggers=[wandb, mlflow]"]).run
    assert listed.trackers == ("wandb", "mlflow")
    assert build_config("grpo", None, ["run.loggers= wandb , mlflow"]).run.trackers == (
        "wandb",
        "mlflow",
    )
    assert build_config("grpo", None, ["run.loggers="]).run.trackers == ()


def test_tensorboard_alias_joins_the_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in_tensorboard(monkeypatch)
    _stand_in_trackio(monkeypatch)
    run = build_config("grpo", None, ["run.tensorboard=true", "run.loggers=trackio"]).run
    assert run.trackers == ("tensorboard", "trackio")
    both = build_config("grpo", None, ["run.tensorboard=true", "run.loggers=tensorboard"]).run
    assert both.trackers == ("tensorboard",)  # named by both: once, not a duplicate


def _without(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """``module`` looks not installed to the check."""
    real = trackers.importlib.util.find_spec
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(
        trackers.importlib.util,
        "find_spec",
        lambda name, *a: None if name == module else real(name, *a),
    )


@pytest.mark.parametrize(
    ("override", "module", "message"),
    [
        (
            "run.loggers=wandb",
            "wandb",
            r"^run\.loggers: wandb needs the wandb package \(pip install 'rlmap\[wandb\]'\)$",
        ),
        (
            "run.loggers=mlflow",
            "sqlalchemy",
            r"^run\.loggers: mlflow needs the sqlalchemy package "
            r"\(pip install 'rlmap\[mlflow\]'\)$",
        ),
        (
            "run.tensorboard=true",
            "tensorboard",
            r"^run\.tensorboard: tensorboard needs the "
            r"tensorboard package \(pip install 'rlmap\[tensorboard\]'\)$",
        ),
    ],
)
def test_a_tracker_not_installed_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, override: str, module: str, message: str
) -> None:
    _without(monkeypatch, module)
    with pytest.raises(ConfigError, match=message):
        build_config("grpo", None, [override])


def test_train_without_the_tracker_writes_no_run_directory(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tiny_model_dir: Path,
    tmp_path: Path,
    toy: Toy,
) -> None:
    _without(monkeypatch, "wandb")
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *toy(tiny_model_dir), "run.loggers=wandb"]) == 2
    assert "run.loggers: wandb needs the wandb package" in capsys.readouterr().err
    assert not out.exists()


# --- adapters against stand-in modules -----------------------------------------------------


class Calls(list[tuple[Any, ...]]):
    """Calls made on a stand-in module, in order."""

    def recorder(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: self.append((name, args, kwargs))


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> types.ModuleType:
    """A stand-in module in sys.modules (with a spec, as an installed one has)."""
    import importlib.machinery

    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _stand_in_tensorboard(monkeypatch: pytest.MonkeyPatch) -> Calls:
    calls = Calls()

    class SummaryWriter:
        def __init__(self, log_dir: str) -> None:
            calls.append(("SummaryWriter", (log_dir,), {}))

        def __getattr__(self, name: str) -> Callable[..., None]:
            return calls.recorder(name)

    _module(monkeypatch, "tensorboard")
    _module(monkeypatch, "torch.utils.tensorboard", SummaryWriter=SummaryWriter)
    return calls


def _stand_in_trackio(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> Calls:
    calls = Calls()

    def init(**kwargs: Any) -> None:
        if fail:
            raise RuntimeError("trackio could not start")
        calls.append(("init", (), kwargs))

    _module(
        monkeypatch,
        "trackio",
        init=init,
        log=calls.recorder("log"),
        finish=calls.recorder("finish"),
    )
    return calls


SUMMARY = {"after": {"eval/pass@1": 0.75}, "device": {"device": "cpu"}}


def test_trackio_gets_the_config_each_step_and_the_summary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in_trackio(monkeypatch)
    cfg = build_config("grpo", None, ["run.loggers=trackio", "run.project=p"])
    records = StepRecords.of(cfg, tmp_path)
    records.write(0, {"eval/pass@1": 0.5, "loss/policy": math.nan})
    records.write(1, {"eval/pass@1": 0.25, "x": None, "n": 3})
    records.finish(SUMMARY)
    init, *rest = calls
    assert init[2]["project"] == "p" and init[2]["name"] == tmp_path.name
    assert init[2]["config"]["run"]["loggers"] == "trackio"
    assert rest == [
        ("log", ({"eval/pass@1": 0.5},), {"step": 0}),  # NaN dropped
        ("log", ({"eval/pass@1": 0.25, "n": 3.0},), {"step": 1}),  # None dropped
        ("log", ({"summary/after/eval/pass@1": 0.75},), {"step": 1}),  # the summary's numbers
        ("finish", (), {}),
    ]
    records.close(failed=True)  # closed once: nothing more
    assert calls[-1] == ("finish", (), {})
    assert len(calls) == 5


def test_tensorboard_gets_scalars_text_and_is_closed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in_tensorboard(monkeypatch)
    cfg = build_config("grpo", None, ["run.tensorboard=true"])
    records = StepRecords.of(cfg, tmp_path)
    records.write(3, {"a": 1.5, "b": math.inf})
    records.finish(SUMMARY)
    names = [c[0] for c in calls]
    assert calls[0] == ("SummaryWriter", (str(tmp_path / "tensorboard"),), {})
    assert calls[1][0] == "add_text" and calls[1][1][0] == "config"
    assert '"tensorboard": true' in calls[1][1][1]
    scalars = [c[1] for c in calls if c[0] == "add_scalar"]
    assert scalars == [("a", 1.5, 3), ("summary/after/eval/pass@1", 0.75, 3)]  # inf dropped
    assert names[-2:] == ["add_text", "close"]


def test_a_tracker_that_fails_to_open_closes_those_opened(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    board = _stand_in_tensorboard(monkeypatch)
    _stand_in_trackio(monkeypatch, fail=True)
    cfg = build_config("grpo", None, ["run.loggers=tensorboard,trackio"])
    with pytest.raises(RuntimeError, match="trackio could not start"):
        StepRecords.of(cfg, tmp_path)
    assert board[-1][0] == "close"


# --- a tracker that fails does not take training with it ----------------------------------


class _Flaky:
    """A tracker whose ``log`` raises from the given step on (a tracking server gone)."""

    def __init__(self, fail_at: int, close_fails: bool = False) -> None:
        self.fail_at, self.close_fails = fail_at, close_fails
        self.logged: list[int] = []
        self.closed: list[bool] = []

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if step >= self.fail_at:
            raise ConnectionError("tracking server unreachable")
        self.logged.append(step)

    def summary(self, summary: Mapping[str, Any], step: int) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        self.closed.append(failed)
        if self.close_fails:
            raise OSError("close failed")


def test_a_tracker_that_raises_is_dropped_and_the_others_go_on(tmp_path: Path) -> None:
    flaky, steady = _Flaky(fail_at=1), _Flaky(fail_at=99)
    records = StepRecords(tmp_path, [flaky, steady])
    records.write(0, {"loss/policy": 1.0})
    with pytest.warns(RuntimeWarning, match=r"^run\.loggers: _Flaky failed and is dropped"):
        records.write(1, {"loss/policy": 2.0})
    records.write(2, {"loss/policy": 3.0})
    records.finish({"after": {}})
    assert flaky.logged == [0] and flaky.closed == [True]  # closed once, as failed
    assert steady.logged == [0, 1, 2] and steady.closed == [False]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert steps == [0, 1, 2]  # metrics.jsonl lost nothing


def test_a_close_that_raises_does_not_hide_why_training_stopped(tmp_path: Path) -> None:
    tracker = _Flaky(fail_at=99, close_fails=True)
    warned = pytest.warns(RuntimeWarning, match="closing _Flaky failed")
    raised = pytest.raises(KeyError, match="the real failure")
    with warned, raised, StepRecords(tmp_path, [tracker]):
        raise KeyError("the real failure")
    assert tracker.closed == [True]


def test_mlflow_opens_in_a_relative_run_directory(
    tracker_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rlmap train --resume runs/r1` passes a relative path; file URIs need an absolute one
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    run = trackers.RunInfo(Path("runs/r1"), "toy", {"optim": {"lr": 0.1}})
    opened = trackers.registry.get("mlflow").open(run)
    opened.log(0, {"loss/policy": 1.5})
    opened.close()
    assert (tmp_path / "runs" / "r1" / "mlflow.db").is_file()
