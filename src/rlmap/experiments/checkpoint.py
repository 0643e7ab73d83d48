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

Reading a checkpoint back (is it intact, restoring optimisers and RNG) is
:mod:`rlmap.experiments.checkpoint_load`'s.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rlmap.core.errors import TrainingError
from rlmap.learner.optim_step import all_finite
from rlmap.runs.rundir import fsync_dir

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


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """Every RNG state a training step can draw from, as plain data.

    numpy's state is stored as lists so the file loads with ``weights_only=True``; CUDA's
    only for the learner's own CUDA ``device`` (a machine's fact, not the run's:
    :data:`~rlmap.experiments.checkpoint_load.RNG_SHAPE` leaves it out): another GPU's
    generator is not this rank's, and a CPU learner never starts CUDA to read one.
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
    _check_arguments(keep, extra_models or {})
    given = extra_states or {}
    _refuse_nonfinite(step, _weights(model, model_state, extra_models or {}, given))

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


def _check_arguments(keep: int, extra_models: Mapping[str, Any]) -> None:
    """ValueError for a ``keep`` below 1 or an extra model named other than a plain
    directory name (it would land outside the checkpoint, or on its trainer state)."""
    if keep < 1:
        raise ValueError(f"checkpoint keep must be >= 1, got {keep}")
    for name in extra_models:
        if not name or name.startswith(".") or "/" in name or name == TRAINER_STATE:
            raise ValueError(f"checkpoint extra_models: {name!r} is not a plain directory name")


def _weights(
    model: Any,
    model_state: Mapping[str, torch.Tensor] | None,
    extra_models: Mapping[str, Any],
    given: Mapping[str, Mapping[str, torch.Tensor]],
) -> dict[str, Mapping[str, torch.Tensor]]:
    """The weights a checkpoint saves, by part: the given (gathered) states, else each
    model's own state dict."""
    return {"policy": model_state or model.state_dict()} | {
        name: given.get(name) or part.state_dict() for name, part in extra_models.items()
    }


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
