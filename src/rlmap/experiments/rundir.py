"""The run directory, atomic file writes and the per-step metrics log.

A run directory is never overwritten: a new run gets a fresh, unique name, and an
explicit ``--out`` that already holds files is refused with the command that
continues it instead. Every whole-file write (config, ledger, summary) goes
through a temporary file in the same directory and ``os.replace``, so a reader —
or a resume after ``kill -9`` — sees the old file or the new one, never half of
either. ``metrics.jsonl`` is the one file written by appending; its reader
ignores a line torn by a crash mid-write.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError

DEFAULT_ROOT = Path("runs")
METRICS_FILE = "metrics.jsonl"


def create_run_dir(root: Path | None = None, out: Path | None = None) -> Path:
    """Create and return the directory of a new run; never reuse one that holds files.

    With ``out``: create it (an existing *empty* directory is accepted) or raise
    :class:`ConfigError` naming ``--resume`` when it already holds anything.
    Without: create ``<root>/<UTC timestamp>-<6 hex digits>`` (root defaults to
    ``runs``); the random suffix keeps two runs started in the same second apart,
    and ``mkdir(exist_ok=False)`` makes the claim atomic.
    """
    if out is not None:
        out = Path(out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError(f"{out}: run directory exists; use --resume {out} to continue it")
        out.mkdir(parents=True, exist_ok=True)
        return out
    root = DEFAULT_ROOT if root is None else Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for _ in range(100):
        candidate = root / f"{stamp}-{secrets.token_hex(3)}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"{root}: could not find a free run directory name for {stamp}")


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename inside it) to disk; a no-op where unsupported."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: temp file, flush, fsync, ``os.replace``."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as strict, indented JSON, atomically.

    Values pass through :func:`to_jsonable` first: 0-d tensors and numpy scalars
    become numbers, NaN/±inf become ``null``, tuples lists, paths strings.
    """
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False)
    write_text_atomic(path, text + "\n")


def to_jsonable(obj: Any) -> Any:
    """``obj`` made of JSON types only; raises TypeError for what has no JSON form.

    Duck-typed (``.item()`` on a 0-d array), so neither torch nor numpy is imported.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:
        return to_jsonable(obj.item())
    raise TypeError(f"{type(obj).__name__} has no JSON form (value {obj!r:.80})")


def _metric_value(name: str, value: Any) -> float | int | None:
    """One metric as a plain number (0-d tensors via float()); NaN/inf → None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if hasattr(value, "ndim") and getattr(value, "ndim", None) != 0:
        raise TypeError(f"metric {name!r}: expected a scalar, got shape {tuple(value.shape)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r}: expected a number, got {type(value).__name__}") from None
    return number if math.isfinite(number) else None


def _parse_records(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics file; a final line that does not parse is a torn write and dropped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    records: list[dict[str, Any]] = []
    for index, (lineno, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if index == len(numbered) - 1:
                break  # torn by a crash mid-append: the step was never complete
            raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{lineno}: not a metrics record (an object with int 'step')")
        records.append(record)
    return records


def _write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the metrics file with ``records``, one JSON line each, atomically."""
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in records)
    write_text_atomic(path, text)


class MetricsLog:
    """Append-only ``metrics.jsonl``: one JSON object ``{"step": N, ...}`` per line.

    Opening a log whose file ends in a torn line (a crash mid-append) rewrites the
    file without it, so the next append starts on a fresh line. Each append opens,
    writes one line and closes the file: the line is in the OS's hands at once, and
    nothing stays open between steps.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                _write_records(self.path, _parse_records(self.path))

    def append(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write ``{"step": step, **metrics}`` as one line and flush it.

        Values are plain numbers: 0-d tensors are converted with ``float()``;
        NaN and ±inf are written as ``null``. A non-scalar raises TypeError
        naming the metric.
        """
        if "step" in metrics:
            raise ValueError("metrics: 'step' is the record key; pass it as the step argument")
        record: dict[str, Any] = {"step": int(step)}
        record.update({name: _metric_value(name, v) for name, v in metrics.items()})
        line = json.dumps(record, allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """All complete records of ``path``, in file order ([] if it does not exist).

        A torn last line is ignored; a malformed line before the last raises
        ValueError naming ``path:lineno``.
        """
        return _parse_records(Path(path)) if Path(path).exists() else []

    @staticmethod
    def truncate_after(path: Path, step: int) -> list[dict[str, Any]]:
        """Keep only records with ``step <= step`` (atomic rewrite); return them.

        Resume calls this with the checkpoint's step, so steps logged after the
        checkpoint — which the resumed run will redo — are not counted twice.
        """
        kept = [r for r in MetricsLog.read(path) if r["step"] <= step]
        if Path(path).exists():
            _write_records(Path(path), kept)
        return kept
