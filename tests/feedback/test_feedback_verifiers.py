"""Deterministic outcome verifiers: correct, wrong, malformed and adversarial responses.

A bad response scores 0.0 and never raises; only a broken reference (or a broken
checker) raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlmap.feedback import registry
from rlmap.feedback.math_equiv import MathEquiv
from rlmap.feedback.sandbox import SandboxLimits
from rlmap.feedback.verifiers import (
    code_tests,
    exact_match,
    extract_code,
    json_schema,
    last_number,
    regex_format,
)


def test_registry_names_and_signature() -> None:
    names = ("exact_match", "last_number", "math_equiv", "code_tests", "json_schema", "regex")
    assert set(names) <= set(registry.names())
    assert registry.get("exact_match").fn("12", " 12\n") == 1.0
    assert registry.get("regex").fn("2024-01-31", r"\d{4}-\d{2}-\d{2}") == 1.0
    assert registry.get("json_schema").fn("[1, 2]", '{"type": "array"}') == 1.0


# ---------------------------------------------------------------- exact_match, last_number


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [
        ("122", "122", 1.0),  # correct
        ("  122 \n", "122", 1.0),  # whitespace is normalised
        ("a  b\tc", "a b c", 1.0),
        ("121", "122", 0.0),  # wrong
        ("", "122", 0.0),  # malformed: empty
        ("122.", "122", 0.0),  # punctuation counts
        ("Paris", "paris", 0.0),  # case counts
        ("１２２", "122", 0.0),  # adversarial: full-width digits are other characters
        ("122\u200b", "122", 0.0),  # adversarial: zero-width space is not whitespace
        ("122" * 100_000, "122", 0.0),  # adversarial: huge response
    ],
)
def test_exact_match(response: str, reference: str, reward: float) -> None:
    assert exact_match(response, reference) == reward


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [
        ("so the answer is 122.", "122", 1.0),
        ("122.0", "122", 1.0),
        ("first 122 then 7", "122", 0.0),  # the last number counts
        ("no number here", "122", 0.0),
        ("", "122", 0.0),
        ("-5", "-5", 1.0),
        ("1" * 5000, "1", 0.0),  # adversarial: a huge number is just a wrong one
    ],
)
def test_last_number(response: str, reference: str, reward: float) -> None:
    assert last_number(response, reference) == reward


# ---------------------------------------------------------------- math_equiv


@pytest.fixture(scope="module")
def math_equiv() -> Iterator[MathEquiv]:
    verifier = MathEquiv(timeout_seconds=2.0)
    yield verifier
    verifier.close()


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (r"The answer is \boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{\frac{1}{2}}", "1/2"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        ("so it is $\\frac12$", "0.5"),
        ("The answer is 0.5", "$\\frac{1}{2}$"),
        (r"\boxed{3}", "3.0"),
        ("\\boxed{3.0}", "3"),
        (r"\boxed{1,000}", "1000"),  # thousands separator
        ("$1{,}000$", "1000"),
        ("12,345.6", "12345.6"),
        (r"\boxed{\sqrt{2}}", r"\sqrt{2}"),
        ("$x^2+2x+1$", "$(x+1)^2$"),  # symbolic equality
        (r"\boxed{10\%}", "0.1"),
        (r"\boxed{5 \text{ cm}}", "5"),  # units are dropped
        (r"\boxed{-\frac{3}{4}}", "-0.75"),
    ],
)
def test_math_equiv_equivalences(math_equiv: MathEquiv, response: str, reference: str) -> None:
    assert math_equiv(response, reference) == 1.0


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (r"\boxed{\frac{1}{3}}", "0.5"),  # wrong
        (r"\boxed{3}", "4"),
        ("$x^2+1$", "$(x+1)^2$"),
        ("", "0.5"),  # malformed: empty
        ("I do not know", "0.5"),  # malformed: no answer
        (r"\boxed{\frac{1}{", "0.5"),  # malformed: unbalanced LaTeX
        ("}}}}{{{{\\\\\\$$$", "0.5"),
        ("__import__('os').system('touch /tmp/rlmap-pwned-math')", "0"),  # adversarial
    ],
)
def test_math_equiv_rejects(math_equiv: MathEquiv, response: str, reference: str) -> None:
    assert math_equiv(response, reference) == 0.0
    assert not Path("/tmp/rlmap-pwned-math").exists()


def test_math_equiv_pathological_answer_times_out_to_zero() -> None:
    verifier = MathEquiv(timeout_seconds=1.0)
    try:
        assert verifier("1", "1") == 1.0  # started, and warm
        start = time.monotonic()
        assert verifier(r"\boxed{9^{9^{9^{9}}}}", "1") == 0.0  # power tower: never finishes
        assert time.monotonic() - start < 3.0
        assert verifier(r"\boxed{2}", "2") == 1.0  # the worker was replaced and works
    finally:
        verifier.close()


def test_math_equiv_is_deterministic(math_equiv: MathEquiv) -> None:
    cases = [(r"\boxed{\frac{2}{4}}", "0.5"), (r"\boxed{0.51}", "0.5"), ("7", "7")]
    first = [math_equiv(r, g) for r, g in cases]
    assert first == [math_equiv(r, g) for r, g in cases] == [1.0, 0.0, 1.0]


def test_math_equiv_works_off_the_main_thread(math_equiv: MathEquiv) -> None:
    got: list[float] = []
    threads = [
        threading.Thread(target=lambda: got.append(math_equiv(r"\boxed{\frac{1}{2}}", "0.5")))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("reference", ["", "???", r"\frac{1}{", "$$"])
def test_math_equiv_unparseable_reference_raises(math_equiv: MathEquiv, reference: str) -> None:
    with pytest.raises(ValueError, match="cannot parse reference"):
        math_equiv("1", reference)


# ---------------------------------------------------------------- code_tests

FAST = SandboxLimits(wall_seconds=2.0, cpu_seconds=1, memory_bytes=256 * 2**20)
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def test_code_tests_correct_fenced_code() -> None:
    response = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert code_tests(response, TESTS, FAST) == 1.0


def test_code_tests_bare_code() -> None:
    assert code_tests("def add(a, b):\n    return a + b\n", TESTS, FAST) == 1.0


def test_code_tests_wrong_code() -> None:
    assert code_tests("```python\ndef add(a, b):\n    return a - b\n```", TESTS, FAST) == 0.0


@pytest.mark.parametrize(
    "response",
    [
        "",  # nothing
        "I cannot write this function.",  # prose is not code
        "```python\ndef add(a, b:\n    return a + b\n```",  # syntax error
        "```python\nimport sys\nsys.exit(0)\n```",  # adversarial: leave before the tests
        "```python\nwhile True:\n    pass\n```",  # adversarial: never finishes
    ],
)
def test_code_tests_malformed_and_adversarial(response: str) -> None:
    assert code_tests(response, TESTS, FAST) == 0.0


def test_code_tests_invalid_tests_raise() -> None:
    with pytest.raises(SyntaxError):
        code_tests("def add(a, b):\n    return a + b\n", "assert add(", FAST)


def test_extract_code_takes_the_last_block() -> None:
    response = "```python\nfirst = 1\n```\ntext\n```py\nsecond = 2\n```\n```\nthird = 3\n```"
    assert extract_code(response) == "third = 3\n"
    assert extract_code("```python\nx = 1\n```") == "x = 1\n"
    assert extract_code("x = 1") == "x = 1"


# ---------------------------------------------------------------- json_schema

SCHEMA = (
    '{"type": "object", "required": ["name", "age"], "additionalProperties": false,'
    ' "properties": {"name": {"type": "string", "minLength": 1},'
    ' "age": {"type": "integer", "minimum": 0}}}'
)


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ('{"name": "Ada", "age": 36}', 1.0),  # correct
        ('  {"age": 36, "name": "Ada"}\n', 1.0),  # surrounding whitespace is fine
        ('{"name": "Ada", "age": -1}', 0.0),  # wrong: violates minimum
        ('{"name": "Ada"}', 0.0),  # wrong: missing field
        ('{"name": "Ada", "age": 36, "x": 1}', 0.0),  # wrong: extra field
        ('{"name": "Ada", "age": "36"}', 0.0),  # wrong type
        ('{"name": "Ada", "age": 36', 0.0),  # malformed: truncated
        ("{'name': 'Ada', 'age': 36}", 0.0),  # malformed: Python, not JSON
        ('```json\n{"name": "Ada", "age": 36}\n```', 0.0),  # a fence is not JSON
        ('{"name": "Ada", "age": 36} trailing', 0.0),
        ("", 0.0),
        ('{"name": "Ada", "age": NaN}', 0.0),  # NaN is not JSON
        ('{"name": "Ada", "age": Infinity}', 0.0),
        ('{"name": "Ada", "age": ' + "9" * 10_000 + "}", 0.0),  # adversarial: huge integer
        ("[" * 100_000 + "]" * 100_000, 0.0),  # adversarial: deep nesting
    ],
)
def test_json_schema(response: str, reward: float) -> None:
    assert json_schema(response, SCHEMA) == reward


@pytest.mark.parametrize("response", ["NaN", "Infinity", "-Infinity", "[1, NaN]"])
def test_json_schema_rejects_non_json_numbers(response: str) -> None:
    # Python's json module reads these; JSON does not have them
    assert json_schema(response, '{"type": ["number", "array"]}') == 0.0
    assert json_schema("1.5", '{"type": ["number", "array"]}') == 1.0


def test_json_schema_checks_formats() -> None:
    schema = '{"type": "string", "format": "ipv4"}'
    assert json_schema('"192.168.0.1"', schema) == 1.0
    assert json_schema('"999.1.1.1"', schema) == 0.0


@pytest.mark.parametrize(
    "schema",
    [
        "not json",
        '{"type": "nope"}',  # JSON, but not a schema
        '{"type": "object", "required": "name"}',
        "5",
        '"string"',
    ],
)
def test_json_schema_invalid_schema_raises(schema: str) -> None:
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        json_schema("{}", schema)


def test_json_schema_remote_ref_is_not_fetched() -> None:
    with pytest.raises(Exception, match="Unresolvable"):
        json_schema("1", '{"$ref": "http://127.0.0.1:9/schema.json"}')


# ---------------------------------------------------------------- regex_format

DATE = r"\d{4}-\d{2}-\d{2}"


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("2024-01-31", 1.0),  # correct
        ("2024-01-31\n", 1.0),  # surrounding whitespace is stripped
        ("2024-1-31", 0.0),  # wrong
        ("Date: 2024-01-31", 0.0),  # the whole response must match
        ("2024-01-31 and more", 0.0),
        ("", 0.0),  # malformed: empty
        ("2024-01-31\nrm -rf /", 0.0),  # adversarial: a second line
        ("٢٠٢٤-٠١-٣١", 1.0),  # \d is Unicode: write [0-9] to mean ASCII digits
    ],
)
def test_regex_format(response: str, reward: float) -> None:
    assert regex_format(response, DATE) == reward


def test_regex_ascii_digits_pattern_rejects_other_digits() -> None:
    assert regex_format("٢٠٢٤-٠١-٣١", r"[0-9]{4}-[0-9]{2}-[0-9]{2}") == 0.0


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}"])
def test_regex_invalid_pattern_raises(pattern: str) -> None:
    with pytest.raises(ValueError, match="does not compile"):
        regex_format("a", pattern)
