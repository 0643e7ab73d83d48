"""The hostile-program suite: every program in ``hostile/`` on both verifier paths.

A program (``hostile/<name>.py``) says in its docstring what it tries, its ``class``,
the ``tests`` it is paired with (default ``assert solve() == 42``; ``solve()`` returns
42 only when the attack worked) and, optionally, ``stopped_by``: the reasons that
show the intended mechanism stopped it, and ``needs``: the containment (fields of
``Isolation``) without which it would win or do harm — skipped on a host without it
(docs/verifiers.md says what each host gets). Each must end as a failure of its sample —
never a pass — within the limits, and leave nothing behind: no process of the run's
uids, no launcher, no temporary directory, no SysV IPC object, no POSIX queue, no key
(a lock dies with its holder: no process, no lock). Three paths:

- ``in_process``: ``run_python`` called directly (``code_tests`` is
  ``float(run_python(extract_code(response), tests).passed)``), its reason checked;
- ``worker``: ``code_tests`` in the isolation worker of ``feedback.timeout_s``, the
  deadline past the sandbox's wall limit: the sandbox ends each run, the score is 0;
- ``worker_deadline``: ``feedback.timeout_s`` shorter than the wall limit, so the worker
  is killed mid-run whenever a program takes longer: TimeoutError (status ``timeout``,
  never a pass) or 0 — and nothing left behind either way.

Small limits keep the suite fast (about a minute on two cores).
"""

from __future__ import annotations

import ast
import collections
import ctypes
import dataclasses
import functools
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlmap.feedback import sandbox
from rlmap.feedback.isolation import IsolatedVerifier
from rlmap.feedback.sandbox import SandboxLimits, run_python
from rlmap.feedback.verifiers import code_tests

LIMITS = SandboxLimits(
    wall_seconds=2.0,
    cpu_seconds=1,
    memory_bytes=256 * 2**20,
    max_processes=8,
    output_bytes=64 * 2**10,
    file_bytes=2**20,
)
MEMORY_LIMITS = dataclasses.replace(
    LIMITS, wall_seconds=3.0, cpu_seconds=2, memory_bytes=128 * 2**20
)
"""For the ``memory`` class on the in-process path, whose reason is checked: the memory
limit must fire before the CPU limit however slow the host. Filling 256 MiB page by page
cost 0.2 s of CPU here, and once over 1 s on a loaded CI host (a ``cpu_limit``)."""
SLACK = 1.5  # seconds past the wall limit allowed for kill, reap and clean-up
DEADLINE = 0.5  # feedback.timeout_s of the worker_deadline path: shorter than the wall limit
ISOLATION = sandbox.host_isolation()
UNITTEST = (
    "import unittest\n"
    "class T(unittest.TestCase):\n"
    "    def test_value(self):\n"
    "        self.assertEqual(solve(), 42)\n"
)
TESTS = {
    "solve42": "assert solve() == 42\n",
    "functions": "def test_value():\n    assert solve() == 42\n",
    "unittest": UNITTEST,
    "trivial": "assert True\n",  # any run that completes passes: only an exit trick fails it
    "shadow": "assert len(solve()) == 3\nassert sorted(solve()) == [1, 2, 3]\n",
    "text": 'assert solve() == "42"\n',
    "asserts": "assert solve() == 42\nassert solve() + 1 == 43\n",
    "expected": "expected = 42\nassert solve() == expected\n",
    "roundtrip": "assert decode(encode(42)) == 42\n",
}
"""The test sources a program's ``tests:`` names."""


@dataclass(frozen=True)
class Program:
    name: str
    kind: str
    """Its class: reward_hack, keyring, ipc, signals, processes, ..."""
    code: str
    tests: str
    stopped_by: tuple[str, ...]
    """Reasons that show the intended mechanism stopped it (empty: any failure)."""
    needs: tuple[str, ...]
    """Fields of ``Isolation`` that must hold on this host for it to run."""

    @property
    def runs_here(self) -> bool:
        return all(getattr(ISOLATION, n) not in (None, False) for n in self.needs)


def load(path: Path) -> Program:
    """A program and the fields of its docstring (its last paragraph)."""
    code = path.read_text()
    doc = ast.get_docstring(ast.parse(code)) or ""
    fields = dict(line.split(": ", 1) for line in doc.rsplit("\n\n", 1)[1].splitlines())
    return Program(
        name=path.stem,
        kind=fields["class"],
        code=code,
        tests=TESTS[fields.get("tests", "solve42")],
        stopped_by=tuple(fields["stopped_by"].split(", ")) if "stopped_by" in fields else (),
        needs=tuple(fields["needs"].split(", ")) if "needs" in fields else (),
    )


