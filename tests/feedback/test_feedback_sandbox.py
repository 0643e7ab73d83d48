"""The code sandbox: ordinary runs, then hostile model-written code.

Every hostile snippet is paired with tests it can only pass if containment failed
(``solve()`` returns 42 only when the attack worked) or that it fails anyway, so
each must end as a failure of that sample, within the limits, with nothing left
behind and this process alive. Small limits keep the file fast.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlmap.feedback import sandbox
from rlmap.feedback.sandbox import SandboxError, SandboxLimits, SandboxResult, run_python

LIMITS = SandboxLimits(
    wall_seconds=2.0,
    cpu_seconds=1,
    memory_bytes=256 * 2**20,
    max_processes=8,
    output_bytes=64 * 2**10,
    file_bytes=2**20,
)
SLACK = 1.5  # seconds past the wall limit allowed for kill, reap and clean-up
ISOLATION = sandbox.host_isolation()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.private_root, reason="needs root and util-linux unshare (namespaces)"
)
needs_uid_drop = pytest.mark.skipif(ISOLATION.uid is None, reason="needs root (uid drop)")


def _sandbox_dirs() -> set[str]:
    """This process's sandbox directories (another xdist worker's may exist meanwhile)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"rlmap-sandbox-{os.getpid()}-*")}


def _live_pids_of(uid: int) -> list[int]:
    return sandbox._pids_of(uid)


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """run_python with the small limits; checks clean-up after each call."""
    monkeypatch.setenv("RLMAP_TEST_SECRET", "hunter2-secret-value")
    before = _sandbox_dirs()
    results: list[SandboxResult] = []

    def call(code: str, tests: str = "assert solve() == 42\n") -> SandboxResult:
        result = run_python(code, tests, LIMITS)
        results.append(result)
        return result

    yield call
    assert _sandbox_dirs() <= before, "a sandbox temporary directory was left behind"
    for result in results:
        if result.isolation.uid is not None:
            assert _live_pids_of(result.isolation.uid) == [], "a sandbox process survived"


# ---------------------------------------------------------------- ordinary runs


def test_correct_solution_passes_assert_style(run) -> None:
    result = run("def solve():\n    return 42\n")
    assert result.passed and result.reason == "passed"
    assert result.returncode == 0
    assert "<nonce>" in result.stdout_tail  # the proof is in stdout, masked in the report


def test_wrong_solution_fails(run) -> None:
    result = run("def solve():\n    return 41\n")
    assert not result.passed and result.reason == "tests_failed"
    assert "AssertionError" in result.stderr_tail


def test_syntax_error_in_solution_is_a_solution_error(run) -> None:
    result = run("def solve(:\n    return 42\n")
    assert not result.passed and result.reason == "solution_error"
    assert "SyntaxError" in result.stderr_tail


def test_test_functions_are_called(run) -> None:
    tests = (
        "def test_good():\n    assert solve() == 42\n\ndef test_bad():\n    assert solve() == 0\n"
    )
    assert run("def solve():\n    return 42\n", tests).reason == "tests_failed"
    ok = "def test_good():\n    assert solve() == 42\n"
    assert run("def solve():\n    return 42\n", ok).passed


def test_unittest_cases_run(run) -> None:
    tests = (
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_value(self):\n"
        "        self.assertEqual(solve(), 42)\n"
    )
    assert run("def solve():\n    return 42\n", tests).passed
    failed = run("def solve():\n    return 7\n", tests)
    assert failed.reason == "tests_failed" and "FAILED" in failed.stderr_tail


def test_solution_may_use_stdlib_and_its_working_directory(run) -> None:
    code = (
        "import json, math, os, fractions, collections, tempfile\n"
        "with open('scratch.json', 'w') as f:\n"
        "    json.dump({'v': math.isqrt(1764)}, f)\n"
        "with tempfile.TemporaryFile() as t:\n"
        "    t.write(b'x')\n"
        "def solve():\n"
        "    with open(os.path.join(os.getcwd(), 'scratch.json')) as f:\n"
        "        return json.load(f)['v']\n"
    )
    result = run(code)
    assert result.passed, result.stderr_tail


def test_output_of_the_solution_is_reported(run) -> None:
    result = run("print('hello from the solution')\ndef solve():\n    return 42\n")
    assert result.passed and "hello from the solution" in result.stdout_tail


def test_large_program_is_delivered_whole(run) -> None:
    padding = "".join(f"v{i} = {i}\n" for i in range(20000))  # ~200 KB through stdin
    assert run(padding + "def solve():\n    return v19999 - 19957\n").passed


def test_tests_that_do_not_compile_are_a_config_error() -> None:
    with pytest.raises(SyntaxError):
        run_python("x = 1", "assert (", LIMITS)


