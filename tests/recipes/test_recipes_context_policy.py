"""``data.context_policy``: ``fail`` by default everywhere, ``truncate_oldest`` and ``compact``
accepted where they can cut something, the rest refused in one line naming the field."""

from __future__ import annotations

import pytest

from rlmap.core.errors import ConfigError
from rlmap.recipes import build_config, registry

CALC = ["data.task=calculator", "data.context_policy=truncate_oldest"]


def test_every_preset_keeps_failing_at_a_full_context() -> None:
    assert {name: build_config(name, None, []).data.context_policy for name in registry} == {
        name: "fail" for name in registry
    }


@pytest.mark.parametrize("recipe", ["grpo", "ppo", "sao"])
@pytest.mark.parametrize("policy", ["truncate_oldest", "compact"])
def test_segments_are_accepted_on_a_multi_turn_task(recipe: str, policy: str) -> None:
    # sao is asynchronous: a queued episode carries its segments (checkpointed with it)
    overrides = ["data.task=calculator", f"data.context_policy={policy}"]
    assert build_config(recipe, None, overrides).data.context_policy == policy


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["data.context_policy=compact"], r"^data\.context_policy: compact .*'arithmetic'"),
        ([*CALC[:1], "data.context_policy=compact", "data.summary_tokens=0"], r"^data\.summary_"),
        ([*CALC, "data.summary_tokens=32"], r"^data\.summary_tokens: only .* change nothing"),
        (["data.context_policy=truncate_oldest"], r"^data\.context_policy: .*'arithmetic'"),
        ([*CALC, "data.max_turns=1"], r"^data\.context_policy: .*one turn per episode"),
        ([*CALC, "sampling.group_scope=turn"], r"^sampling\.group_scope: turn .*context_policy"),
        ([*CALC, "feedback.source=reward_model"], r"^feedback\.source: a reward model"),
        (["data.context_policy=drop"], r"data\.context_policy"),
    ],
)
def test_what_cannot_be_segmented_is_refused_in_one_line(
    overrides: list[str], pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern) as info:
        build_config("grpo", None, overrides)
    assert "\n" not in str(info.value)