PROGRAMS = [load(p) for p in sorted(Path(__file__).with_name("hostile").glob("*.py"))]
PATHS = ("in_process", "worker", "worker_deadline")


# ---------------------------------------------------------------- what is left behind


@dataclass(frozen=True)
class Kernel:
    """The kernel objects a run could leave: SysV IPC objects and keys held per uid."""

    ipc: frozenset[tuple[str, int, int]]
    keys: dict[int, int]

    @staticmethod
    def now() -> Kernel:
        return Kernel(frozenset(ipc_objects()), key_counts())


def leftovers(owners: list[int], before: Kernel) -> list[str]:
    """What runs of processes ``owners`` left behind since ``before`` (each caller's uids
    are its own)."""
    after, found = Kernel.now(), []
    for owner in owners:
        first = sandbox._uid_range(owner) if ISOLATION.uid is not None else -1
        ours = range(first, first + 256) if first >= 0 else range(0)
        marker = f"rlmap-sandbox-{owner}-".encode()
        for pid, uid in sandbox._processes():
            if uid in ours or marker in sandbox._cmdline(pid):
                found.append(f"process {pid} of uid {uid}")
        tmp = Path(tempfile.gettempdir())
        found += [f"directory {p}" for p in tmp.glob(f"rlmap-sandbox-{owner}-*")]
        new_ipc = after.ipc - before.ipc
        found += [f"SysV {kind} {ident}" for kind, ident, uid in new_ipc if uid in ours]
        for uid, count in after.keys.items():
            if uid in ours and count > before.keys.get(uid, 0):
                found.append(f"{count} keys of uid {uid}")
    if unlink_posix_queue():
        found.append("POSIX message queue /rlmap-hostile-mq")
    return found


def ipc_objects() -> Iterator[tuple[str, int, int]]:
    """(kind, id, owner uid) of every SysV IPC object in this IPC namespace."""
    for kind in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        header = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(header, line.split(), strict=False))
            yield kind, int(row[header[1]]), int(row["uid"])


def key_counts() -> dict[int, int]:
    """Keys held per uid (``/proc/key-users``: ``uid: usage nkeys/nikeys ...``)."""
    counts = {}
    for line in Path("/proc/key-users").read_text().splitlines():
        uid, rest = line.split(":", 1)
        counts[int(uid)] = int(rest.split()[1].split("/")[0])
    return counts


def unlink_posix_queue() -> bool:
    """Remove the queue ``posix_message_queue`` makes; whether it was there (outside)."""
    librt = ctypes.CDLL("librt.so.1", use_errno=True)
    return librt.mq_unlink(b"/rlmap-hostile-mq") == 0


def clean(owners: list[int]) -> None:
    """Remove what a failing case left, so that it does not fail the cases after it."""
    for owner in owners:
        sandbox.sweep(owner)
        first = sandbox._uid_range(owner)
        for kind, ident, uid in list(ipc_objects()):
            if first <= uid < first + 256:
                flag = {"shm": "-m", "msg": "-q", "sem": "-s"}[kind]
                subprocess.run(["ipcrm", flag, str(ident)], check=False)


# ---------------------------------------------------------------- the suite


@pytest.fixture(scope="module", autouse=True)
def trainer_secret() -> Iterator[None]:
    """A secret in the trainer's environment (``proc_environ_secret`` looks for it)."""
    os.environ["RLMAP_TEST_SECRET"] = "hunter2-secret-value"
    yield
    del os.environ["RLMAP_TEST_SECRET"]


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, IsolatedVerifier]]:
    verify = functools.partial(code_tests, limits=LIMITS)
    paths = {
        "worker": IsolatedVerifier(verify, timeout_s=LIMITS.wall_seconds + 5),
        "worker_deadline": IsolatedVerifier(verify, timeout_s=DEADLINE),
    }
    yield paths
    for verifier in paths.values():
        verifier.close()


