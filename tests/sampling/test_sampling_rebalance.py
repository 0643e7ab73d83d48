"""Prompt rebalancing (:mod:`rlmap.sampling.rebalance`): the bookkeeping by hand, the keep
rule, and a run whose skips reach the ledger and whose resume is exact. The loop's draw
(revisits first, the cursor past the skipped ones) is in tests/system/test_system_sync.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.sampling.rebalance import Visits, kept, visited

RULE = {"after": 2, "keep": 0.25}


def test_visits_by_hand() -> None:
    groups = [
        ("a", [0.0, 0.0]),
        ("b", [1.0, 1.0]),
        ("c", [0.0, 1.0, 0.0, 0.0]),
        ("d", [1.0, 0.0]),
        ("e", []),
    ]
    v = visited(Visits(), groups, rare=0.25)
    # a, b uniform: count 1; c: 1/4 = 0.25 <= rare, a rare success; d: 1/2, neither;
    # e: no valid trajectory, says nothing
    assert v == Visits((("a", 1), ("b", 1)), ("c",))
    v = visited(v, [("a", [0.0, 0.0]), ("b", [1.0, 0.0]), ("c", [0.0, 1.0, 0.0, 0.0])], rare=0.25)
    # a: 2 in a row; b's mixed group clears its count; c is queued once only
    assert v == Visits((("a", 2),), ("c",))
    # reasoning_gym_partial: 0.5 and 0.5 are not uniform (neither all 0 nor all >= 1), and
    # no success either: a rare success counts full scores, 1 of 4 here (1/4 <= 0.25)
    assert visited(Visits(), [("p", [0.5, 0.5])], rare=0.25) == Visits()
    assert visited(Visits(), [("p", [0.1, 0.1, 0.1, 0.1])], rare=0.25) == Visits()
    assert visited(Visits(), [("p", [1.0, 0.5, 0.5, 0.5])], rare=0.25) == Visits((), ("p",))


def test_only_a_stale_prompt_is_skipped_and_at_the_rate_asked() -> None:
    v = Visits((("stale", 2), ("once", 1)))
    assert all(kept(v, p, k, 0, **RULE) for p in ("fresh", "once") for k in range(200))
    kept_ = sum(kept(v, "stale", k, 0, **RULE) for k in range(4000))
    assert 850 < kept_ < 1150  # Binomial(4000, 0.25): mean 1000, sd 27
    assert [kept(v, "stale", k, 7, **RULE) for k in range(50)] == [
        kept(v, "stale", k, 7, **RULE) for k in range(50)
    ]  # a function of seed and position
    assert all(kept(v, "stale", k, 0, after=2, keep=1.0) for k in range(100))


def _rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    timing = (
        "system/",
        "budget/wall_clock_s",
        "budget/rollout_s",
        "budget/actor_s",
        "budget/critic_s",
        "budget/reference_s",
    )
    return [{k: v for k, v in r.items() if not k.startswith(timing)} for r in rows]


def test_a_run_skips_stale_prompts_counts_them_and_resumes_exactly(
    tiny_model_dir: Path,
    tmp_path: Path,
    crash_in_step: Callable[..., None],
    toy: Callable[..., list[str]],
) -> None:
    # 4 training prompts, 2 a step: each is visited every other step. The random model
    # answers nothing, so every group is all wrong: after 2 visits (4 steps) all are stale
    # and from then on most are skipped
    cfg = build_config(
        "grpo",
        None,
        [
            *toy(tiny_model_dir, steps=8),
            "data.train_size=4",
            "sampling.rebalance=true",
            "run.eval_every=4",
        ],
    )
    run_training(cfg, tmp_path / "straight")
    rows = [r for r in _rows(tmp_path / "straight") if "sampling/skipped" in r]
    assert [r["sampling/skipped"] for r in rows[:4]] == [0, 0, 0, 0]
    assert sum(r["sampling/skipped"] for r in rows[4:]) > 0
    assert rows[-1]["sampling/stale_prompts"] == 4
    assert rows[-1]["budget/skipped_prompts"] == sum(r["sampling/skipped"] for r in rows)
    ledger = json.loads((tmp_path / "straight" / "ledger.json").read_text())
    assert ledger["skipped_prompts"] == rows[-1]["budget/skipped_prompts"]
    crash_in_step(cfg, tmp_path / "crashed", 6)
    run_training(cfg, tmp_path / "crashed", resume=True)
    assert _rows(tmp_path / "crashed") == _rows(tmp_path / "straight")


@pytest.mark.parametrize(
    ("recipe", "extra", "says"),
    [
        ("ppo", ["sampling.group_size=1"], "sampling.rebalance: tells a uniform group"),
        ("grpo", ["system.mode=async"], "sampling.rebalance: it draws the prompts"),
        ("grpo", ["sampling.rebalance_after=0"], "sampling.rebalance_after: must be >= 1"),
        ("grpo", ["sampling.rebalance_keep=0"], "sampling.rebalance_keep: must be in (0, 1]"),
        ("grpo", ["sampling.rebalance_rare=1"], "sampling.rebalance_rare: must be in (0, 1)"),
    ],
)  # ppo: a recipe that takes G = 1
def test_what_rebalancing_cannot_run_is_one_line_naming_the_field(
    recipe: str, extra: list[str], says: str
) -> None:
    from rlmap.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        build_config(recipe, None, ["sampling.rebalance=true", *extra])
    assert says in str(err.value) and "\n" not in str(err.value)
