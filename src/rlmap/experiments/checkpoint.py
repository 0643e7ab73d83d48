"""Atomic Hugging Face checkpoints with the state needed for an exact resume.

Layout of ``<run>/checkpoints/step_<N>/``::

    config.json, model.safetensors, generation_config.json   model.save_pretrained
    tokenizer.json, tokenizer_config.json, ...              tokenizer.save_pretrained
    <name>/                                                 each extra model (a critic)
    trainer_state.pt                                        optimizers, schedulers, RNG, extra

The directory loads with plain ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``; rlmap is needed only to resume. A LoRA policy's
``save_pretrained`` writes ``adapter_config.json`` + ``adapter_model.safetensors`` instead
of the model (``peft.PeftModel.from_pretrained(base, ckpt)`` loads it), and ``merged/``
holds the merged model on request (:mod:`rlmap.system.lora`).

Atomicity: everything is written into ``checkpoints/.tmp-step_<N>-<pid>/``, every
file is fsync'd, and the directory is renamed to ``step_<N>`` in one
``os.replace``. A crash before the rename leaves only a ``.tmp-*`` directory,
which readers ignore and the next save removes; after it, the new checkpoint is
complete. Old checkpoints are renamed out of the ``step_*`` namespace before they
are deleted, so a crash mid-delete cannot leave a partial ``step_*`` behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlmap.core.errors import InputError, TrainingError
from rlmap.experiments.rundir import fsync_dir
from rlmap.system.optim_step import all_finite

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.pt"
STATE_FORMAT = 1
_STEP_DIR = re.compile(r"step_(\d+)")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint directories of a run, oldest step first (``.tmp-*`` ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name))]
    return [p for _, p in sorted(found) if p.is_dir()]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the highest step, or None when the run has none."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def checkpoint_problem(ckpt: Path, models: Sequence[str] = ()) -> str | None:
    """What makes ``ckpt`` unusable for a resume, naming the file; None when it is intact.

    The model (and each of ``models``' subdirectories) must pass
    :func:`rlmap.system.setup.check_model_dir` — ``config.json`` parses, every weight file's
    header covers the file; or, for a LoRA run, the adapter's files do — and
    ``trainer_state.pt``'s zip directory must be whole. It reads headers and directories,
    not weights or optimiser state.
    """
    from rlmap.core.errors import ConfigError
    from rlmap.system.setup import check_model_dir

    for where in (ckpt, *(ckpt / name for name in models)):
        try:  # a LoRA run's checkpoint is its adapter
            check_model_dir(where, field=f"checkpoint {where}", adapter=where == ckpt)
        except (ConfigError, InputError) as exc:
            return str(exc)
    state = ckpt / TRAINER_STATE
    if not state.is_file():
        return f"{state}: missing"
    try:  # torch.save writes a zip whose directory is at the end: truncation loses it
        with zipfile.ZipFile(state) as archive:
            archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return f"{state}: damaged (truncated?)"
    return None


def resume_point(
    run_dir: Path, models: Sequence[str] = ()
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest intact checkpoint of a run, and each damaged newer one with its fault.

    Nothing is moved here (a resume refused later must leave the run as it was): the
    caller sets the damaged ones aside with :func:`set_aside` once the resume goes ahead.
    A run without checkpoints resumes from None (it starts over); a run whose every
    checkpoint is damaged raises :class:`~rlmap.core.errors.InputError` naming the newest
    one's fault.
    """
    checkpoints = list_checkpoints(run_dir)
    problems = [(ckpt, checkpoint_problem(ckpt, models)) for ckpt in reversed(checkpoints)]
    intact = next((ckpt for ckpt, problem in problems if problem is None), None)
    if checkpoints and intact is None:
        raise InputError(f"{problems[0][1]}; no intact checkpoint to resume from")
    damaged = []
    for ckpt, problem in problems:
        if ckpt == intact or problem is None:
            break
        damaged.append((ckpt, problem))
    return intact, damaged


def set_aside(damaged: Sequence[tuple[Path, str]]) -> list[str]:
    """Rename damaged checkpoints to ``checkpoints/damaged-step_<N>-<pid>`` (kept for
    inspection, never deleted, out of the ``step_*`` namespace so the resumed run can
    write that step again); one line for each."""
    notes = []
    for ckpt, problem in damaged:
        kept = ckpt.with_name(f"damaged-{ckpt.name}-{os.getpid()}")
        os.replace(ckpt, kept)
        notes.append(f"{problem}; skipped (kept as {kept.name})")
    return notes


def capture_rng() -> dict[str, Any]:
    """Every RNG state a training step can draw from, as plain data.

    numpy's state is stored as lists so the file loads with ``weights_only=True``;
    it is captured only when numpy is already imported (nothing else can have
    drawn from it).
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:
        name, keys, pos, has_gauss, gauss = sys.modules["numpy"].random.get_state()
        state["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put back the RNG states of a trainer state from :func:`load_trainer_state`."""
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng:
        import numpy as np

        name, keys, pos, has_gauss, gauss_np = rng["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss_np))


def restore_optimizers(
    state: Mapping[str, Any],
    *,
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    only: tuple[str, ...] = ("optimizers", "schedulers"),
) -> None:
    """Load saved optimizer and scheduler states into live objects, matched by name (the
    kinds in ``only``)."""
    for kind, live in (("optimizers", optimizers), ("schedulers", schedulers)):
        if kind not in only:
            continue
        saved = state[kind]
        if set(saved) != set(live):
            raise ValueError(f"checkpoint {kind}: saved {sorted(saved)}, given {sorted(live)}")
        for name, obj in live.items():
            obj.load_state_dict(saved[name])


def load_trainer_state(ckpt_dir: Path) -> dict[str, Any]:
    """The ``trainer_state.pt`` of a checkpoint (loaded with ``weights_only=True``); a file
    that does not load is an :class:`~rlmap.core.errors.InputError` naming it."""
    path = Path(ckpt_dir) / TRAINER_STATE
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # missing, truncated, corrupt or foreign: named, one line
        raise InputError(f"{path}: cannot be loaded ({type(exc).__name__})") from None
    if state.get("format") != STATE_FORMAT:
        raise InputError(f"{path}: trainer state format {state.get('format')!r} unknown")
    return state


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (so the rename publishes data on disk)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_tmp(root: Path) -> None:
    """Delete ``.tmp-*`` directories left by crashed saves (their process is gone)."""
    for path in root.glob(".tmp-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _rotate(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints; rename first, so deletion is atomic."""
    for old in list_checkpoints(run_dir)[:-keep]:
        doomed = old.with_name(f".tmp-delete-{old.name}-{os.getpid()}")
        os.replace(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    fsync_dir(Path(run_dir) / CHECKPOINTS)


def _trainer_state(
    step: int,
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    extra: Mapping[str, Any],
    optimizer_states: Mapping[str, Any] | None,
) -> dict[str, Any]:
    states = optimizer_states or {name: opt.state_dict() for name, opt in optimizers.items()}
    return {
        "format": STATE_FORMAT,
        "step": int(step),
        "optimizers": dict(states),
        "schedulers": {name: sched.state_dict() for name, sched in schedulers.items()},
        "rng": capture_rng(),
        "extra": dict(extra),
    }


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    extra: Mapping[str, Any],
    keep: int = 2,
    extra_models: Mapping[str, Any] | None = None,
    model_state: Mapping[str, torch.Tensor] | None = None,
    optimizer_states: Mapping[str, Any] | None = None,
    extra_states: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> Path:
    """Write ``<run_dir>/checkpoints/step_<step>/`` atomically and return its path.

    ``model`` and each of ``extra_models`` (saved in a subdirectory of that name)
    are ``PreTrainedModel``s, written as safetensors; ``extra`` must hold plain
    data (numbers, strings, tensors, lists, dicts), since the state is loaded with
    ``weights_only=True``. The RNG state is captured at call time: call this after
    the step's sampling and update, and a resumed run draws the same numbers next.
    After the new checkpoint is in place only the newest ``keep`` remain.
    ``model_state``, ``extra_states`` (by extra model) and ``optimizer_states``, when
    given, are what is saved of the policy, the extra models and the optimisers instead
    of their own state dicts (data-parallel FSDP2: the full
    dicts gathered from the shards).
    Raises FileExistsError if ``step_<step>`` already exists (nothing is overwritten), and
    :class:`~rlmap.core.errors.TrainingError` if any weight is NaN or infinite (nothing is
    written: a checkpoint that loads but answers nothing is worse than none).
    """
    if keep < 1:
        raise ValueError(f"checkpoint keep must be >= 1, got {keep}")
    for name in extra_models or {}:
        if not name or name.startswith(".") or "/" in name or name == TRAINER_STATE:
            raise ValueError(f"checkpoint extra_models: {name!r} is not a plain directory name")
    states = {"policy": model_state or model.state_dict()}
    given = extra_states or {}
    states |= {name: given.get(name) or part.state_dict()
               for name, part in (extra_models or {}).items()}  # fmt: skip
    for name, state_dict in states.items():
        if not all_finite(state_dict.values()):
            raise TrainingError(f"step {step}: {name} weights are not finite; checkpoint "
                                "not written")  # fmt: skip
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    if final.exists():
        raise FileExistsError(f"{final}: checkpoint already exists")
    _remove_stale_tmp(root)
    tmp = root / f".tmp-step_{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
        tokenizer.save_pretrained(tmp)
        for name, extra_model in (extra_models or {}).items():
            extra_model.save_pretrained(tmp / name, safe_serialization=True,
                                        state_dict=given.get(name))  # fmt: skip
        state = _trainer_state(step, optimizers, schedulers, extra, optimizer_states)
        torch.save(state, tmp / TRAINER_STATE)
        _fsync_tree(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise
    fsync_dir(root)
    _rotate(run_dir, keep)
    return final