def test_concurrent_runs_from_threads() -> None:
    results: list[SandboxResult] = []
    threads = [
        threading.Thread(
            target=lambda v=v: results.append(run_python(f"x = {v}", f"assert x == {v}"))
        )
        for v in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(r.passed for r in results)
    uids = {r.isolation.uid for r in results}
    assert ISOLATION.uid is None or len(uids) == 3  # each run has a uid of its own


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="cpu_seconds"):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ValueError, match="output_bytes"):
        SandboxLimits(output_bytes=0)


def test_isolation_is_reported(run) -> None:
    result = run("def solve():\n    return 42\n")
    assert result.isolation == sandbox.Isolation(
        network=ISOLATION.network,
        pid_namespace=ISOLATION.pid_namespace,
        private_root=ISOLATION.private_root,
        uid=result.isolation.uid,
    )


@needs_namespaces
def test_setup_failure_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch) -> None:
    host = sandbox._host()
    broken = sandbox._Host("/nonexistent/python", host.root, host.unshare, host.unique_uids)
    monkeypatch.setattr(sandbox, "_host", lambda: broken)
    with pytest.raises(SandboxError, match="did not start"):
        run_python("x = 1", "assert x == 1", LIMITS)


def test_root_without_a_way_to_drop_privileges_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    host = sandbox._Host(sandbox._host().python, root=True, unshare=None, unique_uids=True)
    monkeypatch.setattr(sandbox, "_host", lambda: host)
    monkeypatch.setattr(sandbox, "_others_can_use", lambda path: False)
    with pytest.raises(SandboxError, match="refusing"):
        run_python("x = 1", "assert x == 1", LIMITS)


# ---------------------------------------------------------------- hostile code


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    tests: str = "assert solve() == 42\n"
    stopped_by: tuple[str, ...] = ()
    """The reasons that show the intended mechanism stopped it (empty: any failure)."""


UNITTEST_TESTS = (
    "import unittest\n"
    "class T(unittest.TestCase):\n"
    "    def test_value(self):\n"
    "        self.assertEqual(solve(), 42)\n"
)

# A module that, imported as ``unittest``, swaps itself for the real one, patched.
SELF_PATCHING_UNITTEST = (
    "import sys\n"
    "sys.path.remove('.')\n"
    "del sys.modules['unittest']\n"
    "import unittest as real\n"
    "real.TestCase.assertEqual = lambda *a, **k: None\n"
    "sys.modules['unittest'] = real\n"
)

