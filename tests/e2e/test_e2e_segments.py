"""End to end: the calculator task in a context too short for its episodes trains on
segments (``data.context_policy=truncate_oldest``, ``compact``) and logs what it cut."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import always_calling_model

from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.tasks.calculator import END_CALL, TOOL_TOKENS

CONTEXT = 20
"""The model's positions: an episode of four tool calls (8 tokens each with its result,
after a prompt of 5–7) outgrows it at its third turn."""


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_the_calculator_task_trains_on_segments_and_logs_them(
    recipe: str, tmp_path: Path, toy: Callable[..., list[str]], policy_batches: list[Any]
) -> None:
    model_dir = always_calling_model(tmp_path / "model", CONTEXT)
    overrides = [
        *toy(model_dir, steps=1),
        "data.task=calculator",
        "data.max_turns=4",
        "data.context_policy=truncate_oldest",
    ]
    run_training(build_config(recipe, None, overrides), tmp_path / "run")
    records = _records(tmp_path / "run")
    # every episode: prompt P ≤ 7, turns of 1 token + 7 of result. Turn 2 at P + 8 fits
    # (P + 8 + 4 ≤ 20), turn 3 at P + 16 does not: a new segment from the prompt and the
    # newest pair (8), whose next turn again does not fit: 3 segments, 8 + 8 dropped
    step = records[-1]
    assert step["env/segments"] == 3.0 and step["env/context_dropped_tokens"] == 16.0
    assert step["eval/segments"] == 3.0 and records[0]["eval/segments"] == 3.0
    assert "loss/policy" in step
    (batch,) = policy_batches
    n = 2 * 4  # prompts_per_step × group_size episodes, each three rows
    assert batch.size == 3 * n
    assert batch.segment.tolist() == [0, 1, 2] * n
    # each row: a context that fit, its turn, and (as under fail) the final observation
    result = 7  # <result> e r r o r </result>
    assert batch.attention_mask.sum(-1).max() <= CONTEXT + result


def test_compact_trains_the_summaries_the_policy_writes(
    tmp_path: Path, toy: Callable[..., list[str]], policy_batches: list[Any]
) -> None:
    context = 48
    model_dir = always_calling_model(tmp_path / "model", context)
    overrides = [
        *toy(model_dir, steps=1),
        "data.task=calculator",
        "data.max_turns=8",
        "data.context_policy=compact",
        "data.summary_tokens=6",
    ]
    cfg = build_config("grpo", None, overrides)
    run_training(cfg, tmp_path / "run")
    step = _records(tmp_path / "run")[-1]
    # every turn is the one token </calc> (a stop token): so is every summary. A turn and a
    # summary need 4 + 9 (the lead, "summary: ") + 6 = 19 positions: a segment closes once
    # its context is over 48 − 19 = 29, after 3 or 4 calls of 8 tokens from a prompt of 5-7
    assert step["env/summary_tokens"] >= 1.0 and step["env/segments"] >= 2.0
    assert step["eval/summary_tokens"] >= 1.0 and "loss/policy" in step
    tokenizer = build_tokenizer(extra_tokens=TOOL_TOKENS)
    lead = tokenizer.encode("summary: ", add_special_tokens=False)
    close = int(tokenizer.convert_tokens_to_ids(END_CALL))
    (batch,) = policy_batches
    trained = 0
    for row, actions in zip(batch.tokens.tolist(), batch.action_mask.tolist(), strict=True):
        for j in range(len(row) - len(lead)):
            if row[j : j + len(lead)] == lead and j + len(lead) < len(row):
                k = j + len(lead)
                # after the lead (context, untrained): the summary, an action trained on
                assert not any(actions[j:k]) and row[k] == close
                trained += actions[k]
    assert trained >= batch.size // 2  # each closing segment's summary, at least
    assert batch.attention_mask.sum(-1).max() <= context + 7  # + the final observation
