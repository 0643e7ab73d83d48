"""The isolated verifier: hangs, crashes and killed workers cost one sample, not the run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from rlmap.core.batch import RewardStatus
from rlmap.feedback.isolation import IsolatedVerifier, VerifierError
from rlmap.tasks.env import verify_safely


def moody(response: str, reference: str) -> float:
    """Equal → 1; "raise" raises; "hang" sleeps; "exit" kills its own process."""
    if response == "raise":
        raise ValueError("parser bug")
    if response == "hang":
        time.sleep(60)
    if response == "exit":
        os._exit(3)
    return float(response == reference)


@pytest.fixture
def verifier() -> IsolatedVerifier:
    v = IsolatedVerifier(moody, timeout_s=0.5)
    yield v
    v.close()


def test_values_pass_through(verifier: IsolatedVerifier) -> None:
    assert verifier("12", "12") == 1.0 and verifier("13", "12") == 0.0
    assert verifier.restarts == 0


def test_an_exception_is_reported_and_the_worker_lives_on(verifier: IsolatedVerifier) -> None:
    verifier("1", "1")
    pid = verifier._process.pid  # type: ignore[union-attr]
    with pytest.raises(VerifierError, match="ValueError: parser bug"):
        verifier("raise", "1")
    assert verifier("1", "1") == 1.0 and verifier._process.pid == pid  # type: ignore[union-attr]


def test_a_hang_times_out_and_the_next_call_gets_a_fresh_worker(verifier: IsolatedVerifier) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        verifier("hang", "1")
    assert time.monotonic() - started < 5  # the 60 s sleep was cut at the 0.5 s timeout
    assert verifier("7", "7") == 1.0 and verifier.restarts == 1


def test_a_worker_that_exits_mid_call_is_an_error_then_replaced(verifier: IsolatedVerifier) -> None:
    with pytest.raises(VerifierError, match="died"):
        verifier("exit", "1")
    assert verifier("7", "7") == 1.0 and verifier.restarts == 1


def test_a_worker_killed_between_calls_is_replaced_transparently(
    verifier: IsolatedVerifier,
) -> None:
    verifier("1", "1")
    process = verifier._process
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=5)
    assert verifier("5", "5") == 1.0 and verifier.restarts == 1


def test_statuses_timeout_and_infra_error_never_a_scored_zero(verifier: IsolatedVerifier) -> None:
    assert verify_safely(verifier, "hang", "1") == (0.0, RewardStatus.TIMEOUT)
    assert verify_safely(verifier, "raise", "1") == (0.0, RewardStatus.INFRA_ERROR)
    assert verify_safely(verifier, "exit", "1") == (0.0, RewardStatus.INFRA_ERROR)
    assert verify_safely(verifier, "4", "4") == (1.0, RewardStatus.OK)


def test_close_leaves_no_process(verifier: IsolatedVerifier) -> None:
    verifier("1", "1")
    process = verifier._process
    verifier.close()
    assert process is not None and not process.is_alive()


def test_a_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        IsolatedVerifier(moody, timeout_s=0)


def test_concurrent_callers_each_get_their_own_answer(verifier: IsolatedVerifier) -> None:
    import threading

    results: dict[int, float] = {}

    def call(k: int) -> None:
        results[k] = verifier(str(k % 3), "1")  # 1.0 exactly when k % 3 == 1

    threads = [threading.Thread(target=call, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: float(k % 3 == 1) for k in range(12)}


def test_the_worker_exits_when_the_trainer_is_killed(tmp_path: Path) -> None:
    import subprocess
    import sys

    pid_file = tmp_path / "pid"
    script = (
        "import os, sys\n"
        "from rlmap.feedback.isolation import IsolatedVerifier\n"
        "v = IsolatedVerifier(lambda r, ref: 1.0, timeout_s=5)\n"
        "v('a', 'b')\n"
        f"open({str(pid_file)!r}, 'w').write(str(v._process.pid))\n"
        "os._exit(0)  # no clean-up at all, as after SIGKILL\n"
    )
    # no pipes: a surviving worker holding one would make run() wait instead of failing
    subprocess.run(
        [sys.executable, "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=60,
    )
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    survived = _alive(pid)
    if survived:
        os.kill(pid, 9)
    assert not survived, "the verifier worker outlived its trainer"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"  # a zombie has exited
