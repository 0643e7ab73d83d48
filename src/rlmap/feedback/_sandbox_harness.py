"""Sandbox harness: runs the model's code, then the unit tests (stdlib only).

Not imported by rlmap: the launcher ``exec``s ``python -I -S -c <this source>``
inside the sandbox. The payload (JSON: ``code``, ``tests``, ``nonce``) arrives on
stdin, which is then replaced by ``/dev/null``.

Only a real completion counts: the harness writes the nonce on (a duplicate of)
stdout after every test ran and passed, then leaves with ``os._exit`` so no
``atexit`` hook or lingering thread runs after it. Leaving early by any route —
``sys.exit``, ``os._exit``, a signal, a crash — never prints the nonce, and the
model's code never sees it on a pipe, in the environment or on the command line.

Tests are what the test source does when executed in the namespace of the
solution: top-level statements (``assert f(2) == 4``), plus every function it
defines whose name starts with ``test`` (called without arguments), plus every
``unittest.TestCase`` subclass it defines. Before the tests run, the harness
undoes the cheap ways a solution could disarm them: it restores the builtins,
``sys.meta_path``, ``sys.path``, ``sys.path_hooks``, ``sys.stdout``/``sys.stderr``,
removes trace/profile hooks, and imports ``unittest`` afresh; a TestCase run
passes only if its result lists no failure and every test ran.

What it cannot stop: the solution's functions run *during* the tests, in the same
interpreter, so a function that patches the test machinery when it is called, or
digs the nonce out of the harness's frames, can still cheat. This guards against
shortcuts a policy stumbles on (leaving early, faking output, patching before the
tests), not against a determined adversary in-process.

Exit codes (only for the failure's reason; the nonce alone means success):
1 tests failed, 2 the solution raised, 3 out of memory, 4 left early (SystemExit).
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any, NoReturn

TESTS_FAILED, SOLUTION_ERROR, OUT_OF_MEMORY, EXITED_EARLY = 1, 2, 3, 4


def _fail(leave: Callable[[int], NoReturn], code: int, what: str) -> NoReturn:
    """Report why on stderr (best effort: the solution may have broken it), then leave."""
    try:
        sys.stderr = sys.__stderr__
        print(f"[harness] {what}", file=sys.stderr)
        traceback.print_exc()
        _flush()
    finally:
        leave(code)


def _flush() -> None:
    """Flush what the code printed (``os._exit`` would drop it); it may have broken them."""
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass


def _snapshot() -> tuple[dict[str, Any], list[Any], list[str], list[Any]]:
    """What a solution could tamper with to change how the tests import and run."""
    return dict(builtins.__dict__), list(sys.meta_path), list(sys.path), list(sys.path_hooks)


def _disarm(saved: tuple[dict[str, Any], list[Any], list[str], list[Any]], tests: str) -> Any:
    """Undo what a solution could have done to the test machinery; a fresh ``unittest``.

    Returns the freshly imported ``unittest`` module when the tests mention it, else None.
    """
    sys.settrace(None)
    sys.setprofile(None)
    builtins.__dict__.clear()
    builtins.__dict__.update(saved[0])
    sys.meta_path[:], sys.path[:], sys.path_hooks[:] = saved[1], saved[2], saved[3]
    sys.path_importer_cache.clear()
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    for name in [m for m in sys.modules if m == "unittest" or m.startswith("unittest.")]:
        del sys.modules[name]
    return importlib.import_module("unittest") if "unittest" in tests else None


def _looks_like_a_test_case(cls: type) -> bool:
    return any(base.__name__ == "TestCase" for base in cls.__mro__[1:])


def _run_collected(namespace: dict[str, Any], before: dict[str, Any], unittest: Any) -> bool:
    """Call the test functions and run the TestCase classes the test source defined."""
    defined = [v for k, v in namespace.items() if before.get(k) is not v]
    for fn in defined:
        if isinstance(fn, types.FunctionType) and fn.__name__.startswith("test"):
            fn()
    if unittest is None:
        return True
    cases = [c for c in defined if isinstance(c, type) and _looks_like_a_test_case(c)]
    if not all(issubclass(c, unittest.TestCase) for c in cases):
        return False  # a TestCase from somewhere else than the real unittest: tampering
    if not cases:
        return True
    suite = unittest.TestSuite(unittest.TestLoader().loadTestsFromTestCase(c) for c in cases)
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(suite)
    # the lists, not wasSuccessful(): a method is one assignment away from lying
    bad = result.failures or result.errors or result.unexpectedSuccesses
    return not bad and result.testsRun == suite.countTestCases()


def main() -> None:
    payload = json.loads(sys.stdin.buffer.read())
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    proof_fd, write, leave = os.dup(1), os.write, os._exit  # locals: a solution cannot rebind
    proof = ("\n" + payload.pop("nonce") + "\n").encode()
    run = exec
    saved = _snapshot()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        run(compile(payload["code"], "<solution>", "exec"), namespace)
    except MemoryError:
        _fail(leave, OUT_OF_MEMORY, "the solution ran out of memory")
    except SystemExit:
        _fail(leave, EXITED_EARLY, "the solution exited before the tests ran")
    except BaseException:
        _fail(leave, SOLUTION_ERROR, "the solution raised")
    fresh_unittest = _disarm(saved, payload["tests"])
    before = dict(namespace)
    try:
        run(compile(payload["tests"], "<tests>", "exec"), namespace)
        passed = _run_collected(namespace, before, fresh_unittest)
    except MemoryError:
        _fail(leave, OUT_OF_MEMORY, "out of memory during the tests")
    except SystemExit:
        _fail(leave, EXITED_EARLY, "exited during the tests")
    except BaseException:
        _fail(leave, TESTS_FAILED, "a test failed")
    _flush()
    if not passed:
        leave(TESTS_FAILED)
    write(proof_fd, proof)
    leave(0)


if __name__ == "__main__":
    main()
