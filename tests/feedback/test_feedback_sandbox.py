"""The code sandbox: ordinary runs, the two-process harness, keyrings and IPC, containment.

The hostile-program suite is ``test_feedback_hostile.py``; here, what needs a set-up
on the host side (a planted key, a secret file, a listening socket) or a host without
namespaces. A hostile snippet is paired with tests it can only pass if containment
failed (``solve()`` returns 42 only when the attack worked), so each must end as a
failure of that sample, with nothing left behind and this process alive. Small limits
keep the file fast.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
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
    not ISOLATION.private_root, reason="needs root and namespaces"
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
    assert result.isolation == dataclasses.replace(ISOLATION, uid=result.isolation.uid)


@needs_namespaces
def test_setup_failure_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch) -> None:
    host = sandbox._host()
    broken = dataclasses.replace(host, python="/nonexistent/python")
    monkeypatch.setattr(sandbox, "_host", lambda: broken)
    with pytest.raises(SandboxError, match="did not start"):
        run_python("x = 1", "assert x == 1", LIMITS)


def test_root_without_a_way_to_drop_privileges_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    host = dataclasses.replace(sandbox._host(), root=True, namespaces=False, unique_uids=True)
    monkeypatch.setattr(sandbox, "_host", lambda: host)
    monkeypatch.setattr(sandbox, "_others_can_use", lambda path: False)
    with pytest.raises(SandboxError, match="refusing"):
        run_python("x = 1", "assert x == 1", LIMITS)


# ---------------------------------------------------------------- the two-process harness
# The tests run in a process of their own and call into the solution's (see
# _sandbox_harness.py). These are ordinary programs that must pass as they did when
# both shared an interpreter; the hostile ones are in test_feedback_hostile.py.


def test_classes_instances_and_attributes(run) -> None:
    code = (
        "class Node:\n"
        "    def __init__(self, val, next=None):\n"
        "        self.val, self.next = val, next\n"
        "class Solution:\n"
        "    LIMIT = 3\n"
        "    def reverse(self, head):\n"
        "        prev = None\n"
        "        while head:\n"
        "            head.next, prev, head = prev, head, head.next\n"
        "        return prev\n"
    )
    tests = (
        "head = Node(1, Node(2, Node(3)))\n"
        "out = Solution().reverse(head)\n"
        "assert [out.val, out.next.val, out.next.next.val] == [3, 2, 1]\n"
        "assert out.next.next.next is None and Solution.LIMIT == 3\n"
        "assert isinstance(out, Node) and not isinstance(5, Node)\n"
        "out.val = 9\n"
        "assert out.val == 9\n"
        "assert head is out.next.next  # one proxy per object: identity holds\n"
    )
    result = run(code, tests)
    assert result.passed, result.stderr_tail


def test_data_of_every_kind_comes_back_equal(run) -> None:
    code = (
        "from collections import Counter, OrderedDict, deque\n"
        "from fractions import Fraction\n"
        "from decimal import Decimal\n"
        "def values():\n"
        "    return [None, True, 2**100, -0.5, float('inf'), 1 + 2j, 'é', b'\\x00',\n"
        "            bytearray(b'x'), (1, [2]), {3}, frozenset({4}), {(1, 2): {'a': [1]}},\n"
        "            range(2, 9, 3),\n"
        "            Fraction(1, 3), Decimal('0.1'), deque([1], maxlen=2), Counter('aab'),\n"
        "            OrderedDict(a=1)]\n"
        "def big():\n"
        "    return 7 ** 50000\n"
    )
    tests = (
        "from collections import Counter, OrderedDict, deque\n"
        "from fractions import Fraction\n"
        "from decimal import Decimal\n"
        "expected = [None, True, 2**100, -0.5, float('inf'), 1 + 2j, 'é', b'\\x00',\n"
        "            bytearray(b'x'), (1, [2]), {3}, frozenset({4}), {(1, 2): {'a': [1]}},\n"
        "            range(2, 9, 3), Fraction(1, 3), Decimal('0.1'), deque([1], maxlen=2),\n"
        "            Counter('aab'), OrderedDict(a=1)]\n"
        "got = values()\n"
        "assert got == expected\n"
        "assert [type(g) for g in got] == [type(e) for e in expected]\n"
        "assert got[16].maxlen == 2 and big() == 7 ** 50000\n"
    )
    result = run(code, tests)
    assert result.passed, result.stderr_tail


def test_in_place_changes_reach_the_tests(run) -> None:
    code = (
        "def sort_in_place(xs, *, table):\n"
        "    xs.sort()\n"
        "    table['done'] = True\n"
        "def rotate(matrix):\n"
        "    matrix[:] = [list(r) for r in zip(*matrix[::-1])]\n"
    )
    tests = (
        "xs, table = [3, 1, 2], {}\n"
        "assert sort_in_place(xs, table=table) is None\n"
        "assert xs == [1, 2, 3] and table == {'done': True}\n"
        "m = [[1, 2], [3, 4]]\n"
        "rotate(m)\n"
        "assert m == [[3, 1], [4, 2]]\n"
    )
    result = run(code, tests)
    assert result.passed, result.stderr_tail


def test_generators_iteration_and_containers(run) -> None:
    code = (
        "def count(n):\n"
        "    yield from range(n)\n"
        "class Bag:\n"
        "    def __init__(self): self.items = [1, 2]\n"
        "    def __len__(self): return len(self.items)\n"
        "    def __iter__(self): return iter(self.items)\n"
        "    def __getitem__(self, i): return self.items[i]\n"
        "    def __str__(self): return 'Bag(1, 2)'\n"
    )
    tests = (
        "assert list(count(3)) == [0, 1, 2] and sum(count(4)) == 6\n"
        "g = count(2)\n"
        "assert next(g) == 0 and next(g) == 1\n"
        "try:\n    next(g)\n    raise AssertionError('no StopIteration')\n"
        "except StopIteration:\n    pass\n"
        "b = Bag()\n"
        "assert len(b) == 2 and list(b) == [1, 2] and b[1] == 2 and 2 in b and 3 not in b\n"
        "assert str(b) == 'Bag(1, 2)' and bool(b)\n"
    )
    result = run(code, tests)
    assert result.passed, result.stderr_tail


def test_exceptions_cross_with_their_type(run) -> None:
    code = (
        "class InvalidInput(ValueError):\n"
        "    pass\n"
        "def check(x):\n"
        "    if x < 0:\n"
        "        raise InvalidInput(f'negative: {x}')\n"
        "    if x == 0:\n"
        "        raise KeyError('zero')\n"
        "    return x\n"
    )
    tests = (
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_raises(self):\n"
        "        with self.assertRaises(InvalidInput):\n"
        "            check(-1)\n"
        "        self.assertRaisesRegex(ValueError, 'negative: -2', check, -2)\n"
        "        with self.assertRaises(KeyError) as caught:\n"
        "            check(0)\n"
        "        self.assertEqual(caught.exception.args, ('zero',))\n"
        "        self.assertEqual(check(5), 5)\n"
    )
    result = run(code, tests)
    assert result.passed, result.stderr_tail


def test_print_and_input_follow_the_tests_redirections(run) -> None:
    code = (
        "import math\n"
        "from math import sqrt\n"
        "def main():\n"
        "    n = int(input())\n"
        "    print(sum(map(int, input().split())) * n)\n"
    )
    tests = (
        "import contextlib, io, sys\n"
        "sys.stdin = io.StringIO('2\\n1 2 3\\nrest\\n')\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    main()\n"
        "assert out.getvalue() == '12\\n', out.getvalue()\n"
        "assert sys.stdin.read() == 'rest\\n'  # what the solution read is gone\n"
        "assert math.isclose(sqrt(2) ** 2, 2)  # the solution's imports, our own modules\n"
    )
    result = run(code, tests)
    assert result.passed, result.stderr_tail


def test_shadowed_builtins_are_not_seen_by_the_tests(run) -> None:
    code = "def len(x):\n    return 3\ndef solve():\n    return [1]\n"
    assert run(code, "assert len(solve()) == 1\n").passed  # the tests keep the real len
    assert not run(code, "assert len(solve()) == 3\n").passed


def test_the_tests_cannot_pass_their_own_functions(run) -> None:
    code = "def apply(f, x):\n    return f(x)\n"
    result = run(code, "apply(lambda x: x + 1, 1)\n")
    assert result.reason == "tests_failed" and "TypeError" in result.stderr_tail


def test_a_run_returns_only_when_no_process_of_it_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher reaped is not the run ended: its PID namespace's init, killed with it,
    can still be dying (CI saw one left after ``huge_stderr``). A process that carries the
    run's directory in its command line and outlives ``_run`` stands in for it."""
    stragglers: list[subprocess.Popen[bytes]] = []

    def run_leaving_a_straggler(*args: object) -> SandboxResult:
        base = args[-1]
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)", str(base)]
        stragglers.append(subprocess.Popen(sleeper, start_new_session=True))
        raise RuntimeError("the supervisor failed")

    monkeypatch.setattr(sandbox, "_run", run_leaving_a_straggler)
    with pytest.raises(RuntimeError, match="supervisor failed"):
        run_python("def solve():\n    return 42\n", "assert solve() == 42\n", LIMITS)
    (straggler,) = stragglers
    try:
        assert straggler.poll() == -9  # killed before run_python returned, not after
    finally:
        straggler.kill()
        straggler.wait()
    assert not Path(straggler.args[-1]).exists()