def _through_worker(verifier: IsolatedVerifier, program: Program) -> tuple[float | None, int]:
    """(score, or None on TimeoutError; the worker's pid) of one program in the worker."""
    try:
        score: float | None = verifier(program.code, program.tests)
    except TimeoutError:
        score = None
    assert verifier._process is not None and verifier._process.pid is not None
    return score, verifier._process.pid


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_hostile_program_is_contained(
    program: Program, path: str, workers: dict[str, IsolatedVerifier]
) -> None:
    if not program.runs_here:
        pytest.skip(f"this host's sandbox lacks {program.needs}")
    limits = MEMORY_LIMITS if program.kind == "memory" and path == "in_process" else LIMITS
    before, started = Kernel.now(), time.monotonic()
    if path == "in_process":
        result = run_python(program.code, program.tests, limits)
        if result.reason == "timeout" and "cpu_limit" in program.stopped_by:
            # the spinning code got less than its CPU second of the 2 s wall clock: a loaded
            # machine (two test workers on two cores). Once more; a CPU limit that does not
            # work times out again, and the reason check below fails
            started = time.monotonic()
            result = run_python(program.code, program.tests, limits)
        assert not result.passed and result.reason != "passed", result
        if program.stopped_by:
            assert result.reason in program.stopped_by, result
        owners = [os.getpid()]
    else:
        score, worker = _through_worker(workers[path], program)
        assert score == 0.0 or (score is None and path == "worker_deadline")
        owners = [worker]
    assert time.monotonic() - started < limits.wall_seconds + SLACK
    left = leftovers(owners, before)
    if left:
        clean(owners)
    assert left == [], f"{program.name} left {left}"


def test_the_suite_covers_every_class() -> None:
    classes = collections.Counter(p.kind for p in PROGRAMS)
    assert len(PROGRAMS) >= 60
    named = {"reward_hack", "keyring", "ipc", "signals", "processes", "file_locks", "proc"}
    named |= {"timing", "memory", "output", "files", "network", "privileges", "harness"}
    assert named <= set(classes), classes
    assert len({p.name for p in PROGRAMS}) == len(PROGRAMS)


ORPHAN_MAKERS = ["sleep_forever", "fork_bomb_that_keeps_trying", "flock_and_sleep", "self_sigstop"]


@pytest.mark.parametrize("name", ORPHAN_MAKERS)
def test_a_verifier_killed_at_its_deadline_leaves_nothing(name: str) -> None:
    """``feedback.timeout_s`` far shorter than the sandbox's wall limit: the worker is killed
    mid-run, and the sandbox (launcher, init, the code, the temporary directory) goes
    with it at once — not at the wall limit, 30 s later."""
    program = next(p for p in PROGRAMS if p.name == name)
    patient = dataclasses.replace(LIMITS, wall_seconds=30.0, cpu_seconds=20)
    verifier = IsolatedVerifier(functools.partial(code_tests, limits=patient), timeout_s=1.0)
    before = Kernel.now()
    try:
        with pytest.raises(TimeoutError):
            verifier(program.code, program.tests)
        assert verifier._process is not None and verifier._process.pid is not None
        worker = verifier._process.pid
        left = leftovers([worker], before)
        if left:
            clean([worker])
        assert left == [], f"{name} left {left}"
    finally:
        verifier.close()


@pytest.mark.skipif(ISOLATION.uid is None, reason="needs root (uid drop)")
@pytest.mark.parametrize("name", ORPHAN_MAKERS)
def test_without_namespaces_a_killed_verifier_leaves_nothing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root without namespaces: no PID namespace to take the code down, so the death
    signals and the sweep by uid must; the worker inherits the patched host (fork)."""
    python = next(
        (
            os.path.realpath(p)
            for p in (sandbox._host().python, "/usr/bin/python3")
            if os.path.exists(p) and sandbox._others_can_use(p)
        ),
        None,
    )
    if python is None:
        pytest.skip("no interpreter an unprivileged uid can run")
    host = dataclasses.replace(sandbox._host(), python=python, namespaces=False)
    monkeypatch.setattr(sandbox, "_host", lambda: host)
    monkeypatch.setattr(sandbox, "_others_can_use", lambda path: True)  # checked above
    program = next(p for p in PROGRAMS if p.name == name)
    patient = dataclasses.replace(LIMITS, wall_seconds=30.0, cpu_seconds=20)
    verifier = IsolatedVerifier(functools.partial(code_tests, limits=patient), timeout_s=1.0)
    before = Kernel.now()
    try:
        with pytest.raises(TimeoutError):
            verifier(program.code, program.tests)
        assert verifier._process is not None and verifier._process.pid is not None
        left = leftovers([verifier._process.pid], before)
        if left:
            clean([verifier._process.pid])
        assert left == [], f"{name} left {left}"
    finally:
        verifier.close()
