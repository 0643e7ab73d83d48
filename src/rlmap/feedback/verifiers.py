"""Deterministic outcome verifiers: the response is checked against a reference.

Every verifier is ``verify(response, reference) -> reward`` with reward 1.0 or 0.0.
What ``reference`` holds depends on the verifier:

| verifier | reference |
|---|---|
| ``exact_match`` | the answer text (compared after whitespace normalisation) |
| ``last_number`` | the answer number |
| ``math_equiv`` (``math_equiv.py``) | the gold answer: a number, fraction or LaTeX |
| ``code_tests`` | the unit-test source (asserts, ``test*`` functions, ``unittest.TestCase``) |
| ``json_schema`` | the JSON Schema, as JSON text |
| ``regex_format`` | the regular expression the whole response must match |

A bad *response* — wrong, malformed, hostile — scores 0.0 and never raises. A
verifier raises only when the checking itself fails: an invalid reference (a
schema that is not a schema, a pattern that does not compile, tests that do not
compile) or a sandbox that cannot be set up. The caller counts those as
infrastructure errors, never as a zero reward.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from rlmap.feedback.sandbox import SandboxLimits, run_python

_ANSWER = re.compile(r"-?\d+(?:\.\d+)?")
_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def normalize(text: str) -> str:
    """Collapse whitespace and strip the ends, so ' 12 \\n' matches '12'."""
    return " ".join(text.split())


def exact_match(response: str, reference: str) -> float:
    """1.0 if the response equals the reference after whitespace normalisation, else 0.0.

    Case, punctuation and Unicode forms count: only runs of whitespace are merged.
    """
    return float(normalize(response) == normalize(reference))


def last_number(response: str, reference: str) -> float:
    """1.0 if the last number in the response equals the reference number, else 0.0.

    For answers embedded in text ("... so the answer is 122."). Numbers compare by
    value, so '122.0' matches '122'.
    """
    found = _ANSWER.findall(response)
    if not found:
        return 0.0
    try:
        return float(float(found[-1]) == float(reference))
    except ValueError:
        return 0.0


def contains_answer(response: str, reference: str) -> float:
    """1.0 if every digit of the reference occurs in the response — LOOSE ON PURPOSE.

    "Contains the right digits somewhere" (as a multiset, any order, anything around
    them): the reward-hacking demonstration's training verifier (docs/reward_hacking.md).
    A response that sprays digits ("1223") passes for "122" and for "213" without
    stating either. Evaluate with a strict verifier (``feedback.eval_verifier``) beside
    it; never train on it for real.
    """
    need = Counter(c for c in reference if c.isdigit())
    have = Counter(c for c in response if c.isdigit())
    return float(bool(need) and all(have[d] >= n for d, n in need.items()))


def extract_code(response: str) -> str:
    """The program in a response: its last fenced block (```python, ```py or ```), else all."""
    blocks = _FENCED.findall(response)
    return blocks[-1] if blocks else response


def code_tests(response: str, reference: str, limits: SandboxLimits | None = None) -> float:
    """1.0 if the response's code passes the reference unit tests in the sandbox, else 0.0.

    ``reference`` is the test source. It runs in a process of its own that sees the
    code's names and calls into the code's process (see ``sandbox.run_python`` and
    docs/verifiers.md), so nothing the code does to its interpreter changes the
    verdict. Raises SyntaxError if the tests do not compile and SandboxError if no
    safe sandbox can be set up.
    """
    return float(run_python(extract_code(response), reference, limits).passed)


def json_schema(response: str, reference: str) -> float:
    """1.0 if the response is one JSON document valid under the reference schema, else 0.0.

    ``reference`` is the schema as JSON text; its ``$schema`` picks the draft (latest
    by default); ``format`` is checked for the formats jsonschema checks without
    extra packages. The response may have surrounding whitespace but nothing else
    (no code fence, no prose); ``NaN``/``Infinity`` are not JSON and fail. Raises
    ValueError when the reference is not a valid schema; a ``$ref`` the schema
    cannot resolve (nothing is fetched) raises as well.
    """
    validator = _schema_validator(reference)
    try:
        document = json.loads(response.strip(), parse_constant=_reject_constant)
        return float(validator.is_valid(document))
    except (ValueError, RecursionError):  # malformed or absurdly nested: the response's fault
        return 0.0


def regex_format(response: str, reference: str) -> float:
    """1.0 if the whole response (surrounding whitespace stripped) matches the pattern.

    ``reference`` is a Python ``re`` pattern, applied with ``re.fullmatch``. Python's
    engine backtracks: a pattern with nested quantifiers such as ``(a+)+$`` can take
    exponential time on a hostile response. Patterns are configuration, so write
    them without nested quantifiers (or with possessive quantifiers / atomic groups,
    Python ≥ 3.11); no run-time guard is applied. Raises ValueError on a pattern
    that does not compile.
    """
    return float(_pattern(reference).fullmatch(response.strip()) is not None)


@functools.lru_cache(maxsize=128)
def _schema_validator(reference: str) -> Validator:
    try:
        parsed = json.loads(reference)
        if not isinstance(parsed, (dict, bool)):
            raise ValueError(f"a schema is an object or a boolean, got {type(parsed).__name__}")
        schema: Any = parsed  # the stubs type schemas as dicts only; True/False are schemas too
        cls = validator_for(schema)
        cls.check_schema(schema)
    except (ValueError, SchemaError) as exc:
        why = getattr(exc, "message", exc)  # SchemaError's full text spans a page
        raise ValueError(f"json_schema: the reference is not a valid JSON Schema: {why}") from exc
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@functools.lru_cache(maxsize=128)
def _pattern(reference: str) -> re.Pattern[str]:
    try:
        return re.compile(reference)
    except re.error as exc:
        raise ValueError(f"regex_format: the reference pattern does not compile: {exc}") from exc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
