"""The run directory, atomic file writes and the per-step metrics log.

A run directory is never overwritten: a new run gets a fresh, unique name, and an
explicit ``--out`` that already holds files is refused with the command that
continues it instead. Every whole-file write (config, ledger, summary) goes
through a temporary file in the same directory and ``os.replace``, so a reader —
or a resume after ``kill -9`` — sees the old file or the new one, never half of
either. The JSON-lines logs (``metrics.jsonl``, ``resumes.jsonl``) are written by
appending (:func:`append_jsonl`); their reader (:func:`read_jsonl`) ignores a last line
torn by a crash mid-write, and the next append cuts it first.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from rlmap.core.errors import InputError

DEFAULT_ROOT = Path("runs")
METRICS_FILE = "metrics.jsonl"


RESUME_HINT = "use --resume {out} to continue it"


def create_run_dir(
    root: Path | None = None,
    out: Path | None = None,
    *,
    kind: str = "run directory",
    hint: str = RESUME_HINT,
    force: bool = False,
) -> Path:
    """Create and return the directory of a new run; never reuse one that holds files.

    With ``out``: create it (an existing *empty* directory is accepted) or raise
    :class:`InputError` when it already holds anything (``hint``, formatted with
    ``out``, says what to do instead; ``force`` accepts it) or is not a directory.
    Without: create ``<root>/<UTC timestamp>-<6 hex digits>`` (root defaults to
    ``runs``); the random suffix keeps two runs started in the same second apart,
    and ``mkdir(exist_ok=False)`` makes the claim atomic. ``kind`` names the
    directory in messages. A directory that cannot be made (read-only or full disk,
    a file in the way) is an InputError naming it.
    """
    if out is not None:
        out = Path(out)
        check_new_dir(out, kind=kind, hint=hint, force=force)
        _mkdir(out, kind, parents=True, exist_ok=True)
        return out
    root = DEFAULT_ROOT if root is None else Path(root)
    _mkdir(root, kind, parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for _ in range(100):
        candidate = root / f"{stamp}-{secrets.token_hex(3)}"
        try:
            _mkdir(candidate, kind)
        except FileExistsError:
            continue
        return candidate
    raise InputError(f"{root}: could not find a free {kind} name for {stamp}")


def check_new_dir(
    out: Path, *, kind: str = "run directory", hint: str = RESUME_HINT, force: bool = False
) -> None:
    """InputError unless ``out`` is absent or an empty directory (or any directory, with
    ``force``); nothing is created. Lets a command check its output before its work."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory; the {kind} must be a directory")
    if out.is_dir() and not force and any(out.iterdir()):
        raise InputError(f"{out}: {kind} exists; {hint.format(out=out)}")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise InputError(f"{out}: {parent} is not a directory")


def _mkdir(path: Path, kind: str, *, parents: bool = False, exist_ok: bool = False) -> None:
    try:
        path.mkdir(parents=parents, exist_ok=exist_ok)
    except FileExistsError:
        if not exist_ok:
            raise  # a name just taken: the caller tries another
        raise InputError(f"{path}: exists and is not a directory") from None
    except OSError as exc:
        where = exc.filename if exc.filename not in (None, str(path)) else None
        detail = f"{exc.strerror}: {where}" if where else exc.strerror
        raise InputError(f"{path}: cannot create the {kind} ({detail})") from None


