"""The AI judge and the comparison rewards: parsing, the HTTP client against a real server on
loopback, win rates and Bradley–Terry by hand, by a reference loop and by their properties,
and the bias probes."""

from __future__ import annotations

import math
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from judge_server import JudgeServer, always_first, correct_first

from rlmap.core.batch import RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.feedback.judge import (
    ComparisonReward,
    PointwiseJudge,
    bt_rewards,
    pair_design,
    win_rates,
)
from rlmap.feedback.judge_client import JudgeClient, probe, within_outcome_corr
from rlmap.feedback.judge_text import (
    PAIRWISE_TEMPLATE,
    POINTWISE_TEMPLATE,
    load_template,
    parse_choice,
    parse_score,
)
from rlmap.feedback.reward import Trajectory, score_batch


def _t(prompt: str, response: str, group: int = 0, outcome: float = 0.0) -> Trajectory:
    return Trajectory(
        prompt=prompt,
        turns=(response,),
        reference="",
        length=len(response) + 1,
        max_length=16,
        metadata={"group": group, "rewards": (outcome,)},
    )


def _client(url: str, **kw: object) -> JudgeClient:
    return JudgeClient(url, "judge", **kw)  # type: ignore[arg-type]


# --- parsing ---------------------------------------------------------------------------


def test_a_score_is_the_rating_in_range_mapped_to_0_1() -> None:
    assert parse_score("7", 0, 10) == pytest.approx(0.7)
    assert parse_score("7/10", 0, 10) == pytest.approx(0.7)  # the leading number, not 10
    assert parse_score("Rating: 7/10", 0, 10) == pytest.approx(0.7)  # after "rating"
    assert parse_score("On a scale of 0-10: 8", 0, 10) == pytest.approx(0.8)  # the last
    assert parse_score("19:1", 0, 1) == 1.0 and parse_score("8 out of 10", 0, 10) == 0.8
    # ranges are never ratings; a sign after the keyword is kept
    assert parse_score("I would rate it 7 on a scale of 0 to 10", 0, 10) == pytest.approx(0.7)
    assert parse_score("7. The answer is right but step 3 is unclear", 0, 10) == pytest.approx(0.7)
    assert parse_score("8 (on a scale of 0-10)", 0, 10) == pytest.approx(0.8)
    assert parse_score("Rating (0-10): 7", 0, 10) == pytest.approx(0.7)
    assert parse_score("Score [1-10]: 7", 1, 10) == pytest.approx(6 / 9)
    assert parse_score("Rating: -3", -5, 10) == pytest.approx(2 / 15)
    assert parse_score("It is wrong; my score is 2.", 0, 10) == pytest.approx(0.2)
    assert parse_score(" 3.5 ", 1, 6) == pytest.approx(0.5)  # (3.5 − 1) / (6 − 1)
    assert parse_score("11", 0, 10) is None  # out of range: unparseable, not clipped
    assert parse_score("good", 0, 10) is None


def test_a_choice_is_a_or_b() -> None:
    assert parse_choice("A") == 0 and parse_choice(" B.") == 1
    assert parse_choice("A, because B is wrong") == 0  # the leading letter, punctuated
    assert parse_choice("I prefer B") == 1
    assert parse_choice("TIE") == 0.5 and parse_choice("equal.") == 0.5
    assert parse_choice("It's a tie") == 0.5 and parse_choice("A tie: both are right") == 0.5
    assert parse_choice("This is a") is None  # a lowercase letter ends it, after no ":" / ","
    for both in ("A is wrong, B is right", "A better answer is B", "A and B are equal"):
        assert parse_choice(both) is None, both  # names both, leads with neither alone
    assert parse_choice("b") == 1 and parse_choice("19:a") == 0  # the embedded judge's replies
    assert parse_choice("C") is None and parse_choice("") is None
    assert parse_choice("Both A and B are fine") is None  # names both, leads with neither


# --- the client against a real server ----------------------------------------------------


