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
holds the merged model on request (:mod:`rlmap.models.lora`).

Atomicity: everything is written into ``checkpoints/.tmp-step_<N>-<pid>/``, every
file is fsync'd, and the directory is renamed to ``step_<N>`` in one
``os.replace``. A crash before the rename leaves only a ``.tmp-*`` directory,
which readers ignore and the next save removes; after it, the new checkpoint is
complete. Old checkpoints are renamed out of the ``step_*`` namespace before they
are deleted, so a crash mid-delete cannot leave a partial ``step_*`` behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import shutil
import types
import typing
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlmap.core.errors import InputError, TrainingError
from rlmap.experiments.rundir import fsync_dir
from rlmap.learner.optim_step import all_finite

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
    :func:`rlmap.assembly.models.check_model_dir` — ``config.json`` parses, every weight file's
    header covers the file; or, for a LoRA run, the adapter's files do — and
    ``trainer_state.pt``'s zip directory must be whole. It reads headers and directories,
    not weights or optimiser state.
    """
    from rlmap.assembly.models import check_model_dir
    from rlmap.core.errors import ConfigError

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
    run_dir: Path,
    models: Sequence[str] = (),
    state_problem: Callable[[dict[str, Any]], str | None] = lambda state: None,
) -> tuple[Path | None, dict[str, Any] | None, list[tuple[Path, str]]]:
    """The newest intact checkpoint of a run, its trainer state, and each damaged newer
    one with its fault.

    Intact: :func:`checkpoint_problem` finds nothing, ``trainer_state.pt`` loads, and
    ``state_problem`` finds nothing in it (a field missing or of the wrong type: a file cut
    short and one without a field a resume reads are damaged alike). Checkpoints are read
    newest first, up to the first intact one. Nothing is moved here (a resume refused
    later must leave the run as it was): the caller sets the damaged ones aside with
    :func:`set_aside` once the resume goes ahead. A run without checkpoints resumes from
    None (it starts over); a run whose every checkpoint is damaged raises
    :class:`~rlmap.core.errors.InputError` naming the newest one's fault.
    """
    damaged: list[tuple[Path, str]] = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        state, problem = _read(ckpt, models, state_problem)
        if problem is None:
            return ckpt, state, damaged
        damaged.append((ckpt, problem))
    if damaged:
        raise InputError(f"{damaged[0][1]}; no intact checkpoint to resume from")
    return None, None, []


def _read(
    ckpt: Path, models: Sequence[str], state_problem: Callable[[dict[str, Any]], str | None]
) -> tuple[dict[str, Any] | None, str | None]:
    """(the trainer state, None) of an intact checkpoint; (None or the state, what is wrong,
    naming the file) of a damaged one."""
    problem = checkpoint_problem(ckpt, models)
    if problem is not None:
        return None, problem
    try:
        state = load_trainer_state(ckpt)
    except InputError as exc:
        return None, str(exc)
    field = state_problem(state)
    return state, None if field is None else f"{ckpt / TRAINER_STATE}: {field}"


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


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """Every RNG state a training step can draw from, as plain data.

    numpy's state is stored as lists so the file loads with ``weights_only=True``; CUDA's
    only for the learner's own CUDA ``device`` (a machine's fact, not the run's:
    :data:`RNG_SHAPE` leaves it out): another GPU's generator is not this rank's, and a
    CPU learner never starts CUDA to read one.
    """
    import numpy as np

    legacy: Any = np.random.get_state()  # (name, keys, pos, has_gauss, gauss)
    name, keys, pos, has_gauss, gauss = legacy
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: Mapping[str, Any], device: torch.device | None = None) -> None:
    """Put back the RNG states of a trainer state from :func:`load_trainer_state`; CUDA's
    into the learner's CUDA ``device`` only (one saved on a CPU run stays out)."""
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)
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
    kinds in ``only``). An optimiser's state follows its parameters onto their device
    (``Optimizer.load_state_dict``); a ValueError, before anything is loaded, names the
    parameter whose saved state does not fit (PyTorch checks only the counts, and a
    shape mismatch would surface as an error inside the next step)."""
    for kind, live in (("optimizers", optimizers), ("schedulers", schedulers)):
        if kind not in only:
            continue
        saved = state[kind]
        if set(saved) != set(live):
            raise ValueError(f"checkpoint {kind}: saved {sorted(saved)}, given {sorted(live)}")
        if kind == "optimizers":
            for name, optimizer in optimizers.items():
                check_fits(name, optimizer, saved[name])
        for name, obj in live.items():
            obj.load_state_dict(saved[name])


def check_fits(name: str, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """ValueError naming the first parameter of ``optimizer`` whose ``saved`` state (a
    ``state_dict()``) has another shape, or the groups whose sizes differ."""
    groups = [list(g["params"]) for g in saved["param_groups"]]
    live = [list(g["params"]) for g in optimizer.param_groups]
    if [len(g) for g in groups] != [len(g) for g in live]:
        raise ValueError(
            f"optimizers.{name}: saved for parameter groups of "
            f"{[len(g) for g in groups]} tensors, the model has "
            f"{[len(g) for g in live]}"
        )
    for ids, params in zip(groups, live, strict=True):
        for index, param in zip(ids, params, strict=True):
            for key, value in saved["state"].get(index, {}).items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.dim() > 0
                    and value.shape != param.shape
                ):
                    raise ValueError(
                        f"optimizers.{name}: the state {key} of parameter {index} "
                        f"has shape {tuple(value.shape)}, the parameter "
                        f"{tuple(param.shape)}"
                    )


def load_trainer_state(ckpt_dir: Path) -> dict[str, Any]:
    """The ``trainer_state.pt`` of a checkpoint (loaded with ``weights_only=True``); a file
    that does not load is an :class:`~rlmap.core.errors.InputError` naming it."""
    path = Path(ckpt_dir) / TRAINER_STATE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # missing, truncated, corrupt or foreign: named, one line
        raise InputError(f"{path}: cannot be loaded ({type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise InputError(f"{path}: not a trainer state (a {type(state).__name__})")
    if "format" not in state:
        raise InputError(f"{path}: format: missing")
    if state["format"] != STATE_FORMAT:
        raise InputError(f"{path}: trainer state format {state['format']!r} unknown")
    return state


Shape = Any
"""What :func:`shape_problem` holds a value to: a type or a tuple of types (an instance of
one), a dict of field → shape (a dict holding every field; more are allowed), a
:class:`Maybe` or an :class:`Each`."""


@dataclass(frozen=True)
class Maybe:
    """None, or a value of ``shape``."""

    shape: Shape


@dataclass(frozen=True)
class Each:
    """A list (or tuple) whose every item has ``shape``."""

    shape: Shape


RNG_SHAPE: dict[str, Shape] = {"torch": torch.Tensor, "python": (list, tuple), "numpy": list}
"""The RNG states :func:`capture_rng` saves on every machine (CUDA's only where there is CUDA)."""


OPTIMIZER_SHAPE: dict[str, Shape] = {"state": dict, "param_groups": list}
"""What an optimiser's ``load_state_dict`` reads: the per-parameter state and the groups."""
SCHEDULER_SHAPE: dict[str, Shape] = {
    "last_epoch": int,
    "_step_count": int,
    "base_lrs": list,
    "_last_lr": list,
    "lr_lambdas": list,
}
"""What a ``LambdaLR`` (the schedule rlmap makes) keeps of itself: its position, base and
last rates, and its factors' state (its ``load_state_dict`` raises without them; without
the others it silently starts the schedule over). Its two other keys are flags torch sets
only around a call of ``step``."""


def trainer_state_shape(optimizers: Sequence[str], extra: Mapping[str, Shape]) -> dict[str, Shape]:
    """The shape of the ``trainer_state.pt`` :func:`save_checkpoint` writes with optimisers
    and schedulers of these names and an ``extra`` of that shape."""
    return {
        "format": int,
        "step": int,
        "optimizers": {name: OPTIMIZER_SHAPE for name in optimizers},
        "schedulers": {name: SCHEDULER_SHAPE for name in optimizers},
        "rng": RNG_SHAPE,
        "extra": dict(extra),
    }


def dataclass_shape(cls: type) -> dict[str, Shape]:
    """The shape of ``dataclasses.asdict`` of a ``cls`` as a checkpoint loads it back: every
    field, typed by its annotation (a float may be saved as an int, a nested dataclass is
    a dict of its own fields, ``X | None`` is :class:`Maybe`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _hint_shape(hints[f.name]) for f in dataclasses.fields(cls)}


def _hint_shape(hint: Any) -> Shape:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _hint_shape(args[0]) if len(args) == 1 else tuple(map(_hint_shape, args))
        return Maybe(inner) if len(args) < len(typing.get_args(hint)) else inner
    if dataclasses.is_dataclass(hint):
        return dataclass_shape(hint)  # type: ignore[arg-type]
    if hint is float:
        return (int, float)
    return typing.get_origin(hint) or hint


def shape_problem(value: Any, shape: Shape, where: str = "") -> str | None:
    """The first way ``value`` departs from ``shape``, naming the field by its dotted path
    from ``where`` (``extra.async.queue: missing``); None when it fits."""
    if isinstance(shape, Maybe):
        return None if value is None else shape_problem(value, shape.shape, where)
    if isinstance(shape, Each):
        if not isinstance(value, (list, tuple)):
            return f"{where}: expected a list, got {type(value).__name__}"
        problems = (shape_problem(v, shape.shape, f"{where}[{k}]") for k, v in enumerate(value))
        return next((p for p in problems if p is not None), None)
    if isinstance(shape, dict):
        if not isinstance(value, Mapping):
            return f"{where}: expected a dict, got {type(value).__name__}"
        for key, inner in shape.items():
            field = f"{where}.{key}" if where else key
            if key not in value:
                return f"{field}: missing"
            if (problem := shape_problem(value[key], inner, field)) is not None:
                return problem
        return None
    if not isinstance(value, shape):
        wanted = " or ".join(t.__name__ for t in (shape if isinstance(shape, tuple) else (shape,)))
        return f"{where}: expected {wanted}, got {type(value).__name__}"
    return None


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
    device: torch.device | None,
) -> dict[str, Any]:
    states = optimizer_states or {name: opt.state_dict() for name, opt in optimizers.items()}
    return {
        "format": STATE_FORMAT,
        "step": int(step),
        "optimizers": dict(states),
        "schedulers": {name: sched.state_dict() for name, sched in schedulers.items()},
        "rng": capture_rng(device),
        "extra": dict(extra),
    }


def os_error(exc: BaseException) -> OSError | None:
    """The operating system's error behind a failed write (a full or read-only disk), or
    None: an OSError in ``exc``'s chain (``torch.save`` to a Python file raises a
    RuntimeError over the file's own), or one quoted by a library that writes by itself
    (safetensors: ``... No space left on device (os error 28)``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    quoted = re.search(r"\(os error (\d+)\)", str(exc))
    if quoted is None:
        return None
    code = int(quoted.group(1))
    return OSError(code, os.strerror(code))


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
    device: torch.device | None = None,
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
    Raises FileExistsError if ``step_<step>`` already exists (nothing is overwritten),
    :class:`~rlmap.core.errors.TrainingError` if any weight is NaN or infinite (nothing is
    written: a checkpoint that loads but answers nothing is worse than none), and an
    OSError naming ``step_<step>`` when the disk refuses a write (full, read-only): the
    temporary copy is removed and the previous checkpoint is as it was.
    """
    if keep < 1:
        raise ValueError(f"checkpoint keep must be >= 1, got {keep}")
    for name in extra_models or {}:
        if not name or name.startswith(".") or "/" in name or name == TRAINER_STATE:
            raise ValueError(f"checkpoint extra_models: {name!r} is not a plain directory name")
    given = extra_states or {}
    _refuse_nonfinite(
        step,
        {"policy": model_state or model.state_dict()}
        | {
            name: given.get(name) or part.state_dict()
            for name, part in (extra_models or {}).items()
        },
    )

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
        tokenizer.save_pretrained(tmp)
        for name, extra_model in (extra_models or {}).items():
            extra_model.save_pretrained(
                tmp / name, safe_serialization=True, state_dict=given.get(name)
            )
        state = _trainer_state(step, optimizers, schedulers, extra, optimizer_states, device)
        with open(tmp / TRAINER_STATE, "wb") as f:  # through Python: a full disk is an OSError
            torch.save(state, f)

    root = Path(run_dir) / CHECKPOINTS
    final = _write_atomically(root, f"step_{step}", write)
    _rotate(run_dir, keep)
    return final


def _refuse_nonfinite(step: int, states: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """TrainingError naming the first part whose weights hold a NaN or an infinity."""
    for name, state_dict in states.items():
        if not all_finite(state_dict.values()):
            raise TrainingError(
                f"step {step}: {name} weights are not finite; checkpoint not written"
            )


def _write_atomically(root: Path, name: str, write: Callable[[Path], None]) -> Path:
    """``root/name`` written by ``write`` into a temporary sibling, synced, then renamed into
    place (FileExistsError when it exists already). On any failure the temporary copy is
    removed; a refusal of the disk is an OSError naming ``root/name``."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.exists():
        raise FileExistsError(f"{final}: checkpoint already exists")
    _remove_stale_tmp(root)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        _fsync_tree(tmp)
        os.replace(tmp, final)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        cause = os_error(exc) if isinstance(exc, Exception) else None
        if cause is not None:  # named by the checkpoint, not a file of its temporary copy
            raise OSError(cause.errno, cause.strerror, str(final)) from exc
        raise
    fsync_dir(root)
    return final