HOSTILE = [
    Hostile("infinite_loop", "while True:\n    pass\n", stopped_by=("cpu_limit",)),
    Hostile(
        "busy_cpu_ignoring_signals",
        "import signal\n"
        "for s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "x = 0\nwhile True:\n    x += 1\n",
    ),
    Hostile(
        "sleep_forever",
        "import time\ntime.sleep(10**6)\ndef solve():\n    return 42\n",
        stopped_by=("timeout",),
    ),
    Hostile("fork_bomb", "import os\nwhile True:\n    os.fork()\n"),
    Hostile(
        "fork_bomb_that_keeps_trying",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    ),
    Hostile(
        "os_system_loop",
        "import os\nwhile True:\n    os.system('sleep 100 &')\n",
    ),
    Hostile(
        "detached_subprocesses",
        "import subprocess\n"
        "for _ in range(4):\n"
        "    subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
        "def solve():\n    return 0\n",
    ),
    Hostile(
        "huge_allocation",
        "x = bytearray(10**11)\ndef solve():\n    return 42\n",
        stopped_by=("memory_limit",),
    ),
    Hostile(
        "allocation_loop",
        "keep = []\nwhile True:\n    keep.append(bytearray(10**7))\n",
        stopped_by=("memory_limit",),
    ),
    Hostile("huge_print", "while True:\n    print('x' * 10000)\n", stopped_by=("output_limit",)),
    Hostile(
        "huge_stderr",
        "import sys\nwhile True:\n    sys.stderr.write('y' * 10000)\n",
        stopped_by=("output_limit",),
    ),
    Hostile(
        "huge_file",
        "with open('big', 'wb') as f:\n    for _ in range(1000):\n        f.write(b'0' * 2**20)\n"
        "def solve():\n    return 42\n",
    ),
    Hostile(
        "many_files",
        "for i in range(10**6):\n    open(f'f{i}', 'w').close()\ndef solve():\n    return 42\n",
    ),
    Hostile(
        "thread_bomb",
        "import threading, time\n"
        "while True:\n    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n",
    ),
    Hostile(
        "deep_recursion",
        "import sys\nsys.setrecursionlimit(10**8)\n"
        "def f(n):\n    return f(n + 1) + 1\nf(0)\ndef solve():\n    return 42\n",
    ),
    Hostile(
        "c_stack_overflow",
        "import sys\nsys.setrecursionlimit(10**8)\nnested = []\n"
        "for _ in range(10**6):\n    nested = [nested]\nrepr(nested)\n"
        "def solve():\n    return 42\n",
    ),
    Hostile(
        "raise_own_limits",
        "import resource\n"
        "for r in (resource.RLIMIT_CPU, resource.RLIMIT_NPROC, resource.RLIMIT_AS):\n"
        "    resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "def solve():\n    return 42\n",
    ),
    Hostile(
        "become_root",
        "import os\nos.setuid(0)\nos.chroot('/')\ndef solve():\n    return 42\n",
    ),
    Hostile(
        "close_stdout_then_hang",
        "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(10**6)\n",
    ),
    Hostile(
        "sys_exit_before_tests",
        "import sys\nsys.exit(0)\n",
        "assert True\n",
        stopped_by=("exited_early",),
    ),
    Hostile(
        "os_exit_before_tests",
        "import os\nos._exit(0)\n",
        "assert True\n",
        stopped_by=("exited_early",),
    ),
    Hostile(
        "fake_success_output",
        "import os\nprint('OK')\nprint('All tests passed')\nos.write(1, b'\\nPASSED\\n')\n"
        "os._exit(0)\n",
        stopped_by=("exited_early",),
    ),
    Hostile(
        "atexit_hook",
        "import atexit, os\natexit.register(lambda: os._exit(0))\ndef solve():\n    return 0\n",
    ),
    Hostile(
        "steal_the_nonce_from_stdin",
        "import sys, os\ndata = sys.stdin.read()\nos.write(1, data.encode())\nos._exit(0)\n",
        "assert True\n",
        stopped_by=("exited_early",),
    ),
    Hostile(
        "patch_unittest",
        "import unittest\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "unittest.TestResult.wasSuccessful = lambda self: True\n"
        "def solve():\n    return 0\n",
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_value(self):\n"
        "        self.assertEqual(solve(), 42)\n",
    ),
    Hostile(
        "import_hook_serving_a_patched_unittest",
        "import builtins, sys, unittest\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "real_import = builtins.__import__\n"
        "def fake(name, *a, **k):\n"
        "    return unittest if name == 'unittest' else real_import(name, *a, **k)\n"
        "builtins.__import__ = fake\n"
        "def solve():\n    return 0\n",
        UNITTEST_TESTS,
        stopped_by=("tests_failed",),
    ),
    Hostile(
        "shadow_unittest_on_sys_path",
        "import sys\n"
        f"open('unittest.py', 'w').write({SELF_PATCHING_UNITTEST!r})\n"
        "sys.path.insert(0, '.')\n"
        "for name in [m for m in sys.modules if m.startswith('unittest')]:\n"
        "    del sys.modules[name]\n"
        "def solve():\n    return 0\n",
        UNITTEST_TESTS,
        stopped_by=("tests_failed",),
    ),
    Hostile(
        "patch_import_and_builtins",
        "import builtins, types\n"
        "fake = types.ModuleType('unittest')\n"
        "real_import = builtins.__import__\n"
        "builtins.__import__ = lambda name, *a, **k: fake if name == 'unittest' "
        "else real_import(name, *a, **k)\n"
        "builtins.print = lambda *a, **k: None\n"
        "def solve():\n    return 0\n",
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_value(self):\n"
        "        self.assertEqual(solve(), 42)\n",
    ),
    Hostile(
        "kill_everything",
        "import os, signal\n"
        "for target in (-1, os.getppid(), 1):\n"
        "    try:\n        os.kill(target, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "def solve():\n    return 0\n",
    ),
]


@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda h: h.name)
def test_hostile_snippet_fails_within_limits(run, hostile: Hostile) -> None:
    result = run(hostile.code, hostile.tests)
    assert not result.passed, result
    assert result.reason != "passed"
    assert result.wall_seconds < LIMITS.wall_seconds + SLACK
    if hostile.stopped_by:
        assert result.reason in hostile.stopped_by, result


def test_enough_hostile_snippets() -> None:
    assert len(HOSTILE) + len(CONTAINMENT) >= 20


# Snippets whose harm would land outside the sandbox: checked from outside as well.

CONTAINMENT = ["env", "private_file", "visible_file", "write_outside", "delete_outside", "net"]


def test_environment_secret_is_not_visible(run) -> None:
    code = (
        "import os, glob\n"
        "seen = repr(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n        seen += open(path, 'rb').read().decode(errors='replace')\n"
        "    except OSError:\n        pass\n"
        "def solve():\n    return 42 if 'hunter2' in seen else 0\n"
    )
    result = run(code)
    assert not result.passed and result.reason == "tests_failed"
    assert os.environ["RLMAP_TEST_SECRET"] == "hunter2-secret-value"  # the parent has it