# ---------------------------------------------------------------- keyrings and IPC

_LIBC = ctypes.CDLL(None, use_errno=True)
_ADD_KEY, _KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine, (0, 0))
needs_filter = pytest.mark.skipif(
    not ISOLATION.syscall_filter or not _KEYCTL, reason="needs seccomp (x86-64, aarch64)"
)


@pytest.fixture
def planted_key() -> Iterator[int]:
    """A secret key in this process's own session keyring (as a trainer's would be)."""
    if _LIBC.syscall(_KEYCTL, 1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING: ours alone
        pytest.skip("this host refuses key management")
    key = _LIBC.syscall(_ADD_KEY, b"user", b"rlmap-planted", b"hunter2", 7, -3)
    assert key > 0, os.strerror(ctypes.get_errno())
    yield key
    _LIBC.syscall(_KEYCTL, 3, key)  # KEYCTL_REVOKE


def _read_key(key: int) -> bytes:
    buffer = ctypes.create_string_buffer(64)
    size = _LIBC.syscall(_KEYCTL, 11, key, buffer, 64)  # KEYCTL_READ
    return buffer.raw[: max(size, 0)]


@needs_filter
def test_the_trainers_keys_are_out_of_reach(run, planted_key: int) -> None:
    """Read, revoke, add: the sandbox had the session keyring, so every one worked."""
    code = (Path(__file__).with_name("hostile") / "keyring_read_session.py").read_text()
    result = run(code)
    assert not result.passed and result.reason == "tests_failed"
    assert result.isolation.session_keyring and result.isolation.syscall_filter
    assert _read_key(planted_key) == b"hunter2"  # neither read nor revoked
    session = Path("/proc/keys").read_text()
    assert "rlmap-sandbox-was-here" not in session


SYSV = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "made = {'shm': libc.shmget(0, 8 * 2**20, 0o1666), 'msg': libc.msgget(0, 0o1666),\n"
    "        'sem': libc.semget(0, 4, 0o1666)}\n"
    "inside = {k: open(f'/proc/sysvipc/{k}').read().count('\\n') - 1 for k in made}\n"
    "print('made', made, 'inside', inside)\n"
    "def solve():\n"
    "    return 0\n"
)


