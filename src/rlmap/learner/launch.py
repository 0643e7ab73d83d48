"""Starting and joining the learner ranks: rlmap's own launcher (:func:`launch`: N ranks on
this machine, as ``torchrun`` would start them), the launcher's environment read and checked
(:func:`launched_rank`), each rank's device (:func:`node_device`: rank r of a node on
``cuda:r``) and process group (:func:`world_of_env`), and its teardown (:func:`joined`).
What the ranks do together is :mod:`rlmap.learner.distributed`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from rlmap.core.device import resolve
from rlmap.core.errors import ConfigError
from rlmap.learner.distributed import CPU, SINGLE, Sharding, World, backend

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What a launcher (``torchrun``, or :func:`launch`) sets for every rank and the
rendezvous reads. ``LOCAL_RANK`` is not among them: it picks a rank's GPU
(:func:`rlmap.core.device.resolve`, 0 when unset) and means nothing on the CPU."""


def launched_rank(environ: Mapping[str, str]) -> tuple[int, int]:
    """(rank, world size) a launcher set in ``environ``; (0, 1) when it names no rank.

    ``RANK`` or ``WORLD_SIZE`` says a launcher started this process; then every name of
    ``LAUNCH_ENV`` must be set (an empty value is unset), or a ConfigError names all the
    missing ones — else a rank without ``RANK`` would fail deep in torch, or write the run
    directory as if it were rank 0. ``MASTER_ADDR``/``MASTER_PORT`` alone say nothing (a
    cluster may export them to every job), and neither do ``WORLD_SIZE=1`` and ``RANK=0``
    (a world of one process needs no rendezvous; schedulers and notebooks export them).
    """
    if environ.get("RANK", "0") in ("", "0") and environ.get("WORLD_SIZE", "1") in ("", "1"):
        return 0, 1
    given = [name for name in LAUNCH_ENV if environ.get(name)]
    missing = [name for name in LAUNCH_ENV if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)}: not set, but {', '.join(given)} "
            f"{'is' if len(given) == 1 else 'are'}: a launcher (torchrun) sets "
            f"all of {', '.join(LAUNCH_ENV)}; set them all, or none for one "
            "process"
        )
    size = _env_int(environ, "WORLD_SIZE", 1, None)
    _env_int(environ, "MASTER_PORT", 1, 65535)
    return _env_int(environ, "RANK", 0, size - 1), size


def _env_int(environ: Mapping[str, str], name: str, low: int, high: int | None) -> int:
    """``environ[name]`` as an integer in [low, high]; ConfigError naming it otherwise."""
    text = environ[name]
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ConfigError(f"{name}: must be an integer {bounds}, got {text!r}")
    return value


def world_of_env(
    sharding: Sharding, device: torch.device = CPU, train_dtype: str = "float32"
) -> World:
    """The world a launcher (rlmap's own or ``torchrun``) set up in the environment, joined:
    ``RANK`` / ``WORLD_SIZE`` read (:func:`launched_rank`), the process group initialised
    for the learner's ``device`` (:func:`node_device`): gloo when it is the CPU; on a GPU
    ``cpu:gloo,cuda:nccl`` (:func:`backend`), with this rank's GPU made the current device
    and bound to the group (``device_id``: NCCL's communicator is formed there at once, and
    neither it nor a barrier falls back to GPU 0). Without a launcher (or a world of 1) a
    single process."""
    rank, size = launched_rank(os.environ)
    if size <= 1:
        return SINGLE
    die_with_launcher()
    if not dist.is_initialized():
        gpu = device if device.type == "cuda" else None
        if gpu is not None:
            torch.cuda.set_device(gpu)
        dist.init_process_group(
            backend(device), rank=rank, world_size=size, timeout=TIMEOUT, device_id=gpu
        )
    return World(rank=rank, size=size, sharding=sharding, device=device, train_dtype=train_dtype)


def node_device(
    setting: str, environ: Mapping[str, str], ranks_on_node: int | None = None
) -> torch.device:
    """This learner rank's device: ``system.device`` resolved with the launcher's
    ``LOCAL_RANK`` (rank r of a node on ``cuda:r``). On CUDA every rank of a node needs a
    GPU of its own (NCCL refuses two ranks on one), so first a one-line ConfigError for a
    node given more ranks than it has GPUs, or for an explicit ``cuda:N`` shared by several.
    ``ranks_on_node``: as many as rlmap's launcher starts; else ``LOCAL_WORLD_SIZE``
    (torchrun's ``--nproc-per-node``); else unknown, and :func:`resolve` still refuses a
    ``LOCAL_RANK`` past the node's GPUs."""
    if ranks_on_node is None:
        known = bool(environ.get("LOCAL_WORLD_SIZE"))
        ranks_on_node = _env_int(environ, "LOCAL_WORLD_SIZE", 1, None) if known else 1
    on_gpu = resolve(setting, {}).type == "cuda"  # the kind of device: LOCAL_RANK not read
    if on_gpu and ranks_on_node > 1:
        count = torch.cuda.device_count()
        if ":" in setting:
            raise ConfigError(
                f"system.device: {setting} puts all {ranks_on_node} learner ranks "
                "of a node on one GPU, and NCCL needs one each; use cuda or "
                "auto (rank r of a node on cuda:r)"
            )
        if ranks_on_node > count:
            raise ConfigError(
                f"system.learners: {ranks_on_node} learner ranks on one node need "
                f"a GPU each, and this node has {count}; run at most {count} "
                "per node (torchrun: --nproc-per-node), or use "
                "system.device=cpu"
            )
    return resolve(setting, environ)


