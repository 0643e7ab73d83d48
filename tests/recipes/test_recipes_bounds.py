"""Every bound and count is checked before any work, in one line naming the field.

Each case below was accepted before the bounds check existed; two of them broke a run
outright: ``behaviour.max_staleness=-1`` on the asynchronous preset hung with no output
(no trajectory is ever admitted), and ``generation.temperature=0`` trained every weight
into NaN (the learner divides the logits by T).
"""

from __future__ import annotations

import pytest

from rlmap.core.errors import ConfigError
from rlmap.recipes import build_config
from rlmap.recipes.validate import _AT_LEAST_ONE, _AT_LEAST_ZERO, _POSITIVE


def _message(recipe: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(recipe, None, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("field", "bad"),
    [(f, 0) for f in _AT_LEAST_ONE]
    + [(f, -1) for f in _AT_LEAST_ZERO]
    + [(f, 0) for f in _POSITIVE]
    + [(f, -0.5) for f in _POSITIVE],
)
def test_each_bound_is_refused_naming_its_field(field: str, bad: float) -> None:
    message = _message("grpo", f"{field}={bad}")
    assert message.startswith(f"{field}: must be"), message


ISSUE_11 = (
    "behaviour.max_staleness=-1",
    "run.eval_every=0",
    "run.checkpoint_every=0",
    "run.keep_checkpoints=0",
    "generation.eval_samples=0",
    "generation.max_new_tokens=0",
    "data.train_size=0",
    "data.eval_size=0",
    "generation.temperature=0",
)
"""The bounds issue 11 names, written out (the table-driven test above would lose a case
if a field were dropped from the validator's own tuples)."""


@pytest.mark.parametrize("override", ISSUE_11)
def test_every_bound_issue_11_names_is_refused(override: str) -> None:
    field = override.split("=")[0]
    assert _message("grpo", override).startswith(f"{field}: must be")


@pytest.mark.parametrize(
    "overrides",
    [
        ["behaviour.max_staleness=-1"],
        ["run.eval_every=0"],
        ["run.checkpoint_every=0"],
        ["run.keep_checkpoints=0"],
        ["generation.eval_samples=0"],
        ["generation.max_new_tokens=0"],
        ["data.train_size=0"],
    ],
)
def test_the_asynchronous_preset_refuses_them_too(overrides: list[str]) -> None:
    field = overrides[0].split("=")[0]
    assert _message("sao", *overrides).startswith(f"{field}:")


def test_the_edges_of_each_bound_are_accepted() -> None:
    cfg = build_config(
        "sao",
        None,
        [
            "behaviour.max_staleness=0",
            "run.eval_every=1",
            "run.keep_checkpoints=1",
            "optim.weight_decay=0",
            "generation.top_p=1.0",
        ],
    )
    assert cfg.behaviour.max_staleness == 0
    assert cfg.run.eval_every == 1


def test_temperature_zero_is_refused_with_the_reason() -> None:
    message = _message("grpo", "generation.temperature=0")
    assert message.startswith("generation.temperature: must be > 0")
    assert "softmax(z/T)" in message


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("field", ["optim.lr", "behaviour.clip_high", "credit.lam", "kl.beta"])
def test_a_non_finite_number_is_refused(field: str, value: str) -> None:
    # nan <= 0 is False, so a NaN learning rate passed the old "> 0" check and trained on.
    message = _message("grpo", f"{field}={value}")
    assert message.startswith(f"{field}: must be a finite number"), message


@pytest.mark.parametrize("top_p", ["0", "-0.1", "1.5"])
def test_top_p_is_a_probability_mass(top_p: str) -> None:
    assert _message("grpo", f"generation.top_p={top_p}").startswith("generation.top_p: must be")


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("behaviour.icepop_low", "behaviour.icepop_high"),
        ("behaviour.masked_is_low", "behaviour.masked_is_high"),
    ],
)
def test_an_acceptance_interval_must_not_be_empty(low: str, high: str) -> None:
    assert _message("grpo", f"{low}=3", f"{high}=2").startswith(f"{low}: needs")
    assert _message("grpo", f"{low}=-1").startswith(f"{low}: needs")


def test_dynamic_sampling_in_the_asynchronous_loop_is_refused_not_ignored() -> None:
    # Before: the asynchronous loop never read sampling.filter; dapo with system.mode=async
    # trained without dynamic sampling and said nothing.
    message = _message("dapo", "system.mode=async")
    assert message.startswith("sampling.filter: 'mixed' filters whole groups")