def _sysv_of(uid: int) -> list[str]:
    found = []
    for kind in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        column = lines[0].split().index("uid")
        found += [f"{kind}: {line}" for line in lines[1:] if int(line.split()[column]) == uid]
    return found


def _keys_of(uid: int) -> int:
    """Keys the kernel holds for ``uid`` (``/proc/key-users``: ``uid: usage nkeys/...``)."""
    for line in Path("/proc/key-users").read_text().splitlines():
        owner, rest = line.split(":", 1)
        if int(owner) == uid:
            return int(rest.split()[1].split("/")[0])
    return 0


@needs_uid_drop
def test_sysv_ipc_made_inside_is_gone_after(run) -> None:
    """With an IPC namespace the objects are made, seen inside, and die with the run; without
    one the filter refuses to make them. Either way the host keeps none."""
    result = run(SYSV)
    assert not result.passed
    left = _sysv_of(result.isolation.uid)  # type: ignore[arg-type]
    for line in left:  # remove what a failing run leaked, then fail
        kind, ident = line.split(":")[0], line.split()[2]
        subprocess.run(["ipcrm", {"shm": "-m", "msg": "-q", "sem": "-s"}[kind], ident], check=False)
    assert left == []
    if result.isolation.ipc_namespace:
        assert "inside {'shm': 1, 'msg': 1, 'sem': 1}" in result.stdout_tail, result
    else:
        assert "'shm': -1, 'msg': -1, 'sem': -1" in result.stdout_tail, result


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


FALLBACK_HOSTILE = ["fork_bomb", "detached_subprocesses", "kill_everything", "sysv_shm_8mib"]
FALLBACK_HOSTILE += ["sysv_message_queue", "keyring_persistent_user_keys", "proc_environ_secret"]


@needs_uid_drop
@pytest.mark.parametrize("name", FALLBACK_HOSTILE)
def test_fallback_without_namespaces_still_contains(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    """Root without ``unshare``: the uid drop and the limits alone hold the sandbox."""
    python = _world_usable_python()
    if python is None:
        pytest.skip("no interpreter an unprivileged uid can run")
    host = dataclasses.replace(sandbox._host(), python=python, root=True, namespaces=False)
    monkeypatch.setattr(sandbox, "_host", lambda: host)
    monkeypatch.setattr(sandbox, "_others_can_use", lambda path: True)  # checked above
    monkeypatch.setenv("RLMAP_TEST_SECRET", "hunter2-secret-value")
    code = (Path(__file__).with_name("hostile") / f"{name}.py").read_text()
    result = run_python(code, "assert solve() == 42\n", LIMITS)
    assert not result.passed and result.isolation.uid is not None
    assert not result.isolation.network and not result.isolation.private_root
    assert not result.isolation.ipc_namespace
    assert _live_pids_of(result.isolation.uid) == []
    assert _sysv_of(result.isolation.uid) == [] and _keys_of(result.isolation.uid) == 0
    assert run_python("def solve():\n    return 42\n", "assert solve() == 42", LIMITS).passed