@contextlib.contextmanager
def joined(world: World) -> Iterator[None]:
    """The ranks' work, then the process group torn down on every path out. A rank that
    exits with the group still alive can die of SIGABRT ("terminate called without an
    active exception": gloo's threads outlive the interpreter), so this is not optional.
    On success the ranks meet first, so that none closes its connections while another
    still sends; after an error they do not (a peer may be dead, and the barrier would
    wait for ever)."""
    if not world.parallel:
        yield
        return
    try:
        yield
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


TIMEOUT = datetime.timedelta(hours=2)
"""How long a rank waits in a collective: long enough for what rank 0 does alone while the
others wait (building the warm start, evaluating, writing a large checkpoint)."""


LAUNCHER_ENV = "RLMAP_LAUNCHER_PID"
"""Set in the ranks rlmap starts itself: the launcher's pid (a rank dies with it)."""


def launch(n: int, argv: Sequence[str]) -> int:
    """Run ``rlmap <argv>`` as ``n`` learner ranks on this machine, as ``torchrun`` would
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``; ``LOCAL_RANK`` = ``RANK``: on
    GPUs rank r takes ``cuda:r``, and :func:`node_device` has refused more ranks than this
    machine has GPUs before this is called), and wait for them. The exit
    status is the first failing rank's (the others are stopped then), else 0. A rank dies
    with the launcher, so ``kill -9`` of it leaves no rank behind.

    Rank 0 writes to the console; the other ranks' stderr passes through here, so that an
    error every rank hit is said once (rank 0's), and a rank that dies of a signal is named.
    """
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // n))
    common = {
        "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        LAUNCHER_ENV: str(os.getpid()),
        "OMP_NUM_THREADS": threads,
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "rlmap.cli", *argv],
            env=os.environ | common | {"RANK": str(r), "LOCAL_RANK": str(r)},
            stderr=None if r == 0 else subprocess.PIPE,
            text=True,
        )
        for r in range(n)
    ]
    errors: list[str] = []
    relays = [threading.Thread(target=_relay, args=(r, errors), daemon=True) for r in ranks[1:]]
    for relay in relays:
        relay.start()
    try:
        status, rank = _wait(ranks)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for relay in relays:
            relay.join(timeout=5)
    if status < 0:  # killed by a signal (the out-of-memory killer, say): nobody said a word
        name = signal.Signals(-status).name
        print(f"rlmap: error: learner rank {rank} died of {name}", file=sys.stderr)
        return 128 - status
    if status != 0 and rank != 0 and errors:  # rank 0 said nothing: the first other rank speaks
        print(errors[0], file=sys.stderr)
    return status


GRACE_S = 3.0
"""Seconds rank 0 is given to end by itself after another rank failed."""


def _relay(rank: subprocess.Popen[str], errors: list[str]) -> None:
    """A rank's stderr to ours, except its error lines, kept for :func:`launch`."""
    assert rank.stderr is not None
    for line in rank.stderr:
        if line.startswith("rlmap: error:"):
            errors.append(line.rstrip("\n"))
        else:
            sys.stderr.write(line)


def _wait(ranks: list[subprocess.Popen[str]]) -> tuple[int, int]:
    """(exit status, rank) of the first rank that fails, else (0, 0) once all are done."""
    while True:
        codes = [r.poll() for r in ranks]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                if rank != 0:  # an error all ranks hit: let rank 0 end too, and speak
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        ranks[0].wait(timeout=GRACE_S)
                    if ranks[0].returncode not in (None, 0):
                        return int(ranks[0].returncode), 0
                return int(code), rank
        if all(c == 0 for c in codes):
            return 0, 0
        time.sleep(0.1)


def die_with_launcher() -> None:
    """In a rank rlmap started: the kernel kills this process when the launcher dies
    (Linux ``PR_SET_PDEATHSIG``), and a rank whose launcher is already gone exits."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if launcher is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(launcher):
        os._exit(1)


def free_port() -> int:
    """A TCP port free on this machine right now (for the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
