"""Sandbox harness: the tests in one process, the model's code in another (stdlib only).

Not imported by rlmap: the launcher ``exec``\\ s ``python -I -S -c <this source>``
inside the sandbox, under the limits and the unprivileged uid. The payload (JSON:
``code``, ``tests``, ``nonce``) arrives on stdin.

**Threat model.** The code is hostile and may do anything Python allows: rebind any
name (``types.FunctionType``, ``importlib.import_module``, builtins), patch any module,
leave threads running that re-patch ``unittest`` after any reset, walk frames and the
garbage collector for secrets, use ``ctypes``, fork, signal, exit. Whatever shares an
interpreter with it is its to change, so no check in that interpreter can be trusted
— not the tests' collection, not ``unittest``, not a pipe opened later (a thread it
left behind, or an inherited descriptor, reaches that too). So the verdict is made
where none of it reaches:

- **Two processes.** This process forks the *solution process* at once, before the
  payload is read: the fork holds nothing secret, closes its stdin and waits for the
  code. This process, the *test process*, makes itself non-dumpable
  (``PR_SET_DUMPABLE`` 0: a process of the same uid can neither ``ptrace`` it nor read
  its ``/proc/<pid>/mem``, ``fd`` or ``environ``), reads the payload, sends the code
  over a pipe, and runs the tests in its own pristine interpreter. The code never
  runs here.
- **The tests call into the solution.** Each name the code defines is bound in the
  tests' namespace; a function or object is a proxy, and calling it (or taking an
  attribute, an item, its length, truth, text, or iterating it) is a request to the
  solution process. The answer comes back as *data* — None, bools, numbers, strings,
  bytes, lists, tuples, dicts, sets, ranges, fractions, decimals, deques, Counters —
  rebuilt here by a strict decoder into fresh objects of exactly those types. Any
  other object stays in the solution process behind a proxy that compares by
  identity, so an object rigged to equal anything never reaches a comparison. No
  operator that takes the other operand (``==``, ``<``, ``in``: ``in`` iterates and
  compares here) is forwarded, so the solution never sees an expected value unless a
  test passes one in. Modules and objects the code imported from the plain-computation
  part of the standard library (``SHARED_MODULES``: ``math``, ``collections``, ...)
  are bound to this process's own (others are proxies); names that shadow builtins
  are not bound (the tests keep the real ones); an exception the solution raises is
  raised here as the builtin of the same name (its own exception classes: local
  subclasses of their builtin base).
- **The proof.** Once every test ran and passed, this process kills the solution
  process and writes the nonce on (a duplicate of) stdout, then leaves with
  ``os._exit``. The solution process never held the nonce — forked before it was read,
  no stdin, no way into this process's memory — so whatever it does (exit, crash,
  lie in a reply, stall, signal or kill this process) can end the run only without it.

What remains possible (docs/verifiers.md): answers that fit the tests without
solving the task (hard-coded cases, weak tests); tests that let the solution judge
itself (a checker borrowed from the solution's namespace, an expected value passed
in as an argument, an object's own ``__str__``, length or items taken at its word);
and a failure of the sandbox itself.

**Differs from running the tests in the solution's namespace:** arguments travel by
value (lists, dicts, sets and bytearrays are copied back after the call, so in-place
algorithms work); a test may pass data and the solution's own objects, not its own
functions or class instances (a TypeError); the solution's global *data* is a
snapshot taken when it finished loading; ``print`` and ``input`` inside a call use
this process's ``sys.stdout`` and, when a test replaced it with a StringIO, ``sys.stdin``.

Tests are what the test source does when executed: top-level statements
(``assert f(2) == 4``), plus every function it defines whose name starts with
``test`` (called without arguments), plus every ``unittest.TestCase`` subclass it
defines; a TestCase run passes only if its result lists no failure and every test ran.

Exit codes (only for the failure's reason; the nonce alone means success):
1 tests failed (or the solution process broke the protocol), 2 the solution raised
while loading, 3 out of memory, 4 left early (``SystemExit``, ``os._exit``, the
solution process gone). A solution process killed by a signal (the CPU limit's
SIGKILL) ends this one by the same signal.
"""