@needs_uid_drop
def test_private_file_is_not_readable(run, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)  # even with the directory open, the file is the owner's
    code = f"def solve():\n    return 42 if 'hunter2' in open({str(secret)!r}).read() else 0\n"
    result = run(code)
    assert not result.passed and result.reason == "tests_failed"
    assert "PermissionError" in result.stderr_tail or "FileNotFoundError" in result.stderr_tail


@needs_namespaces
def test_host_files_are_not_there(run, tmp_path: Path) -> None:
    visible = tmp_path / "public.txt"
    visible.write_text("hunter2")
    visible.chmod(0o644)
    # the real /root's entries, except the one the interpreter lives under (if any)
    home = [str(p) for p in Path("/root").iterdir() if not sys.base_prefix.startswith(f"{p}/")]
    probes = [str(visible), str(Path(sandbox.__file__).resolve()), "/home", "/tmp", "/etc/passwd"]
    code = (
        "import os\nfound = []\n"
        f"for path in {[*probes, *home]!r}:\n"
        "    if os.path.exists(path):\n        found.append(path)\n"
        "print(found)\n"
        "def solve():\n    return 42 if found else 0\n"
    )
    result = run(code)
    assert not result.passed and "[]" in result.stdout_tail


def test_writing_outside_the_directory_fails(run, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o777)  # world-writable: only the sandbox stops the write
    target = tmp_path / "pwned.txt"
    shared_tmp = Path(tempfile.gettempdir()) / f"rlmap-pwned-{os.getpid()}"
    code = (
        "ok = 0\n"
        f"for path in ({str(target)!r}, {str(shared_tmp)!r}, '../escaped.txt', '/escaped.txt'):\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n            f.write('pwned')\n"
        "        ok += 1\n"
        "    except OSError:\n        pass\n"
        "def solve():\n    return 42 if ok else 0\n"
    )
    result = run(code)
    assert not result.passed
    assert not target.exists() and not shared_tmp.exists()
    assert not Path("/escaped.txt").exists()


def test_deleting_outside_the_directory_fails(run, tmp_path: Path) -> None:
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir(mode=0o777)
    os.chmod(tmp_path, 0o777)
    os.chmod(victim_dir, 0o777)
    victim = victim_dir / "keep.txt"
    victim.write_text("keep me")
    victim.chmod(0o666)
    code = (
        "import os, shutil\ngone = 0\n"
        f"for path in ({str(victim)!r},):\n"
        "    try:\n        os.remove(path)\n        gone += 1\n    except OSError:\n        pass\n"
        "for path in ('..', '../..', '/'):\n"
        "    shutil.rmtree(path, ignore_errors=True)\n"
        "def solve():\n    return 42 if gone else 0\n"
    )
    result = run(code)
    assert not result.passed
    assert victim.read_text() == "keep me"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o666


@needs_namespaces
def test_network_connection_fails(run) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (
            "import socket\nconnected = 0\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "    connected += 1\n"
            "except OSError:\n    pass\n"
            "try:\n"
            "    socket.getaddrinfo('pypi.org', 443)\n"
            "    connected += 1\n"
            "except OSError:\n    pass\n"
            "def solve():\n    return 42 if connected else 0\n"
        )
        result = run(code)
        assert not result.passed and result.reason == "tests_failed"
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected


# ---------------------------------------------------------------- without namespaces


def _world_usable_python() -> str | None:
    for candidate in (sandbox._host().python, "/usr/bin/python3"):
        if os.path.exists(candidate) and sandbox._others_can_use(candidate):
            return os.path.realpath(candidate)
    return None


@needs_uid_drop
@pytest.mark.parametrize("name", ["fork_bomb", "detached_subprocesses", "kill_everything"])
def test_fallback_without_namespaces_still_contains(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    """Root without ``unshare``: the uid drop and the limits alone hold the sandbox."""
    python = _world_usable_python()
    if python is None:
        pytest.skip("no interpreter an unprivileged uid can run")
    host = sandbox._Host(python, root=True, unshare=None, unique_uids=sandbox._host().unique_uids)
    monkeypatch.setattr(sandbox, "_host", lambda: host)
    monkeypatch.setattr(sandbox, "_others_can_use", lambda path: True)  # checked above
    hostile = next(h for h in HOSTILE if h.name == name)
    result = run_python(hostile.code, hostile.tests, LIMITS)
    assert not result.passed and result.isolation.uid is not None
    assert not result.isolation.network and not result.isolation.private_root
    assert _live_pids_of(result.isolation.uid) == []
    assert run_python("def solve():\n    return 42\n", "assert solve() == 42", LIMITS).passed
