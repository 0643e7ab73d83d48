"""The calculator tool task: the safe evaluator, the environment's steps, demonstrations."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlmap.core.batch import RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.embedded.warmstart import sft_batch
from rlmap.feedback.verifiers import exact_match
from rlmap.tasks.arithmetic import Example, make_problem
from rlmap.tasks.calculator import (
    MAX_RESULT,
    TOOL_TOKENS,
    CalculatorEnv,
    calculate,
    demonstration,
    marker_ids,
)
from rlmap.tasks.prompts import encode_prompt

TOKENIZER = build_tokenizer(extra_tokens=TOOL_TOKENS)
EXAMPLE = make_problem(37, "*", 85)  # 37*85= -> 3145


def ids(text: str) -> list[int]:
    return [int(i) for i in TOKENIZER.encode(text, add_special_tokens=False)]


def env(max_turns: int = 3, example: Example = EXAMPLE, verify=exact_match) -> CalculatorEnv:  # type: ignore[no-untyped-def]
    e = CalculatorEnv(TOKENIZER, example, verify, max_turns=max_turns)
    e.reset()
    return e


EOS = int(TOKENIZER.eos_token_id)


# --- the evaluator ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("37*85", 3145),  # 37*85 = 3000 + 145
        ("2+3*4", 14),  # precedence: 3*4 first
        ("(2+3)*4", 20),
        ("-5+2", -3),
        (" 7 - 10 ", -3),
        ("0*99", 0),
    ],
)
def test_calculate_hand_cases(expression: str, value: int) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "37*",
        "2**10",  # powers are not offered (they explode)
        "1/2",
        "abc",
        "__import__('os').system('true')",
        "(lambda: 1)()",
        "True+1",
        "1.5*2",
        "'3'*3",
        "9" * 13,  # beyond MAX_RESULT
        "1+" * 40 + "1",  # longer than MAX_EXPRESSION_CHARS
        "<calc>1",
    ],
)
def test_calculate_refuses_what_is_not_small_integer_arithmetic(expression: str) -> None:
    assert calculate(expression) is None


@given(st.integers(-(10**5), 10**5), st.sampled_from("+-*"), st.integers(-(10**5), 10**5))
def test_calculate_agrees_with_python_on_binary_integer_arithmetic(a: int, op: str, b: int) -> None:
    expected = {"+": a + b, "-": a - b, "*": a * b}[op]
    assert calculate(f"{a}{op}({b})") == (expected if abs(expected) <= MAX_RESULT else None)


# --- the environment -------------------------------------------------------------------


def test_tool_call_returns_the_result_as_an_observation_and_goes_on() -> None:
    s = env().step(ids("<calc>37*85</calc>"))
    assert s.tool_call and not s.tool_error
    assert not s.terminated and not s.truncated and s.reward == 0.0
    assert TOKENIZER.decode(list(s.observation)) == "<result>3145</result>"


def test_answers_terminate_with_the_verifiers_reward() -> None:
    right = env().step([*ids("3145"), EOS])
    wrong = env().step([*ids("3154"), EOS])
    assert right.terminated and right.reward == 1.0 and right.status == RewardStatus.OK
    assert wrong.terminated and wrong.reward == 0.0
    assert not right.tool_call and right.observation == ()


def test_an_unclosed_call_ended_by_eos_is_an_answer_and_not_the_bare_number() -> None:
    # "<calc>3145<eos>" must not read as "3145": the marker stays in the decoded text
    s = env().step([*ids("<calc>3145"), EOS])
    assert s.terminated and s.reward == 0.0 and not s.tool_call


@pytest.mark.parametrize("call", ["<calc>37*</calc>", "</calc>", "12</calc>", "<calc></calc>"])
def test_malformed_calls_are_tool_errors_and_the_episode_goes_on(call: str) -> None:
    s = env().step(ids(call))
    assert s.tool_call and s.tool_error and not s.terminated and not s.truncated
    assert TOKENIZER.decode(list(s.observation)) == "<result>error</result>"


def test_the_expression_is_the_text_after_the_turns_last_call_marker() -> None:
    s = env().step(ids("9<calc>1+1<calc>2*3</calc>"))
    assert TOKENIZER.decode(list(s.observation)) == "<result>6</result>"


def test_the_turn_budget_truncates_after_the_last_allowed_call_with_its_observation() -> None:
    e = env(max_turns=2)
    first = e.step(ids("<calc>1+1</calc>"))
    second = e.step(ids("<calc>37*85</calc>"))
    assert not first.truncated
    assert second.truncated and not second.terminated  # bootstrapped, not terminal
    assert TOKENIZER.decode(list(second.observation)) == "<result>3145</result>"


def test_answer_on_the_last_turn_still_terminates() -> None:
    e = env(max_turns=2)
    e.step(ids("<calc>37*85</calc>"))
    s = e.step([*ids("3145"), EOS])
    assert s.terminated and not s.truncated and s.reward == 1.0


def test_reset_starts_a_new_episode_with_the_prompt() -> None:
    e = env(max_turns=1)
    assert e.step(ids("<calc>1</calc>")).truncated
    assert e.reset() == encode_prompt(TOKENIZER, EXAMPLE.prompt)
    assert e.step(ids("<calc>1</calc>")).truncated  # the budget restarted: one turn again


def test_a_crashing_verifier_is_an_infra_error_not_a_zero() -> None:
    def broken(response: str, reference: str) -> float:
        raise RuntimeError("verifier down")

    s = env(verify=broken).step([*ids("3145"), EOS])
    assert s.terminated and s.status == RewardStatus.INFRA_ERROR


def test_a_tokenizer_without_the_markers_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"data\.task.*'<calc>'"):
        marker_ids(build_tokenizer())
    with pytest.raises(ValueError, match="max_turns"):
        CalculatorEnv(TOKENIZER, EXAMPLE, exact_match, max_turns=0)


# --- demonstrations ----------------------------------------------------------------------


def test_demonstration_with_the_tool_marks_only_the_policys_tokens_as_actions() -> None:
    segments = demonstration(TOKENIZER, EXAMPLE, "3145", use_tool=True)
    texts = [(TOKENIZER.decode(part), trained) for part, trained in segments]
    assert texts == [
        ("<calc>37*85</calc>", True),
        ("<result>3145</result>", False),
        ("3145<eos>", True),
    ]
    assert demonstration(TOKENIZER, EXAMPLE, "3145", use_tool=False) == [
        ([*ids("3145"), EOS], True)
    ]


def test_sft_labels_skip_prompt_and_observation_tokens() -> None:
    ids_, attention, labels = sft_batch(TOKENIZER, [EXAMPLE], 0.0, random.Random(0), tool_demos=1.0)
    row = ids_[0][attention[0].bool()].tolist()
    trained = [t for t, lab in zip(row, labels[0].tolist(), strict=False) if lab != -100]
    assert TOKENIZER.decode(trained) == "<calc>37*85</calc>3145<eos>"
    # every label equals its own input token (causal shift happens inside the model)
    assert all(lab in (-100, tok) for tok, lab in zip(row, labels[0].tolist(), strict=False))
