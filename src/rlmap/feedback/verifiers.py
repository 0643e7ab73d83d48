"""Deterministic outcome verifiers: the response is checked against a reference answer.

A verifier returns the reward of one response. Failure isolation (a verifier that
crashes or times out yields an ``infra_error`` / ``timeout`` status, never a zero
reward) is the caller's job and is built on these pure functions.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"-?\d+(?:\.\d+)?")


def normalize(text: str) -> str:
    """Collapse whitespace and strip the ends, so ' 12 \\n' matches '12'."""
    return " ".join(text.split())


def exact_match(response: str, reference: str) -> float:
    """1.0 if the response equals the reference after whitespace normalisation, else 0.0."""
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