def check_new_file(path: Path, *, force: bool = False) -> None:
    """InputError unless ``path`` can be written as a new file: it does not exist (with
    ``force``: or is a regular file, to be replaced), and its parent is a directory.

    Nothing is created and no parent is made: a typo in a directory name is an error,
    not a new directory. Only regular files are ever replaced, never a directory or a
    device (``--force`` onto ``/dev/null`` is refused).
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give a file name")
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise InputError(f"{path}: exists and is not a regular file; it is never replaced")
        if not force:
            raise InputError(f"{path}: exists; use --force to overwrite it")
    parent = path.parent
    if not parent.exists():
        raise InputError(f"{path}: no such directory {parent}")
    if not parent.is_dir():
        raise InputError(f"{path}: {parent} is not a directory")


def write_new_text(path: Path, text: str, *, force: bool = False) -> None:
    """:func:`check_new_file`, then write ``text`` atomically: a failed write (a read-only
    or full disk) raises OSError naming ``path`` and leaves no partial file."""
    check_new_file(path, force=force)
    write_text_atomic(path, text)


@contextlib.contextmanager
def removed_on_failure(path: Path, *, existed: bool) -> Iterator[None]:
    """Remove the directory ``path`` if the block fails, unless it ``existed`` before the
    command made it: a command that fails half-way through writing its output (a full
    disk) leaves no empty or half-written directory behind."""
    try:
        yield
    except BaseException:
        if not existed:
            shutil.rmtree(path, ignore_errors=True)
        raise


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
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _named(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):
            raise _named(exc, path) from exc
        raise
    fsync_dir(path.parent)


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` naming the file meant (not a temporary name), for a one-line error."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror, str(path))


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


def _decode(line: bytes) -> Any:
    """One JSON line; raises UnicodeDecodeError, JSONDecodeError or RecursionError."""
    return json.loads(line.decode("utf-8"))


def read_jsonl(path: Path, what: str = "log") -> list[tuple[int, Any]]:
    """(line number, value) of each line of a JSON-lines log; a final line that does not
    parse is a torn write and dropped.

    Any other line that does not parse is an :class:`InputError` (a ValueError) naming
    ``path:lineno``; so is a file that cannot be read (``what`` names it).
    """
    try:
        lines = Path(path).read_bytes().split(b"\n")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    values: list[tuple[int, Any]] = []
    for index, (lineno, line) in enumerate(numbered):
        try:
            values.append((lineno, _decode(line)))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            if index == len(numbered) - 1:
                break  # torn by a crash mid-append: the record was never complete
            if isinstance(err, json.JSONDecodeError):
                raise InputError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
            why = "not UTF-8" if isinstance(err, UnicodeDecodeError) else "nested too deeply"
            raise InputError(f"{path}:{lineno}: {why}") from None
    return values


def _parse_records(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics file (:func:`read_jsonl`); a line that is not an object with an
    int ``step`` is an :class:`InputError` naming ``path:lineno``."""
    records: list[dict[str, Any]] = []
    for lineno, record in read_jsonl(path, "metrics"):
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise InputError(f"{path}:{lineno}: not a metrics record (an object with int 'step')")
        records.append(record)
    return records


def _write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the metrics file with ``records``, one JSON line each, atomically."""
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in records)
    write_text_atomic(path, text)


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` to the JSON-lines log ``path`` as one line and flush it.

    A last line torn by a crash mid-append is cut first (:func:`_mend_jsonl`), so the new
    line starts a line of its own instead of ending a torn one. Each append opens, writes
    one line and closes the file: the line is in the OS's hands at once, and nothing stays
    open between appends. A write the disk refuses is an OSError naming ``path``.
    """
    path = Path(path)
    line = json.dumps(record, allow_nan=False) + "\n"
    try:
        _mend_jsonl(path)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
    except OSError as exc:
        raise _named(exc, path) from exc


def _mend_jsonl(path: Path) -> None:
    """Make a JSON-lines log end on a newline, as :func:`read_jsonl` reads it: a last line
    that parses lost only its newline and keeps it; one that does not was torn and is cut
    (an atomic rewrite). A missing file, or one that ends on a newline, is left alone."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
    data = path.read_bytes()
    head, newline, tail = data.rpartition(b"\n")
    try:
        _decode(tail)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        write_bytes_atomic(path, head + newline)
        return
    write_bytes_atomic(path, data + b"\n")


class MetricsLog:
    """Append-only ``metrics.jsonl``: one JSON object ``{"step": N, ...}`` per line.

    Appends go through :func:`append_jsonl`: a file ending in a torn line (a crash
    mid-append) loses it before the next line is written.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

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
        append_jsonl(self.path, record)

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """All complete records of ``path``, in file order ([] if it does not exist).

        A torn last line is ignored; a malformed line before the last raises
        :class:`InputError` (a ValueError) naming ``path:lineno``.
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


def read_json_object(path: Path, what: str) -> dict[str, Any] | None:
    """A run's JSON object file (None when absent); InputError naming it when it is not one."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: not a {what} (invalid JSON at line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a {what} (expected a JSON object)")
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from a file; InputError naming the file (and line) when it is not one.

    A missing path, a directory, a file that is not UTF-8 or not YAML, and a YAML value
    other than a mapping are each one line that starts with the path.
    """
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{p}: no such config file") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory, not a config file") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read the config file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        byte = exc.object[exc.start]
        raise InputError(f"{p}:{line}: not UTF-8 text (byte {byte:#04x})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{p}{where}: not valid YAML") from None
    except RecursionError:
        raise InputError(f"{p}: not valid YAML (nested too deeply)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a mapping of config sections at the top level")
    return data
