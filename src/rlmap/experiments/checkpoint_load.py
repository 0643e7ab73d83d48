"""Reading checkpoints back: which one is intact, what its trainer state must hold, and
putting optimisers, schedulers and RNG streams back from it.

The writing side, the layout and the atomicity are :mod:`rlmap.experiments.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
import os
import random
import types
import typing
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlmap.core.errors import InputError
from rlmap.experiments.checkpoint import STATE_FORMAT, TRAINER_STATE, list_checkpoints


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
"""The RNG states :func:`~rlmap.experiments.checkpoint.capture_rng` saves on every machine
(CUDA's only where there is CUDA)."""


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
    """The shape of the ``trainer_state.pt`` :func:`~rlmap.experiments.checkpoint.save_checkpoint`
    writes with optimisers and schedulers of these names and an ``extra`` of that shape."""
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