def test_replies_are_cached_by_request_and_tokens_counted() -> None:
    with JudgeServer(lambda p: "5") as server:
        client = _client(server.url)
        first = client.ask(["one two", "three"])
        again = client.ask(["one two"])
    assert [r.text for r in first + again] == ["5", "5", "5"]
    assert server.requests == 2  # the repeat came from the cache
    stats = client.stats.drain()
    assert stats["judge/calls"] == 2 and stats["judge/cache_hits"] == 1
    assert stats["judge/prompt_tokens"] == 3 and stats["judge/completion_tokens"] == 2
    assert client.stats.drain()["judge/calls"] == 0  # drained


def test_requests_run_concurrently_within_the_bound_over_every_caller() -> None:
    # (under load the threads may overlap less, never more: the bound is what is asserted)
    with JudgeServer(lambda p: "1", delay_s=0.3) as server:
        _client(server.url, concurrency=3).ask([str(k) for k in range(9)])
    assert 1 < server.max_in_flight <= 3
    with JudgeServer(lambda p: "1", delay_s=0.3) as server:  # three workers, one client
        client = _client(server.url, concurrency=2)
        callers = [
            threading.Thread(target=client.ask, args=([f"{w}-{k}" for k in range(4)],))
            for w in range(3)
        ]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
    assert server.requests == 12 and server.max_in_flight <= 2  # 6 at once before


def test_a_copy_of_a_failed_request_is_a_failure_not_a_cache_hit() -> None:
    client = _client("http://127.0.0.1:9/v1", retries=0)  # nobody listens on port 9
    replies = client.ask(["same", "same", "same"])
    stats = client.stats.drain()
    assert [r.status for r in replies] == [RewardStatus.INFRA_ERROR] * 3
    assert stats["judge/failed"] == 3 and stats["judge/cache_hits"] == 0
    assert stats["judge/calls"] == 1  # one request for the three


def test_a_prompt_asked_twice_in_one_call_is_sent_once() -> None:
    with JudgeServer(lambda p: "3", delay_s=0.05) as server:
        client = _client(server.url)
        replies = client.ask(["same"] * 8 + ["other"])
        repeat = client.ask(["same"], fresh=[True])  # a repeat goes past the cache
    assert [r.text for r in replies] == ["3"] * 9 and server.requests == 3
    assert client.stats.drain()["judge/cache_hits"] == 7 and repeat[0].text == "3"


def test_a_server_error_is_retried_and_a_refusal_is_not() -> None:
    calls = {"n": 0}

    def flaky(prompt: str) -> str | int:
        calls["n"] += 1
        return 503 if calls["n"] == 1 else "4"

    with JudgeServer(flaky) as server:
        (reply,) = _client(server.url, retries=2).ask(["x"])
    assert reply.text == "4" and server.requests == 2
    with JudgeServer(lambda p: 400) as server:
        (reply,) = _client(server.url, retries=2).ask(["x"])
    assert reply.status == RewardStatus.INFRA_ERROR and "HTTP 400" in reply.reason
    assert server.requests == 1  # a 4xx is the request's fault: retrying cannot help


def test_a_slow_server_times_out_and_a_dead_one_is_an_infra_error() -> None:
    with JudgeServer(lambda p: "1", delay_s=1.0) as server:
        (slow,) = _client(server.url, timeout_s=0.2, retries=1).ask(["x"])
    assert slow.status == RewardStatus.TIMEOUT and slow.text is None
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    client = _client(dead, retries=1)
    (refused,) = client.ask(["x"])
    assert refused.status == RewardStatus.INFRA_ERROR
    assert client.stats.drain()["judge/failed"] == 1
    with pytest.raises(ConfigError, match=r"^feedback\.judge_url: no server answers at"):
        probe(dead, timeout_s=1.0)