from __future__ import annotations

import _thread
import builtins
import ctypes
import importlib
import io
import json
import os
import select
import signal
import sys
import time
import types
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Any, NoReturn

TESTS_FAILED, SOLUTION_ERROR, OUT_OF_MEMORY, EXITED_EARLY = 1, 2, 3, 4
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
MAX_MESSAGE = 64 * 2**20
"""Largest request or reply (bytes of JSON); a larger reply ends the run."""
FORWARDED_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__"})
SHARED_MODULES = frozenset(
    {"abc", "array", "base64", "binascii", "bisect", "calendar", "cmath", "collections"}
    | {"copy", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions"}
    | {"functools", "graphlib", "hashlib", "heapq", "io", "itertools", "json", "keyword"}
    | {"math", "numbers", "operator", "pprint", "random", "re", "reprlib", "statistics"}
    | {"string", "struct", "sys", "textwrap", "time", "typing", "unicodedata", "unittest"}
)
"""Standard-library modules whose objects the solution imported are bound to this process's
own (``import math``, ``from collections import Counter``; their C accelerators ``_heapq``,
``_functools``... too): plain computations. Not ``pickle``, ``marshal``, ``os``,
``builtins``, ``importlib``, ``ctypes``...: bound here under a name of the solution's choosing,
such a callable, given the solution's output by a test, would run it in this process."""


# ---------------------------------------------------------------- data on the wire


def _to_wire(value: Any, ref: Callable[[Any], int]) -> Any:
    """``value`` as JSON-ready data; what is not data goes by reference (``ref(value)``)."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int):
        number = int.__int__(value)  # an int subclass travels as its plain value
        return number if abs(number) < 2**63 else {"i": hex(number)}  # hex: no digit limit
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [_to_wire(item, ref) for item in value]
    if isinstance(value, dict):
        pairs = [[_to_wire(k, ref), _to_wire(v, ref)] for k, v in value.items()]
        kinds = ((Counter, "Counter"), (OrderedDict, "OrderedDict"))
        kind = next((name for cls, name in kinds if isinstance(value, cls)), None)
        return {"d": pairs, "k": kind} if kind else {"d": pairs}
    simple = _simple_to_wire(value, ref)
    return simple if simple is not None else {"r": ref(value)}


def _simple_to_wire(value: Any, ref: Callable[[Any], int]) -> dict[str, Any] | None:
    """The tagged kinds of data other than lists and dicts; None when ``value`` is none."""
    if isinstance(value, deque):
        return {"e": [_to_wire(item, ref) for item in value], "n": value.maxlen}
    for cls, tag in ((tuple, "t"), (frozenset, "f"), (set, "s")):
        if isinstance(value, cls):
            return {tag: [_to_wire(item, ref) for item in value]}
    if isinstance(value, (bytes, bytearray)):
        return {"y" if isinstance(value, bytearray) else "b": bytes(value).hex()}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    if isinstance(value, range):
        return {"g": [_to_wire(v, ref) for v in (value.start, value.stop, value.step)]}
    fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
    if fractions is not None and isinstance(value, fractions.Fraction):
        return {"q": [_to_wire(value.numerator, ref), _to_wire(value.denominator, ref)]}
    if decimal is not None and isinstance(value, decimal.Decimal):
        return {"m": str(value)}
    return None


def _from_wire(data: Any, ref: Callable[[int], Any]) -> Any:
    """Fresh plain objects from wire data; anything malformed raises (ValueError, TypeError)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [_from_wire(item, ref) for item in data]
    if not isinstance(data, dict) or not data:
        raise ValueError(f"not wire data: {type(data).__name__}")
    tag, body = next(iter(data.items()))
    if tag == "r":
        return ref(body)
    if tag in ("b", "y"):
        return (bytes if tag == "b" else bytearray).fromhex(_typed(body, str))
    if tag == "i":
        return int(_typed(body, str), 16)
    if tag == "m":
        return importlib.import_module("decimal").Decimal(_typed(body, str))
    items = [_from_wire(item, ref) for item in _typed(body, list)]
    return _rebuild(tag, items, data)


def _rebuild(tag: str, items: list[Any], data: dict[str, Any]) -> Any:
    if tag == "t":
        return tuple(items)
    if tag in ("s", "f"):
        return (set if tag == "s" else frozenset)(items)
    if tag == "e":
        maxlen = data.get("n")
        return deque(items, None if maxlen is None else _typed(maxlen, int))
    if tag == "d":
        kind = {None: dict, "Counter": Counter, "OrderedDict": OrderedDict}[data.get("k")]
        return kind(dict(items))  # items: [key, value] pairs; Counter wants a mapping
    if tag == "c":
        return complex(*[_typed(x, (int, float)) for x in items])
    if tag == "g":
        return range(*[_typed(x, int) for x in items])
    if tag == "q":
        return importlib.import_module("fractions").Fraction(*[_typed(x, int) for x in items])
    raise ValueError(f"unknown wire tag {tag!r}")


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    """``value`` if it is of ``kind`` (a bool is no int here), else TypeError."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"wire data of the wrong type: {type(value).__name__}")
    return value


def _send(fd: int, message: Any) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _recv(fd: int, pidfd: int | None = None) -> Any:
    """One message from ``fd``; EOFError also when process ``pidfd`` ended and nothing is left
    (a process it forked may hold the pipe open for ever)."""
    size = int.from_bytes(_read_exactly(fd, 8, pidfd), "big")
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes")
    return json.loads(_read_exactly(fd, size, pidfd))


def _ended_silent(fd: int, pidfd: int) -> bool:
    """Wait until ``fd`` has data or the process ended; True if it ended and nothing came."""
    if fd in select.select([fd, pidfd], [], [])[0]:
        return False
    return not select.select([fd], [], [], 0)[0]


def _read_exactly(fd: int, size: int, pidfd: int | None) -> bytes:
    data = bytearray()
    while len(data) < size:
        if pidfd is not None and _ended_silent(fd, pidfd):
            raise EOFError("the solution process ended")
        chunk = os.read(fd, min(size - len(data), 2**20))
        if not chunk:
            raise EOFError("the other process closed the pipe")
        data += chunk
    return bytes(data)


# ---------------------------------------------------------------- the solution process


class _Table:
    """The solution process's objects that the test process holds a proxy for."""

    def __init__(self) -> None:
        self.objects: dict[int, Any] = {}
        self.ids: dict[int, int] = {}  # id(object) -> reference; objects stay alive

    def keep(self, value: Any) -> int:
        if id(value) not in self.ids:
            self.ids[id(value)] = len(self.objects)
            self.objects[len(self.objects)] = value
        return self.ids[id(value)]

    def get(self, ref: int) -> Any:
        return self.objects[ref]


def _solution_process(requests: int, replies: int, parent: int) -> NoReturn:
    """The forked child: load the code, then answer the test process until it hangs up."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(EXITED_EARLY)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)  # the payload, nonce included, is the test process's to read
        os.close(devnull)
        table = _Table()
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        failure = _load(_recv(requests)["code"], namespace)
        _flush()  # what it printed, before this process may be killed
        _send(replies, {"failed": failure} if failure else {"loaded": _describe(namespace, table)})
        while True:
            reply = _answer(_recv(requests), table)
            _flush()
            _send(replies, reply)
    except BaseException:  # the test process hung up, or the code broke this loop
        pass
    _flush()
    os._exit(0)


def _load(code: str, namespace: dict[str, Any]) -> str | None:
    """Run the code; None when it finished, else why not (its traceback goes to stderr)."""
    try:
        exec(compile(code, "<solution>", "exec"), namespace)
    except MemoryError:
        return _report("memory", "the solution ran out of memory")
    except SystemExit:
        return _report("exit", "the solution exited before the tests ran")
    except BaseException:
        return _report("raised", "the solution raised")
    return None


def _report(failure: str, what: str) -> str:
    """Best effort on stderr (the code may have broken it); returns ``failure``."""
    try:
        import traceback

        sys.stderr = sys.__stderr__
        print(f"[harness] {what}", file=sys.stderr)
        traceback.print_exc()
        _flush()
    except BaseException:
        pass
    return failure


def _describe(namespace: dict[str, Any], table: _Table) -> list[list[Any]]:
    """[name, description] for each name the code defined (see ``_bind`` for the kinds)."""
    entries = []
    for name, value in list(namespace.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        try:
            entries.append([name, _description(value, table)])
        except Exception:
            continue  # an object too strange to describe is not bound
    return entries


def _description(value: Any, table: _Table) -> dict[str, Any]:
    """``m``: a shared module; ``o``: a shared module's callable; ``x``: an exception class
    (its builtin base); ``v``: data, or a reference (a proxy there, the object stays here)."""
    if isinstance(value, types.ModuleType) and _shared(value.__name__):
        return {"m": value.__name__}
    if isinstance(value, type) and issubclass(value, BaseException):
        return {"x": _builtin_base(value).__name__}
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(module, str) and _shared(module) and isinstance(name, str) and callable(value):
        return {"o": [module, name]}
    return {"v": _to_wire(value, table.keep)}


def _shared(module: str) -> bool:
    return module.split(".")[0].lstrip("_") in SHARED_MODULES


def _builtin_base(cls: type) -> type:
    return next(c for c in cls.__mro__ if getattr(builtins, c.__name__, None) is c)


def _answer(request: dict[str, Any], table: _Table) -> dict[str, Any]:
    """Do what the test process asked; the reply says how it went and what was printed."""
    reply: dict[str, Any] = {}
    captured, saved = io.StringIO(), (sys.stdout, sys.stdin)
    feed = request.get("stdin")
    try:
        if request.get("capture"):
            sys.stdout = captured
        if feed is not None:
            sys.stdin = io.StringIO(feed)
        reply["ok"] = _to_wire(_perform(request, table, reply), table.keep)
    except StopIteration:
        reply["stop"] = True
    except SystemExit:
        reply["exit"] = True
    except BaseException as exc:
        reply.update(_raised(exc, table))
    finally:
        if feed is not None and isinstance(sys.stdin, io.StringIO):
            reply["read"] = sys.stdin.tell()
        sys.stdout, sys.stdin = saved
    reply["out"] = captured.getvalue()
    return reply


def _perform(request: dict[str, Any], table: _Table, reply: dict[str, Any]) -> Any:
    op, target = request["op"], table.get(request["ref"])
    value = _from_wire(request.get("value"), table.get)
    if op == "call":
        args = [_from_wire(a, table.get) for a in request["args"]]
        kwargs = {k: _from_wire(v, table.get) for k, v in request["kwargs"]}
        try:
            return target(*args, **kwargs)
        finally:  # in-place changes travel back to the caller's lists, dicts and sets
            reply["args"] = [_mutable_to_wire(a, table) for a in args]
            reply["kwargs"] = [[k, _mutable_to_wire(v, table)] for k, v in kwargs.items()]
    if op in ("getattr", "setattr", "delattr"):
        name = request["name"]
        if op == "getattr":
            return getattr(target, name)
        return setattr(target, name, value) if op == "setattr" else delattr(target, name)
    key = _from_wire(request.get("key"), table.get)
    actions: dict[str, Callable[[], Any]] = {
        "getitem": lambda: target[key],
        "setitem": lambda: target.__setitem__(key, value),
        "delitem": lambda: target.__delitem__(key),
        "len": lambda: len(target),
        "bool": lambda: bool(target),
        "iter": lambda: iter(target),
        "next": lambda: next(target),
        "str": lambda: str(target),
        "repr": lambda: repr(target),
        "isinstance": lambda: isinstance(value, target),
    }
    return actions[op]()


def _mutable_to_wire(value: Any, table: _Table) -> Any:
    if type(value) not in (list, dict, set, bytearray):
        return None
    try:
        return _to_wire(value, table.keep)
    except Exception:
        return None


def _raised(exc: BaseException, table: _Table) -> dict[str, Any]:
    try:
        args = _to_wire(tuple(exc.args), table.keep)
    except Exception:
        args = {"t": []}
    return {"raise": type(exc).__name__, "base": _builtin_base(type(exc)).__name__, "args": args}


# ---------------------------------------------------------------- the test process


class _SolutionError(Exception):
    """An exception of the solution's with no counterpart here."""


class _Link:
    """The test process's end of the pipes to the solution process."""

    def __init__(self, child: int, requests: int, replies: int) -> None:
        self.child, self.requests, self.replies = child, requests, replies
        self.pidfd = _pidfd(child)
        self.lock = _thread.allocate_lock()  # one request at a time, threads or not
        self.remotes: dict[int, _Remote] = {}
        self.exceptions: dict[str, type[BaseException]] = {}

    def exchange(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a request, return the reply; a solution process gone or garbling ends the run."""
        with self.lock:
            try:
                _send(self.requests, request)
                reply = _recv(self.replies, self.pidfd)
            except (OSError, EOFError):
                self.end(EXITED_EARLY, "the solution process is gone", grace=0.2)
            except Exception:
                self.end(TESTS_FAILED, "the solution process broke the protocol")
        if not isinstance(reply, dict) or not isinstance(reply.get("out", ""), str):
            self.end(TESTS_FAILED, "the solution process broke the protocol")
        if reply.get("out"):
            sys.stdout.write(reply["out"])
        return reply

    def load(self, code: str) -> dict[str, Any]:
        """Have the solution process run ``code``; the names to bind in the tests' namespace."""
        reply = self.exchange({"code": code})
        failed = {"memory": OUT_OF_MEMORY, "exit": EXITED_EARLY, "raised": SOLUTION_ERROR}
        if "failed" in reply:
            self.end(failed.get(reply["failed"], SOLUTION_ERROR), None)
        try:
            return _bind(reply["loaded"], self)
        except Exception:
            self.end(TESTS_FAILED, "the solution process described its names wrongly")

    def ask(self, request: dict[str, Any]) -> Any:
        """One request's answer, as data or a proxy; its exception raised here."""
        return self.settle(self.exchange(request))

    def call(self, ref: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        stdin = sys.stdin
        redirected = stdin is not sys.__stdin__ and isinstance(stdin, io.StringIO)
        start = stdin.tell() if redirected else 0
        feed = stdin.read() if redirected else None
        request = {
            "op": "call",
            "ref": ref,
            "args": [self.wire(a) for a in args],
            "kwargs": [[k, self.wire(v)] for k, v in kwargs.items()],
            "stdin": feed,
            "capture": sys.stdout is not sys.__stdout__,  # a test redirected it: send prints
        }
        reply = self.exchange(request)
        try:
            returned = [*(reply.get("args") or []), *[v for _, v in reply.get("kwargs") or []]]
            for value, data in zip([*args, *kwargs.values()], returned, strict=False):
                _refill(value, _from_wire(data, self.remote))
            if feed is not None:
                stdin.seek(start + min(_typed(reply.get("read", 0), int), len(feed)))
        except Exception:
            self.end(TESTS_FAILED, "the solution process broke the protocol")
        return self.settle(reply)

    def settle(self, reply: dict[str, Any]) -> Any:
        if reply.get("exit"):
            self.end(EXITED_EARLY, "the solution exited during the tests")
        if reply.get("stop"):
            raise StopIteration
        try:
            raised = self.exception(reply) if "raise" in reply else None
            value = None if raised else _from_wire(reply["ok"], self.remote)
        except Exception:
            self.end(TESTS_FAILED, "the solution process broke the protocol")
        if raised is not None:
            raise raised from None
        return value

    def exception(self, reply: dict[str, Any]) -> BaseException:
        name, base = _typed(reply["raise"], str), _typed(reply["base"], str)
        args = _from_wire(reply["args"], self.remote)
        builtin = getattr(builtins, base, None)
        cls = self.exceptions.get(name)
        if cls is None and isinstance(builtin, type) and issubclass(builtin, Exception):
            cls = builtin
        if cls is None:  # KeyboardInterrupt, GeneratorExit: nothing a test should catch
            self.end(TESTS_FAILED, f"the solution raised {name}")
        try:
            return cls(*args)
        except Exception:
            return _SolutionError(f"{name}{args!r}")

    def remote(self, ref: int) -> _Remote:
        """The one proxy of the solution's object ``ref`` (so ``is`` works as there)."""
        if _typed(ref, int) not in self.remotes:
            self.remotes[ref] = _Remote(self, ref)
        return self.remotes[ref]

    def wire(self, value: Any) -> Any:
        return _to_wire(value, _ref_of)

    def end(self, code: int, why: str | None, grace: float = 0.0) -> NoReturn:
        """Kill the solution process and leave with ``code`` — or by the signal that ended it
        within ``grace`` seconds (a CPU limit's SIGKILL: the run is a ``cpu_limit``)."""
        signalled = _stop(self.child, grace)
        if why:
            print(f"[harness] {why}", file=sys.__stderr__)
        _flush()
        if signalled is not None:
            if signalled != signal.SIGKILL:
                signal.signal(signalled, signal.SIG_DFL)
            os.kill(os.getpid(), signalled)
        os._exit(code)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` ends (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _ref_of(value: Any) -> int:
    if isinstance(value, _Remote):
        return object.__getattribute__(value, "_ref")
    raise TypeError(f"a test can pass data and the solution's objects, not a {type(value)}")


def _refill(target: Any, fresh: Any) -> None:
    """Give ``target`` (an argument of the test's) the contents the call left it with."""
    if type(target) is not type(fresh):
        return
    if isinstance(target, (list, bytearray)):
        target[:] = fresh
    elif isinstance(target, (dict, set)):
        target.clear()
        target.update(fresh)


def _stop(child: int, grace: float) -> int | None:
    """Reap the solution process, killed if still there after ``grace`` seconds; the signal
    that ended it, if one did (None when it exited, or when this process killed it)."""
    deadline = time.monotonic() + grace
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        if time.monotonic() >= deadline:
            break
        time.sleep(0.002)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return None


class _Remote:
    """An object of the solution process: calls and lookups go there; compares by identity."""

    __slots__ = ("_link", "_ref")

    def __init__(self, link: _Link, ref: int) -> None:
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_ref", ref)

    def _ask(self, op: str, **fields: Any) -> Any:
        link = object.__getattribute__(self, "_link")
        return link.ask({"op": op, "ref": object.__getattribute__(self, "_ref"), **fields})

    def _wire(self, value: Any) -> Any:
        return object.__getattribute__(self, "_link").wire(value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        link = object.__getattribute__(self, "_link")
        return link.call(object.__getattribute__(self, "_ref"), args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _Remote.__slots__:  # not set yet: no request, no recursion
            raise AttributeError(name)
        if name.startswith("__") and name.endswith("__") and name not in FORWARDED_DUNDERS:
            raise AttributeError(name)  # Python's own probes (__deepcopy__, ...) stay here
        return self._ask("getattr", name=name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("setattr", name=name, value=self._wire(value))

    def __delattr__(self, name: str) -> None:
        self._ask("delattr", name=name)

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key=self._wire(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._ask("setitem", key=self._wire(key), value=self._wire(value))

    def __delitem__(self, key: Any) -> None:
        self._ask("delitem", key=self._wire(key))

    def __len__(self) -> int:
        return _typed(self._ask("len"), int)

    def __bool__(self) -> bool:
        return _typed(self._ask("bool"), bool)

    def __iter__(self) -> Any:
        return self._ask("iter")

    def __next__(self) -> Any:
        return self._ask("next")

    def __str__(self) -> str:
        return _typed(self._ask("str"), str)

    def __repr__(self) -> str:
        return _typed(self._ask("repr"), str)

    def __instancecheck__(self, instance: Any) -> bool:
        try:
            value = self._wire(instance)
        except TypeError:
            return False
        return _typed(self._ask("isinstance", value=value), bool)

    def __copy__(self) -> _Remote:
        return self  # an object of the solution's stays there: a copy is the same object

    def __deepcopy__(self, memo: dict[int, Any]) -> _Remote:
        return self


def _bind(entries: Any, link: _Link) -> dict[str, Any]:
    """The tests' view of the solution's names: data (copied), proxies, modules of our own.

    A name that shadows a builtin is not bound: the tests keep the real one.
    """
    bound: dict[str, Any] = {}
    for name, description in _typed(entries, list):
        _typed(name, str)
        if not name.isidentifier() or hasattr(builtins, name) or name.startswith("__"):
            continue
        kind, body = next(iter(_typed(description, dict).items()))
        if kind == "v":
            bound[name] = _from_wire(body, link.remote)
        elif kind == "x":
            base = getattr(builtins, _typed(body, str), None)
            if isinstance(base, type) and issubclass(base, Exception):
                link.exceptions[name] = type(name, (base,), {"__module__": "solution"})
                bound[name] = link.exceptions[name]
        elif kind in ("m", "o"):
            module, path = (body, "") if kind == "m" else _typed(body, list)
            value = _stdlib(_typed(module, str), _typed(path, str))
            if value is not None:
                bound[name] = value
    return bound


def _stdlib(module: str, path: str) -> Any:
    """This process's own ``module`` (of ``SHARED_MODULES``) or its attribute ``path``."""
    if not _shared(module) or "<" in path:
        return None
    try:
        value: Any = importlib.import_module(module)
        for part in filter(None, path.split(".")):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    return value if not path or callable(value) else None


def _run_collected(namespace: dict[str, Any], before: dict[str, Any]) -> bool:
    """Call the test functions and run the TestCase classes the test source defined."""
    defined = [v for k, v in namespace.items() if before.get(k) is not v]
    for fn in defined:
        if isinstance(fn, types.FunctionType) and fn.__name__.startswith("test"):
            fn()
    unittest = sys.modules.get("unittest")
    if unittest is None:
        return True
    cases = [c for c in defined if isinstance(c, type) and issubclass(c, unittest.TestCase)]
    if not cases:
        return True
    suite = unittest.TestSuite(unittest.TestLoader().loadTestsFromTestCase(c) for c in cases)
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(suite)
    bad = result.failures or result.errors or result.unexpectedSuccesses
    return not bad and result.testsRun == suite.countTestCases()


def _flush() -> None:
    """Flush what was printed (``os._exit`` would drop it)."""
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass


def _fail(link: _Link, code: int, what: str) -> NoReturn:
    import traceback

    print(f"[harness] {what}", file=sys.stderr)
    traceback.print_exc()
    link.end(code, None)


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:  # before the nonce is read
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    parent = os.getpid()
    child = os.fork()  # before the payload is read: the solution process holds nothing secret
    if child == 0:
        os.close(requests_w)
        os.close(replies_r)
        _solution_process(requests_r, replies_w, parent)
    os.close(requests_r)
    os.close(replies_w)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # no KeyboardInterrupt sent into a test
    link = _Link(child, requests_w, replies_r)
    payload = json.loads(sys.stdin.buffer.read())
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    proof_fd = os.dup(1)
    proof = ("\n" + payload.pop("nonce") + "\n").encode()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace.update(link.load(payload["code"]))
    before = dict(namespace)
    try:
        exec(compile(payload["tests"], "<tests>", "exec"), namespace)
        passed = _run_collected(namespace, before)
    except MemoryError:
        _fail(link, OUT_OF_MEMORY, "out of memory during the tests")
    except SystemExit:
        _fail(link, EXITED_EARLY, "exited during the tests")
    except BaseException:
        _fail(link, TESTS_FAILED, "a test failed")
    _stop(link.child, 0.0)
    _flush()
    if not passed:
        os._exit(TESTS_FAILED)
    os.write(proof_fd, proof)
    os._exit(0)


if __name__ == "__main__":
    main()
