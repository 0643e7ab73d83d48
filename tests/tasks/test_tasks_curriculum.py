"""``sampling.curriculum`` on a reasoning-gym task: each level's settings are reasoning-gym's,
the config holds the top level it is evaluated on, each level's prompts come from their own
pool, the level follows the pass rate, and a resume continues it exactly."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlmap.assembly.data import curriculum_levels, labelled_prompts, load_data
from rlmap.assembly.embedded import embedded_tokenizer, warm_start_spec
from rlmap.core.errors import ConfigError
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.recipes.explain import composition
from rlmap.sampling.curriculum import Climb
from rlmap.system import sync
from rlmap.system.loop_state import LoopState
from rlmap.tasks import reasoning_gym as rg

pytest.importorskip("reasoning_gym")

SUMS = ["data.task=reasoning_gym:chain_sum", "sampling.curriculum=true"]


def test_a_level_has_reasoning_gyms_settings() -> None:
    # ChainSumCurriculum: num_terms levels 2..12, num_digits 1..10, a level's range runs
    # from the lowest level's value up to its own (reasoning-gym's "inclusive" mode)
    assert rg.level_args("chain_sum", {}, 0) == {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
    }
    assert rg.level_args("chain_sum", {"allow_negation": True}, 2) == {
        "allow_negation": True,
        "min_terms": 2,
        "max_terms": 4,
        "min_digits": 1,
        "max_digits": 3,
    }
    # level 10: 12 terms; num_digits stops at its level 9 (10 digits)
    assert rg.level_args("chain_sum", {}, 10)["max_terms"] == 12
    assert rg.level_args("chain_sum", {}, 10)["max_digits"] == 10
    assert rg.top_level("chain_sum") == 10


def test_the_config_holds_the_top_levels_settings_and_rebuilds_the_same() -> None:
    cfg = build_config("grpo", None, [*SUMS, "sampling.curriculum_top=2"])
    assert cfg.data.task_args == {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 3}
    assert cfg.feedback.verifier == "reasoning_gym"
    again = build_config("grpo", cfg.model_dump(mode="json"))  # a saved config, reloaded
    assert again == cfg
    assert (
        "G=8 per prompt + curriculum (levels 0→2: up at a pass rate ≥ 0.8, down ≤ 0.2, "
        "over 64)" in composition(cfg)
    )
    highest = build_config("grpo", None, SUMS)  # no top given: the highest, named
    assert highest.sampling.curriculum_top == 10 and highest.data.task_args["max_terms"] == 12
    # training at the top level directly: the same settings, so the same held-out set
    settings = f"data.task_args={json.dumps(cfg.data.task_args)}"
    direct = build_config("grpo", None, ["data.task=reasoning_gym:chain_sum", settings])
    assert load_data(direct)[1] == load_data(cfg)[1]
    assert embedded_tokenizer(direct).get_vocab() == embedded_tokenizer(cfg).get_vocab()
    assert warm_start_spec(direct) == warm_start_spec(cfg)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            ['data.task_args={"max_terms": 5}', "sampling.curriculum_top=2"],
            "data.task_args.max_terms: the curriculum sets it (4 at level 2",
        ),
        (
            ["data.task=reasoning_gym:chain_sum+basic_arithmetic"],
            "each task of a mixture would need its own",
        ),
        (["data.task=arithmetic"], "sampling.curriculum: drives one reasoning-gym task's"),
        (["data.task=reasoning_gym:acre"], "reasoning-gym's acre has no curriculum"),
        (["data.task=reasoning_gym:chain_sun"], "data.task: reasoning-gym has no task"),
        (["system.mode=async"], "use system.mode=sync"),
        (["sampling.curriculum_top=11"], "need 0 <= start <= top <= 10"),
        (["sampling.curriculum_start=3", "sampling.curriculum_top=2"], "got 3 and 2"),
        (["sampling.curriculum_up=0.1"], "need 0 <= down < up <= 1"),
        (["sampling.curriculum_window=0"], "sampling.curriculum_window: must be >= 1"),
        (["sampling.curriculum_top=-1"], "need 0 <= start <= top <= 10"),
        (["data.task=reasoning_gym:chain_sum*3", "sampling.curriculum_top=12"], "top <= 10"),
        (
            ["data.task=reasoning_gym:caesar_cipher"],
            "sampling.curriculum_top: reasoning-gym's caesar_cipher refuses its level 2",
        ),
    ],
)
def test_what_the_curriculum_cannot_run_is_one_line_naming_the_field(
    extra: list[str], says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        build_config("grpo", None, [*SUMS, *extra])
    assert says in str(err.value) and "\n" not in str(err.value)


def _terms(question: str) -> list[str]:
    """The operands of a chain-sum question ("...: 4 - 1 =" -> ["4", "1"])."""
    return re.findall(r"\d+", question.rsplit(":", 1)[1])


def test_each_level_draws_from_its_own_pool_and_none_is_held_out() -> None:
    cfg = build_config("grpo", None, [*SUMS, "sampling.curriculum_top=2", "data.train_size=300"])
    levels = curriculum_levels(cfg)
    assert levels is not None
    train, heldout = load_data(cfg)
    held = {e.prompt for e in heldout}
    assert levels.pool(2) == train  # the top level's pool is training at that level directly
    for level in range(3):
        pool = levels.pool(level)
        assert len(pool) > 100 and not held & {e.prompt for e in pool}  # level 0: 200 sums at most
        assert len({e.prompt for e in pool}) == len(pool)
        terms = [_terms(e.prompt) for e in pool]
        assert max(len(t) for t in terms) == level + 2  # 2 terms at 0, up to 4 at 2
        assert max(len(x) for t in terms for x in t) == level + 1  # digits: 1 at 0, 3 at 2
    # level 0 is 2 one-digit terms, every one of them
    assert all(
        len(t) == 2 and all(len(x) == 1 for x in t)
        for t in (_terms(e.prompt) for e in levels.pool(0))
    )


def _cfg(model: Path, *extra: str):  # type: ignore[no-untyped-def]
    return build_config(
        "grpo",
        None,
        [
            *SUMS,
            f"model.path={model}",
            "sampling.prompts_per_step=2",
            "sampling.group_size=2",
            "generation.max_new_tokens=4",
            "generation.eval_samples=1",
            "data.train_size=200",
            "data.eval_size=4",
            "run.progress=false",
            "run.eval_every=100",
            "optim.micro_batch_size=4",
            "sampling.curriculum_top=4",
            *extra,
        ],
    )


def _levels(run: Path) -> list[tuple[float, ...]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    keys = ("curriculum/level", "curriculum/move", "curriculum/max_terms", "curriculum/max_digits")
    return [tuple(r[k] for k in keys) for r in rows if "curriculum/level" in r]


def test_the_level_climbs_on_its_pass_rate_and_each_step_draws_from_its_level(
    wide_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[list[str]] = []
    real = sync.shared_round

    def every_answer_right(p, examples, first_group):  # type: ignore[no-untyped-def]
        drawn.append([e.prompt for e in examples])
        return [replace(x, outcome=1.0) for x in real(p, examples, first_group)]

    monkeypatch.setattr(sync, "shared_round", every_answer_right)
    # 4 trajectories a step fill the window of 4: a pass rate of 1 moves up every step
    cfg = _cfg(wide_model_dir, "optim.steps=6", "sampling.curriculum_window=4")
    run_training(cfg, tmp_path / "run")
    # level, move, max terms, max digits of each step: up to the top (4), then it holds
    assert _levels(tmp_path / "run") == [
        (0, 1, 2, 1),
        (1, 1, 3, 2),
        (2, 1, 4, 3),
        (3, 1, 5, 4),
        (4, 0, 6, 5),
        (4, 0, 6, 5),
    ]
    levels = curriculum_levels(cfg)
    assert levels is not None
    for step, prompts in enumerate(drawn):
        pool = {e.prompt for e in levels.pool(min(step, 4))}
        assert set(prompts) <= pool


def test_a_collapse_moves_down_and_a_resume_continues_the_level_exactly(
    wide_model_dir: Path, tmp_path: Path, crash_in_step: Callable[..., None]
) -> None:
    # the random model answers (almost) nothing: a pass rate <= 0.5 over a window of 6
    # moves down. 4 a step: step 1 fills 4 of 6, step 2 decides (level 3 -> 2), step 3
    # fills 4, step 4 decides (-> 1). A crash in step 4 resumes from step 3's checkpoint,
    # whose window holds step 3's 4 outcomes: without them, step 4 would not move.
    cfg = _cfg(
        wide_model_dir,
        "optim.steps=5",
        "sampling.curriculum_window=6",
        "sampling.curriculum_start=3",
        "sampling.curriculum_down=0.5",
        "run.checkpoint_every=1",
    )
    run_training(cfg, tmp_path / "straight")
    straight = _levels(tmp_path / "straight")
    assert [(level, move) for level, move, *_ in straight] == [
        (3, 0),
        (3, -1),
        (2, 0),
        (2, -1),
        (1, 0),
    ]
    crash_in_step(cfg, tmp_path / "crashed", 4)
    run_training(cfg, tmp_path / "crashed", resume=True)
    assert _levels(tmp_path / "crashed") == straight


def test_a_saved_loop_state_comes_back_with_its_curriculum() -> None:
    from dataclasses import asdict

    state = LoopState(step=3, cursor=12, climb=Climb(2, (1.0, 0.0)))
    assert LoopState.saved(asdict(state)) == state
    assert LoopState.saved(asdict(LoopState())) == LoopState()


def test_rlmap_tasks_shows_a_tasks_levels() -> None:
    from rlmap.tasks.catalog import describe

    shown = describe("chain_sum")
    assert "curriculum (sampling.curriculum): levels 0-10" in shown
    assert "  2: min_terms=2, max_terms=4, min_digits=1, max_digits=3\n" in shown
    assert "curriculum: none" in describe("acre")


def test_a_weighted_task_is_its_task() -> None:
    cfg = build_config(
        "grpo", None, [*SUMS, "data.task=reasoning_gym:chain_sum*3", "sampling.curriculum_top=1"]
    )
    levels = curriculum_levels(cfg)
    assert levels is not None and levels.name == "chain_sum"
    assert cfg.data.task_args == rg.level_args("chain_sum", {}, 1)


def test_settings_that_are_lists_are_not_logged_as_numbers() -> None:
    # simple_equations' curriculum sets operators_weights, a list: the step must not fail
    cfg = build_config(
        "grpo",
        None,
        [
            "data.task=reasoning_gym:simple_equations",
            "sampling.curriculum=true",
            "sampling.curriculum_top=1",
            "data.train_size=50",
            "data.eval_size=4",
        ],
    )
    levels = curriculum_levels(cfg)
    assert levels is not None
    assert isinstance(levels.settings(0)["operators_weights"], list)
    parts = SimpleNamespace(cfg=cfg, levels=levels)
    state, metrics = sync.climbed(parts, LoopState(), Climb(0), [])  # type: ignore[arg-type]
    assert "curriculum/operators_weights" not in metrics
    assert metrics["curriculum/level"] == 0 and state.climb == Climb(0)
    assert {k for k in metrics if k.startswith("curriculum/")} >= {"curriculum/min_terms"}


def test_the_lower_levels_prompts_are_checked_against_the_context_too() -> None:
    cfg = build_config("grpo", None, [*SUMS, "sampling.curriculum_top=2", "data.train_size=50"])
    labels = [label for label, _ in labelled_prompts(cfg)]
    assert any(
        label.startswith("data.task=reasoning_gym:chain_sum level 0 example") for label in labels
    )
    assert not any(" level 2 " in label for label in labels)  # the top level is the train split