def _ended_within(seconds: float, call: Callable[[], object]) -> list[object]:
    """[what ``call`` returned or raised], run in a thread; [] if it ran past ``seconds``
    (the thread is left to end when the test's server stops)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # the test inspects it
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    return list(out)


def test_a_server_that_answers_byte_by_byte_times_out_at_the_deadline() -> None:
    # One byte every 0.1 s: no socket read waits the 0.5 s timeout, so only a deadline over
    # the whole request ends it (the ~300-byte reply would take ~30 s; it hung 8 requests).
    # One prompt's bound: 2 attempts × 0.5 s + the 0.25 s backoff = 1.25 s; the 8 prompts
    # run at once (concurrency 8), so the call ends in ~1.25 s; 5 s leaves room under load.
    fds = len(os.listdir("/proc/self/fd"))
    with JudgeServer(lambda p: "1", drip_s=0.1) as server:
        client = _client(server.url, timeout_s=0.5, retries=1, concurrency=8)
        asked = _ended_within(5.0, lambda: client.ask([str(k) for k in range(8)]))
        assert asked, "the judge's replies outlived their deadlines"
        probed = _ended_within(3.0, lambda: probe(server.url, timeout_s=0.5))
        assert probed, "the judge's probe outlived its deadline"
    (replies,) = asked
    assert isinstance(replies, list) and [r.status for r in replies] == [RewardStatus.TIMEOUT] * 8
    assert server.requests == 16 and client.stats.drain()["judge/failed"] == 8  # 8 × 2 attempts
    assert isinstance(probed[0], ConfigError) and "timed out" in str(probed[0])
    assert not [t for t in threading.enumerate() if t.name.startswith("rlmap-judge")]
    for _ in range(100):  # no socket left open: the server's close as their drips stop
        if len(os.listdir("/proc/self/fd")) <= fds:
            break
        time.sleep(0.02)
    assert len(os.listdir("/proc/self/fd")) <= fds


def test_templates_are_checked_for_their_placeholders(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("Q: {prompt}\nA: {response}\nScore {lo}-{hi}:")
    assert load_template(str(good), "pointwise").startswith("Q: {prompt}")
    bad = tmp_path / "bad.txt"
    bad.write_text("{prompt} {answer}")
    with pytest.raises(
        ConfigError, match=r"unknown placeholder\(s\) \['answer'\]; missing \['response'\]"
    ):
        load_template(str(bad), "pointwise")
    with pytest.raises(ConfigError, match=r"missing \['second'\]"):
        load_template(
            str(good.with_name("p.txt")) if False else _write(tmp_path, "{first}"), "pairwise"
        )
    with pytest.raises(ConfigError, match=r"^feedback\.judge_template: cannot read"):
        load_template(str(tmp_path / "missing.txt"), "pairwise")


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "t.txt"
    path.write_text(text)
    return str(path)


# --- pointwise ---------------------------------------------------------------------------


def test_pointwise_scores_parse_and_failures_are_statuses_not_zeros() -> None:
    replies = {"2+3=": "10", "1+1=": "3", "4+4=": "lovely"}
    with JudgeServer(lambda p: next(v for k, v in replies.items() if k in p)) as server:
        reward = PointwiseJudge(_client(server.url), POINTWISE_TEMPLATE, lo=0, hi=10)
        scores = score_batch(reward, [_t("2+3=", "5"), _t("1+1=", "3"), _t("4+4=", "8")])
    assert scores[0].value == 1.0 and scores[0].per_turn == (1.0,)
    assert scores[1].value == pytest.approx(0.3)
    assert scores[2].status == RewardStatus.INVALID and "lovely" in scores[2].reason
    assert reward.client.stats.drain()["judge/invalid"] == 1


def test_a_judge_server_that_dies_costs_counted_failures() -> None:
    server = JudgeServer(lambda p: "7").__enter__()
    reward = PointwiseJudge(_client(server.url, retries=1, timeout_s=2), POINTWISE_TEMPLATE)
    assert score_batch(reward, [_t("1+2=", "3")])[0].value == pytest.approx(0.7)
    server.__exit__(None, None, None)
    (after,) = score_batch(reward, [_t("2+2=", "4")])
    assert after.status in (RewardStatus.INFRA_ERROR, RewardStatus.TIMEOUT) and after.value == 0.0


def test_repeats_measure_self_consistency_bypassing_the_cache() -> None:
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def fickle(prompt: str) -> str:  # 9 the first time a prompt is asked, 1 after
        with lock:
            seen[prompt] = seen.get(prompt, 0) + 1
            return "9" if seen[prompt] == 1 else "1"

    with JudgeServer(fickle) as server:
        reward = PointwiseJudge(_client(server.url), POINTWISE_TEMPLATE, repeat_check=1.0)
        score_batch(reward, [_t(f"{k}+1=", "2") for k in range(4)])
    stats = reward.client.stats.drain()
    assert server.requests == 8 and stats["judge/self_consistency"] == 0.0  # 9 then 1, each


# --- comparisons: the design, win rates and Bradley–Terry ------------------------------


def test_the_pair_design_is_connected_and_spreads_evenly() -> None:
    assert pair_design(4) == [(0, 1), (1, 2), (2, 3), (0, 3), (0, 2), (1, 3)]
    assert pair_design(4, 3) == [(0, 1), (1, 2), (2, 3)]  # a path: every response compared
    assert len(set(pair_design(5))) == 10
    counts = [sum(k in p for p in pair_design(6, 6)) for k in range(6)]
    assert counts == [2] * 6  # the ring: each response twice
    with pytest.raises(ValueError, match="need 3 <= k <= 6"):
        pair_design(4, 2)


def test_win_rates_by_hand() -> None:
    # 0 beat 1; 1 beat 2; 0 and 2 tied: 0 won 1.5 of 2, 1 won 1 of 2, 2 won 0.5 of 2
    assert win_rates(3, [(0, 1, 1.0), (1, 2, 1.0), (0, 2, 0.5)]) == [0.75, 0.5, 0.25]
    assert win_rates(3, [(0, 1, 0.0)]) == [0.0, 1.0, None]  # 2 in no comparison


def test_bradley_terry_by_hand() -> None:
    # 0 beat 1 twice and lost once: the MLE has σ(s_0 − s_1) = 2/3, so s_0 − s_1 = ln 2 and
    # s_0 − s̄ = ln 2 / 2: reward σ(ln 2 / 2) = 1 / (1 + 2^(−1/2)) = 0.585786…
    r = bt_rewards(2, [(0, 1, 1.0), (0, 1, 1.0), (1, 0, 1.0)], prior=0.0)
    assert r[0] == pytest.approx(1 / (1 + 2**-0.5), abs=1e-9)
    assert r[1] == pytest.approx(1 - r[0], abs=1e-9)


def _bt_reference(g: int, verdicts: list[tuple[int, int, float]], prior: float) -> list[float]:
    """Plain gradient ascent on the same objective, one pair at a time."""
    s = [0.0] * g
    for _ in range(20000):
        grad = [-prior * x for x in s]
        for i, j, w in verdicts:
            p = 1 / (1 + math.exp(-(s[i] - s[j])))
            grad[i] += w - p
            grad[j] -= w - p
        s = [x + 0.05 * d for x, d in zip(s, grad, strict=True)]
    mean = sum(s) / g
    return [1 / (1 + math.exp(-(x - mean))) for x in s]


def test_bradley_terry_matches_a_reference_loop() -> None:
    rng = random.Random(3)
    verdicts = [(i, j, float(rng.random() < 0.3 + 0.1 * i)) for i, j in pair_design(5)] * 2
    got = bt_rewards(5, verdicts, prior=0.1)
    assert got == pytest.approx(_bt_reference(5, verdicts, 0.1), abs=1e-6)


def test_bradley_terry_properties() -> None:
    # a round robin (each pair once): BT strength is a function of the win count, so 1, 2
    # and 3 (one win each: a cycle) are equal, below 0 (three wins); 0 wins everything and
    # stays finite (the ridge); relabelling the responses permutes the rewards
    verdicts = [(0, 1, 1.0), (0, 2, 1.0), (0, 3, 1.0), (1, 2, 1.0), (1, 3, 0.0), (2, 3, 1.0)]
    bt = bt_rewards(4, verdicts)
    assert bt[1] == pytest.approx(bt[2], abs=1e-9) and bt[2] == pytest.approx(bt[3], abs=1e-9)
    assert bt[0] is not None and bt[1] is not None and 0.5 < bt[0] < 1 and bt[1] < 0.5
    perm = [2, 0, 3, 1]
    moved = bt_rewards(4, [(perm[i], perm[j], w) for i, j, w in verdicts])
    assert [moved[perm[k]] for k in range(4)] == pytest.approx(bt)
    assert bt_rewards(3, [(0, 1, 1.0)])[2] is None


# --- comparisons against the server ---------------------------------------------------


def _group(prompt: str, responses: list[str], group: int = 0) -> list[Trajectory]:
    return [_t(prompt, r, group) for r in responses]


def test_comparison_rewards_from_a_fair_judge_rank_the_correct_first() -> None:
    batch = _group("2+3=", ["5", "4", "5", "7"]) + _group("1+1=", ["2", "3"], group=1)
    with JudgeServer(correct_first) as server:
        for aggregate in ("winrate", "bt"):
            reward = ComparisonReward(
                _client(server.url),
                PAIRWISE_TEMPLATE,
                aggregate=aggregate,
                position_check=1.0,
            )  # type: ignore[arg-type]
            scores = score_batch(reward, batch)
            values = [s.value for s in scores]
            assert min(values[0], values[2]) > max(values[1], values[3]), aggregate
            assert values[4] > values[5], aggregate
    stats = reward.client.stats.drain()
    # every pair shown both ways (check = 1), but "5" against "5": a tie, never asked
    assert stats["judge/pairs"] == 2 * (5 + 1) + 1


def test_a_fair_judge_is_not_flagged_and_identical_responses_tie_unasked() -> None:
    # two prompts; identical responses ("5", "5") are a tie without a request; the fair
    # judge calls a tie when both or neither is correct, so every pair agrees both ways
    batch = _group("2+3=", ["5", "4", "5", "7"]) + _group("1+1=", ["2", "3", "9"], group=1)
    with JudgeServer(correct_first) as server:
        reward = ComparisonReward(_client(server.url), PAIRWISE_TEMPLATE, position_check=1.0)
        scores = score_batch(reward, batch)
    stats = reward.client.stats.drain()
    assert stats["judge/position_agreement"] == 1.0
    # distinct texts, each order asked once: {5, 4}, {5, 7}, {4, 7} and {2, 3}, {2, 9},
    # {3, 9}, two orders each (the second "5" asks what the first did: the cache)
    assert server.requests == 2 * (3 + 3)
    assert scores[0].value == scores[2].value  # the same text: the same reward
    # the first "5": beats "4" and "7" both ways (4 wins), ties the other "5" once: 4.5 / 5
    assert scores[0].value == pytest.approx(0.9)


def test_a_judge_that_always_prefers_the_first_has_no_position_agreement() -> None:
    batch = _group("2+3=", ["5", "4", "6", "1"])
    with JudgeServer(always_first) as server:
        reward = ComparisonReward(_client(server.url), PAIRWISE_TEMPLATE, position_check=1.0)
        scores = score_batch(reward, batch)
    stats = reward.client.stats.drain()
    assert stats["judge/position_agreement"] == 0.0 and stats["judge/first_preferred_frac"] == 1.0
    # each pair shown both ways: one win each way, so every response's win rate is ½
    assert [s.value for s in scores] == [0.5] * 4


def test_repeated_comparisons_measure_self_consistency() -> None:
    # before: the repeats' replies were zipped with the shown pairs, and every batch with a
    # repeat failed as a whole (infra_error)
    batch = _group("2+3=", ["5", "4", "6"])
    with JudgeServer(correct_first) as server:
        reward = ComparisonReward(_client(server.url), PAIRWISE_TEMPLATE, repeat_check=1.0)
        scores = score_batch(reward, batch)
    assert all(s.ok for s in scores) and server.requests == 3 + 3  # each pair once more
    assert scores[0].value == 1.0  # "5" beats both; "4" and "6" tie
    assert reward.client.stats.drain()["judge/self_consistency"] == 1.0


def test_comparison_pairs_bound_the_requests_and_failures_are_statuses() -> None:
    batch = _group("2+3=", [str(k) for k in range(6)])
    with JudgeServer(correct_first) as server:
        ComparisonReward(_client(server.url), PAIRWISE_TEMPLATE, pairs=5)(batch)
    assert server.requests == 5
    with JudgeServer(lambda p: "neither") as server:
        scores = score_batch(ComparisonReward(_client(server.url), PAIRWISE_TEMPLATE), batch)
    assert {s.status for s in scores} == {RewardStatus.INVALID}
    alone = score_batch(
        ComparisonReward(_client("http://127.0.0.1:9/v1"), PAIRWISE_TEMPLATE), [_t("1+1=", "2")]
    )
    assert alone[0].status == RewardStatus.INFRA_ERROR


def test_length_correlation_is_measured_within_equal_outcomes() -> None:
    # outcome 0: (0.1, 10), (0.3, 20); outcome 1: (0.8, 5), (1.0, 15). Within each, the
    # longer scores 0.2 more: centred, x = (−0.1, 0.1, −0.1, 0.1), y = (−5, 5, −5, 5): r = 1.
    # Pooled without the strata the correct answers are shorter, and r would be negative.
    rows = [(0.1, 10.0, 0.0), (0.3, 20.0, 0.0), (0.8, 5.0, 1.0), (1.0, 15.0, 1.0)]
    assert within_outcome_corr(rows) == pytest.approx(1.0)
    pooled = torch.corrcoef(torch.tensor([[r[0] for r in rows], [r[1] for r in rows]]))[0, 1]
    assert float(pooled) < 0
    assert within_outcome_corr(rows[:2]) is None  # too few to say


# --- the embedded judge's examples ---------------------------------------------------------


def test_the_embedded_judges_examples_say_which_answer_is_right() -> None:
    from rlmap.learned.judge_model import judge_examples
    from rlmap.tasks.arithmetic import make_problem

    task = [make_problem(a, "+", b) for a in range(10) for b in range(10)]
    examples = judge_examples(task, 400, pairwise=0.5, seed=0)
    point = [e for e in examples if "," not in e.prompt]
    pair = [e for e in examples if "," in e.prompt]
    assert 150 < len(point) < 250 and len(point) + len(pair) == 400
    for e in point:  # "c?a+b=" → "s:1" exactly when c is s = a + b
        c, a, b = re.fullmatch(r"(.*)\?(\d+)\+(\d+)=", e.prompt, re.S).groups()  # type: ignore[union-attr]
        total = str(int(a) + int(b))
        assert e.answer == f"{total}:{1 if c == total else 0}", e
        assert parse_score(e.answer, 0, 1) == (c == total)  # the reply's verdict parses
    for e in pair:  # "c,d?a+b=" → "s:a" when c is right; exactly one of c, d is
        c, a, b = re.fullmatch(r"(.*)\?(\d+)\+(\d+)=", e.prompt, re.S).groups()  # type: ignore[union-attr]
        first, second = c.split(",")
        total = str(int(a) + int(b))
        assert (first == total) != (second == total), e
        assert e.answer == f"{total}:{'a' if first == total else 'b'}", e
        assert parse_choice(e.answer) == (0 if first == total else 1)
    assert {e.answer[-1] for e in point} == {"0", "1"} and {e.answer[-1] for e in pair} == {
        "a",
        "b",
    }
    assert load_template("embedded", "pointwise").format(prompt="1+2=", response="3") == "3?1+2="


# --- comparisons by a learned pairwise model -------------------------------------------


def test_learned_comparisons_by_hand() -> None:
    from rlmap.feedback.judge import LearnedComparison

    # scores r = (0, ln 2, 0): P(1 ≻ 0) = P(1 ≻ 2) = σ(ln 2) = 2/3, P(0 ≻ 2) = ½; win rates
    # 0: (1/3 + 1/2) / 2 = 5/12, 1: (2/3 + 2/3) / 2 = 2/3, 2: (1/2 + 1/3) / 2 = 5/12
    def t(score: float | None, group: int = 0) -> Trajectory:
        extra = {} if score is None else {"learned": score}
        return Trajectory(
            prompt="1+1=",
            turns=("2",),
            reference="2",
            length=1,
            max_length=4,
            metadata={"group": group, "rewards": (1.0,), **extra},
        )

    reward = LearnedComparison()
    scores = score_batch(reward, [t(0.0), t(math.log(2)), t(0.0), t(None, group=1)])
    assert [s.value for s in scores[:3]] == pytest.approx([5 / 12, 2 / 3, 5 / 12])
    assert scores[3].status == RewardStatus.INFRA_ERROR  # no score to compare
    assert reward.stats.drain()["judge/pairs"] == 3
    bt = score_batch(LearnedComparison(aggregate="bt"), [t(0.0), t(math.log(2)), t(0.0)])
    assert bt[1].value > bt[0].value == pytest.approx(bt[2].value)
