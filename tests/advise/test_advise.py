"""`rlmap advise`: the selection table's seven rows, the six questions, the emitted config."""

from __future__ import annotations

import builtins
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from rlmap import correction, estimators, feedback, reduction, sampling
from rlmap.advise.advice import (
    DISCLAIMER,
    FEEDBACK,
    Advice,
    advise,
    config_yaml,
    emit_config,
    render,
)
from rlmap.advise.prompts import ask_profile
from rlmap.assembly.available import refuse_unavailable
from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config, composition, load_config, registry
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.selection import (
    FALLBACKS,
    TABLE,
    Row,
    TaskProfile,
    Verifier,
    table_markdown,
)

Toy = Callable[..., list[str]]
DOCS = Path(__file__).parents[2] / "docs" / "advise.md"


@dataclasses.dataclass(frozen=True)
class Expected:
    """A row of the source's selection table, translated by hand, and its rlmap set-up."""

    profile: TaskProfile
    baseline: str
    next_change: str
    must_not_ignore: tuple[str, ...]
    recipe: str
    overrides: tuple[str, ...]


# One profile per row, each meeting only that row's condition and, for rows 3-5 on the
# default task, row 1's.
ROWS = {
    1: Expected(
        TaskProfile(),
        "RLOO / GRPO",
        "DAPO-style sampling/reduction",
        ("all-equal groups", "total rollout tokens"),
        "rloo",
        (),
    ),
    2: Expected(
        TaskProfile(response_length=8000, critic_unstable=True, cheap_samples=False),
        "PPO + GAE",
        "VAPO-style critic/λ design",
        ("value calibration", "the definition of length"),
        "ppo",
        (),
    ),
    3: Expected(
        TaskProfile(rare_correct=True),
        "group sampling / curriculum",
        "positive NLL, search, data rebalancing",
        ("verifier loopholes", "prompt coverage"),
        "grpo",
        ("sampling.group_size=16",),
    ),
    4: Expected(
        TaskProfile(moe_routing_mismatch=True),
        "a small synchronous experiment",
        "R3 + probability correction",
        ("router metadata", "objective shift"),
        "rloo",
        ("system.mode=sync", "behaviour.mode=decoupled"),
    ),
    5: Expected(
        TaskProfile(separate_rollout=True),
        "record the real behaviour",
        "TIS/IcePop or direct correction",
        ("processor", "support", "staleness"),
        "rloo",
        ("behaviour.mode=decoupled",),
    ),
    6: Expected(
        TaskProfile(multi_turn=True, barrier="severe"),
        "single-rollout actor–critic",
        "SAO-style async",
        ("selection bias", "critic cold start"),
        "ppo",
        ("sampling.group_size=1", "data.task=calculator"),
    ),
    7: Expected(
        TaskProfile(long_context=True, cheap_samples=False),
        "segment/turn value baseline",
        "learned compaction",
        ("state sufficiency", "credit across segments"),
        "ppo",
        ("credit.time_unit=turn", "data.context_policy=truncate_oldest"),
    ),
}

QUESTIONS = (
    "Is the feedback reliable?",
    "How many trajectories can each state afford?",
    "How far must credit travel?",
    "Which distribution really produces the data?",
    "In what unit is the loss reduced?",
    "Can the system afford a synchronous barrier, or must it drift?",
)


def _row_block(text: str, number: int) -> str:
    """The printed block of table row ``number`` (up to the next row or the baseline)."""
    start = text.index(f"  row {number}: ")
    ends = [text.find(marker, start + 1) for marker in ("\n  row ", "\n  no row ", "\n\n")]
    return text[start : min(e for e in ends if e != -1)]


@pytest.mark.parametrize("number", sorted(ROWS))
def test_each_table_row_gives_its_answer(number: int) -> None:
    want = ROWS[number]
    advice = advise(want.profile)
    row = next(r for r in advice.rows if r.number == number)
    assert (row.baseline, row.next_change) == (want.baseline, want.next_change)
    assert tuple(w.item for w in row.must_not_ignore) == want.must_not_ignore
    assert advice.recipe == want.recipe
    assert set(want.overrides) <= set(advice.overrides)
    # rows 4 and 5 never supply the recipe; every other row is the base of its own profile
    assert (advice.base.number == number) == (number not in (4, 5))
    block = _row_block(render(advice), number)
    for text in (want.baseline, want.next_change, *want.must_not_ignore):
        assert text in block, text


def test_each_profile_meets_only_its_own_row_besides_row_1() -> None:
    # Rows 3-5 on the default task (single-turn, exact verifier, cheap samples) also meet
    # row 1; no profile may lean on any other row.
    for number, want in ROWS.items():
        matched = [r.number for r in advise(want.profile).rows]
        assert matched == ([1, number] if number in (3, 4, 5) else [number]), number


def test_the_six_questions_come_in_order_with_a_reason_each() -> None:
    advice = advise(TaskProfile())
    assert [a.question for a in advice.answers] == list(QUESTIONS)
    assert all(a.answer and a.reason for a in advice.answers)
    text = render(advice)
    positions = [text.index(f"  {i}. {q}") for i, q in enumerate(QUESTIONS, 1)]
    assert positions == sorted(positions) and positions[-1] < text.index("The selection table")


def test_answers_follow_the_task() -> None:
    group = {a.question: a.answer for a in advise(TaskProfile()).answers}
    agent = {a.question: a.answer for a in advise(ROWS[6].profile).answers}
    assert group[QUESTIONS[1]].startswith("G = 8 per prompt")
    assert agent[QUESTIONS[1]].startswith("one trajectory per state")
    assert group[QUESTIONS[4]].startswith("response_mean") and agent[QUESTIONS[4]].startswith(
        "token_mean"
    )
    engine = {a.question: a.answer for a in advise(ROWS[5].profile).answers}
    assert "separate rollout engine" in engine[QUESTIONS[3]]
    turns = {a.question: a.answer for a in advise(ROWS[7].profile).answers}
    assert turns[QUESTIONS[2]].startswith("gae per turn")


def test_the_2026_corrections_are_named_where_the_table_points() -> None:
    # Row 5 (a separate engine: ratio tails from mismatch) names M2PO, DPPO on μ and the
    # kept-set replay; a severe barrier (asynchrony: stale batches) names M2PO and DPPO; a
    # task with neither names none of them.
    def reasons(profile: TaskProfile) -> dict[str, str]:
        return {a.question: a.reason for a in advise(profile).answers}

    engine = reasons(ROWS[5].profile)[QUESTIONS[3]]
    for name in ("m2po", "dppo_tv", "behaviour.replay_sampling_set"):
        assert name in engine, name
    assert "m2po" in reasons(ROWS[6].profile)[QUESTIONS[5]]
    plain = reasons(TaskProfile())
    assert not any(n in plain[QUESTIONS[3]] + plain[QUESTIONS[5]] for n in ("m2po", "dppo"))


def test_first_is_not_a_verdict_in_the_text_and_the_file() -> None:
    advice = advise(TaskProfile())
    assert "not a verdict" in DISCLAIMER
    assert " ".join(render(advice).split()).endswith(DISCLAIMER)
    header = " ".join(line[2:] for line in config_yaml(advice).splitlines() if line[:2] == "# ")
    assert DISCLAIMER in header


def test_precedence_when_several_rows_hold() -> None:
    both = advise(TaskProfile(response_length=8000, critic_unstable=True))  # rows 1 and 2
    assert [r.number for r in both.rows] == [1, 2] and both.base.number == 2
    agent = advise(TaskProfile(multi_turn=True, barrier="severe", rare_correct=True))
    assert [r.number for r in agent.rows] == [3, 6] and agent.recipe == "ppo"
    assert "sampling.group_size=1" in agent.overrides  # row 6's, not row 3's G = 16


def test_a_task_no_row_names_a_recipe_for_gets_a_marked_fallback() -> None:
    advice = advise(TaskProfile(multi_turn=True, separate_rollout=True))  # only row 5 holds
    assert [r.number for r in advice.rows] == [5]
    assert advice.base.number is None and advice.recipe == "rloo"
    assert "data.task=calculator" in advice.overrides and "behaviour.mode=decoupled" in (
        advice.overrides
    )
    assert "no row names a recipe (fallback, not the table)" in render(advice)


def _profiles() -> Iterator[TaskProfile]:
    for want in ROWS.values():
        yield want.profile
        for verifier in get_args(Verifier):
            yield dataclasses.replace(want.profile, verifier=verifier)
    yield TaskProfile(multi_turn=True)  # fallback: cheap samples
    yield TaskProfile(multi_turn=True, cheap_samples=False)  # fallback: one per state
    yield TaskProfile(verifier="reward-model")  # fallback: learned reward model


def test_emitted_config_loads_for_every_row_and_verifier(tmp_path: Path) -> None:
    for i, profile in enumerate(_profiles()):
        advice = advise(profile)
        path = tmp_path / f"advice{i}.yaml"
        path.write_text(config_yaml(advice))
        cfg = load_config(path)
        assert cfg == advice.config, profile
        assert cfg.recipe == advice.recipe and emit_config(profile)["recipe"] == advice.recipe
        # contexts past the window are episodes of many turns: segments drop whole turns
        assert cfg.data.multi_turn == (profile.multi_turn or profile.long_context)
        if advice.refused is None:
            refuse_unavailable(cfg)  # trainable: the same check `rlmap train` runs
        elif advice.closest is not None:
            recipe, overrides = advice.closest
            refuse_unavailable(build_config(recipe, None, overrides))  # that one is trainable


def test_every_base_names_a_recipe_and_rows_4_and_5_do_not() -> None:
    assert [r.number for r in TABLE] == [1, 2, 3, 4, 5, 6, 7]
    assert [r.number for r in TABLE if r.preset is None] == [4, 5]
    assert all(r.preset is not None and r.number is None for r in FALLBACKS)
    assert FALLBACKS[-1].applies(TaskProfile(cheap_samples=False))  # the last always holds


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        (TaskProfile(verifier="none"), "feedback.source: "),
    ],
)
def test_an_untrainable_baseline_says_so_and_names_the_closest(
    profile: TaskProfile, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every source trains today; a build without environment returns stands in for one
    # that cannot (the advisor asks the same check `rlmap train` runs).
    import rlmap.advise.advice as advise_module

    def refuse(cfg: Any) -> None:
        if cfg.feedback.source == "environment":
            raise ConfigError("feedback.source: 'environment' is not available in rlmap yet")

    monkeypatch.setattr(advise_module, "refuse_unavailable", refuse)
    advice = advise(profile)
    assert advice.refused is not None and advice.refused.startswith(field)
    assert advice.closest is not None
    recipe, overrides = advice.closest
    # the same baseline without the refused field's override, nothing else dropped
    assert recipe == advice.recipe
    assert overrides == tuple(o for o in advice.overrides if not o.startswith("feedback.source="))
    closest = "Closest trainable baseline: rlmap train --recipe " + " ".join([recipe, *overrides])
    for text in (render(advice), config_yaml(advice)):
        flat = " ".join(line.removeprefix("#") for line in text.splitlines()).split()
        assert "Not trainable here: " + advice.refused in " ".join(flat)
        assert closest in " ".join(flat)


def test_a_refused_preset_is_said_and_no_untrainable_neighbour_is_offered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A build that refuses critics: ppo itself is refused, and no override of the advice is
    # to blame, so there is no closest trainable baseline to name (the old table offered
    # ppo for ppo, refused the same way).
    import rlmap.advise.advice as advise_module

    def refuse(cfg: Any) -> None:
        if cfg.critic.enabled:
            raise ConfigError("critic.enabled: no critic in this build")

    monkeypatch.setattr(advise_module, "refuse_unavailable", refuse)
    advice = advise(ROWS[2].profile)  # row 2: ppo
    assert advice.refused == "critic.enabled: no critic in this build"
    assert advice.closest is None
    for text in (render(advice), config_yaml(advice)):
        flat = " ".join(" ".join(line.removeprefix("#") for line in text.splitlines()).split())
        assert "Not trainable here: critic.enabled: no critic in this build." in flat
        assert "Closest trainable baseline" not in flat


def test_the_reward_model_fallback_is_classic_rlhf() -> None:
    advice = advise(TaskProfile(verifier="reward-model", cheap_samples=False))
    assert advice.base.number is None and advice.recipe == "classic-rlhf"
    assert advice.refused is None and advice.closest is None  # trainable: it has an RM


def _records(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train_emitted(profile: TaskProfile, model: Path, toy: list[str], tmp_path: Path) -> Advice:
    advice = advise(profile)
    path = tmp_path / "advice.yaml"
    path.write_text(config_yaml(advice))
    cfg = load_config(path, toy)
    run_training(cfg, tmp_path / "run")
    assert [r["step"] for r in _records(tmp_path / "run")] == [0, 1, 2]
    return advice


def test_row_1_emitted_config_trains(tiny_model_dir: Path, tmp_path: Path, toy: Toy) -> None:
    advice = _train_emitted(ROWS[1].profile, tiny_model_dir, toy(tiny_model_dir), tmp_path)
    assert advice.recipe == "rloo"
    assert "loss/policy" in _records(tmp_path / "run")[-1]


def test_row_6_emitted_config_trains_one_episode_per_prompt_with_a_critic(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    # Keep the emitted single rollout (toy() would set G = 4) and give the tool a turn.
    overrides = [o for o in toy(tiny_calc_model_dir) if not o.startswith("sampling.group_size")]
    overrides += ["data.max_turns=2", "generation.max_new_tokens=6"]
    _train_emitted(ROWS[6].profile, tiny_calc_model_dir, overrides, tmp_path)
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "group_size: 1\n" in config and "task: calculator\n" in config
    last = _records(tmp_path / "run")[-1]
    assert "critic/value_loss" in last and "env/turns" in last and "loss/policy" in last


def test_cli_prints_the_answer_and_writes_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent.yaml"
    assert main(["advise", "--multi-turn", "--barrier", "severe", "--emit-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "row 6: multi-turn agent, severe group barrier" in out
    assert "rlmap train --recipe ppo sampling.group_size=1 data.task=calculator" in out
    assert f"rlmap train --config {path}" in out
    assert load_config(path).sampling.group_size == 1


def test_cli_rejects_unknown_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--verifier", "regex"]) == 2  # a usage error: one line, no exit
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'regex'" in err
    assert main(["advise", "--response-length", "0"]) == 2
    assert capsys.readouterr().err == "rlmap: error: --response-length: must be >= 1, got 0\n"
    for verifier in get_args(Verifier):  # the CLI offers exactly the profile's kinds
        assert main(["advise", "--verifier", verifier]) == 0
    capsys.readouterr()


class _Terminal:
    def isatty(self) -> bool:
        return True


def _scripted(answers: list[str], asked: list[str]) -> Callable[[str], str]:
    def ask(prompt: str) -> str:
        asked.append(prompt)
        if not answers:
            raise EOFError
        return answers.pop(0)

    return ask


def test_interactive_mode_asks_when_stdin_is_a_terminal_and_no_flag_is_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[str] = []
    # verifier, cheap samples, rare correct, multi-turn; Enter for the rest but the barrier
    answers = ["", "", "", "y", "", "", "", "", "", "severe"]
    monkeypatch.setattr(sys, "stdin", _Terminal())
    monkeypatch.setattr(builtins, "input", _scripted(answers, asked))
    assert main(["advise"]) == 0
    assert len(asked) == 10 and asked[0].startswith("[1] ") and asked[-1].startswith("[6] ")
    assert "row 6: multi-turn agent, severe group barrier" in capsys.readouterr().out
    asked.clear()
    assert main(["advise", "--rare-correct"]) == 0  # a flag given: no questions
    assert asked == [] and "row 3: " in capsys.readouterr().out


def test_without_a_terminal_no_question_is_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(prompt: str) -> str:
        raise AssertionError("asked without a terminal")

    monkeypatch.setattr(builtins, "input", refuse)
    assert main(["advise"]) == 0
    assert "row 1: " in capsys.readouterr().out


def test_ask_profile_reasks_bad_answers_and_keeps_defaults_on_enter_or_eof(
    capsys: pytest.CaptureFixture[str],
) -> None:
    asked: list[str] = []
    profile = ask_profile(_scripted(["regex", "math", "maybe", "n", "", "", "lots", "9000"], asked))
    assert profile == TaskProfile(verifier="math", cheap_samples=False, response_length=9000)
    assert len(asked) == 9  # 6 prompts, 3 of them asked twice; end of input at the 7th
    assert "answer one of: exact, math" in capsys.readouterr().out
    assert ask_profile(_scripted([], [])) == TaskProfile()


def test_profile_rejects_values_the_flags_would_reject() -> None:
    with pytest.raises(ConfigError, match=r"^--verifier: unknown kind 'regex'"):
        TaskProfile(verifier="regex")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^--barrier: "):
        TaskProfile(barrier="awful")  # type: ignore[arg-type]


def test_docs_include_the_table_as_implemented() -> None:
    assert table_markdown() in DOCS.read_text()


def test_advise_moe_names_routing_replay_that_rlmap_can_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rlmap.cli import main

    assert main(["advise", "--moe"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the renderer wraps lines
    assert "row 4: MoE whose expert routing differs" in out
    assert "behaviour.routing_replay=true" in out and "model.path=embedded:tiny-moe" in out


def test_row_3_names_a_curriculum_and_rebalancing_that_rlmap_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["advise", "--rare-correct"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the renderer wraps lines
    assert "row 3: correct samples are extremely rare" in out
    assert "sampling.curriculum=true" in out and "sampling.rebalance=true" in out
    # both build: the baseline's overrides plus the curriculum on a reasoning-gym task
    row = next(r for r in TABLE if r.number == 3)
    pytest.importorskip("reasoning_gym")
    both = [
        "data.task=reasoning_gym:chain_sum",
        "sampling.curriculum=true",
        "sampling.rebalance=true",
    ]
    cfg = build_config(row.preset, None, [*row.overrides, *both])
    assert cfg.sampling.curriculum and cfg.sampling.rebalance and cfg.sampling.group_size == 16


# --- every "in rlmap" sentence checked against what rlmap has --------------------------------

_SECTIONS = tuple(RecipeConfig.model_fields)
_SETTING = re.compile(rf"(?<![\w.])((?:{'|'.join(_SECTIONS)})\.[a-z_]+)=([^\s,;)]*[^\s,;):.])")
"""``section.field=value`` in prose; the value ends before a space or punctuation."""
_FIELD = re.compile(rf"(?<![\w.])((?:{'|'.join(_SECTIONS)})\.[a-z_]+)")
_NEGATIVE = re.compile(
    r"\b(cannot|can't|not yet|yet|not in rlmap|outside rlmap|rlmap does not|rlmap has no"
    r"|not supported|unsupported|not available|not built|lacks)\b",
    re.IGNORECASE,
)

NOT_IN_RLMAP = {
    "segment contexts": ("segment",),
    "search": ("search", "mcts"),
}
"""What the texts may say rlmap lacks, each with fragments that no config field, component
or preset of rlmap contains (checked below): a claim stays only while it holds."""


def _config_fields() -> set[str]:
    dumped = RecipeConfig().model_dump()
    fields = {
        f"{section}.{name}"
        for section, body in dumped.items()
        if isinstance(body, dict)
        for name in body
    }
    return fields | {section for section, body in dumped.items() if not isinstance(body, dict)}


def _rlmap_names() -> set[str]:
    """Every name rlmap answers to: config fields, components of every axis, presets."""
    registries = (
        feedback.registry,
        sampling.registry,
        estimators.registry,
        correction.registry,
        correction.corrections,
        correction.kl_estimators,
        reduction.registry,
        registry,
    )
    return _config_fields() | {name for r in registries for name in r.names()}


def _presets_in(text: str) -> set[str]:
    return {
        name
        for name in registry.names()
        if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
    }


def _in_rlmap_texts(row: Row) -> list[str]:
    """The row's "in rlmap" texts, each led by the table words it answers (so "not in
    rlmap" says what is not)."""
    return [f"{row.baseline}: {row.baseline_in_rlmap}", f"{row.next_change}: {row.next_in_rlmap}"]


def _checked_sentences() -> list[tuple[Row | None, str]]:
    """Every sentence of advise that says what rlmap has, and explain's notes."""
    texts: list[tuple[Row | None, str]] = []
    for row in (*TABLE, *FALLBACKS):
        texts += [(row, t) for t in _in_rlmap_texts(row)]
        texts += [(row, w.how) for w in row.must_not_ignore]
    texts += [(None, f.note) for f in FEEDBACK.values()]
    texts += [(None, registry.get(n).note) for n in registry.names()]
    texts += [(None, registry.get(n).summary) for n in registry.names()]
    return [(row, s) for row, text in texts for s in re.split(r";\s|\.\s", text) if s]


BASES = tuple(dict.fromkeys(r.preset for r in (*TABLE, *FALLBACKS) if r.preset))
"""Every recipe an advice can start from: what rows 4 and 5 qualify."""


def _presets_of(row: Row | None) -> tuple[str, ...]:
    return (row.preset,) if row is not None and row.preset else BASES


@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"row{r.number}")
def test_every_setup_a_row_names_builds_and_trains_here(row: Row) -> None:
    for setup in row.named:
        for name in (setup.preset,) if setup.preset else BASES:
            if "data.task=reasoning_gym:chain_sum" in setup.overrides:
                pytest.importorskip("reasoning_gym")
            cfg = build_config(name, None, setup.overrides)  # validation: raises if refused
            refuse_unavailable(cfg)  # and the check `rlmap train` runs before anything


@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"row{r.number}")
def test_the_in_rlmap_texts_name_only_the_rows_setups(row: Row) -> None:
    text = f"{row.baseline_in_rlmap} {row.next_in_rlmap}"
    held = {o for setup in row.named for o in setup.overrides}
    for key, value in _SETTING.findall(text):
        if re.fullmatch(r"[A-Z]", value):  # a placeholder (level L): the key must be held
            assert any(o.startswith(f"{key}=") for o in held), (row.number, key)
        else:
            assert f"{key}={value}" in held, (row.number, f"{key}={value}")
    assert _presets_in(text) <= {s.preset for s in row.named}, row.number


def test_every_config_field_a_text_names_exists() -> None:
    fields = _config_fields()
    for _, sentence in _checked_sentences():
        for name in _FIELD.findall(sentence):
            assert name in fields, (name, sentence)


def test_no_sentence_says_rlmap_lacks_what_it_has() -> None:
    names = _rlmap_names()
    for fragments in NOT_IN_RLMAP.values():  # each listed lack still holds
        assert not [n for n in names for f in fragments if f in n.lower()], fragments
    for row, sentence in _checked_sentences():
        if not _NEGATIVE.search(sentence):
            continue
        # a negative claim is about something listed as lacking ...
        assert any(lack in sentence for lack in NOT_IN_RLMAP), sentence
        # ... and whatever preset or setting it names must really be refused
        for name in _presets_in(sentence):
            with pytest.raises(ConfigError):
                refuse_unavailable(build_config(name, None, ()))
        for key, value in _SETTING.findall(sentence):
            for name in _presets_of(row):
                with pytest.raises(ConfigError):
                    refuse_unavailable(build_config(name, None, [f"{key}={value}"]))


def test_row_6_says_that_sao_trains_and_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--multi-turn", "--barrier", "severe"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cannot train" not in out
    assert "sao (asynchronous queue" in out and "system.backend=ray" in out


def test_advise_recommends_bfloat16_on_a_gpu() -> None:
    # issue 28: bf16 autocast over fp32 master weights is the GPU setting; advise says so,
    # with settings the config accepts.
    from rlmap.advise.advice import TaskProfile, advise, render
    from rlmap.recipes import build_config

    text = " ".join(render(advise(TaskProfile())).split())
    assert "system.train_dtype=bfloat16 system.rollout_dtype=bfloat16" in text
    build_config("grpo", None, ["system.train_dtype=bfloat16", "system.rollout_dtype=bfloat16"])


def test_row_7_segments_past_the_window_but_not_under_a_reward_model() -> None:
    # segments (docs/formulas.md §2.5) on the multi-turn task: the row's own set-up
    segmented = advise(TaskProfile(long_context=True))
    assert segmented.config.data.context_policy == "truncate_oldest"
    assert segmented.config.data.multi_turn and segmented.refused is None
    assert "segments past the window" in composition(segmented.config)
    # a reward model reads the whole episode, which segments let outgrow its context: the
    # advice leaves them off and says so, rather than a config `rlmap train` refuses
    scored = advise(TaskProfile(long_context=True, verifier="reward-model"))
    assert scored.config.data.context_policy == "fail"
    assert scored.config.feedback.source == "reward_model"
    assert any("data.context_policy stays fail" in note for note in scored.notes)


def test_explain_names_the_context_policy_and_its_summary_budget() -> None:
    from rlmap.recipes import build_config

    calc = ["data.task=calculator", "credit.time_unit=turn"]
    cut = composition(build_config("ppo", None, [*calc, "data.context_policy=truncate_oldest"]))
    assert "oldest whole turns dropped" in cut and "bootstraps V(next segment)" in cut
    cfg = build_config("grpo", None, [*calc[:1], "data.context_policy=compact"])
    line = composition(cfg)
    assert "the policy's summary of ≤ 16 tokens carried, trained" in line
    assert "a boundary is a truncation: episode return" in line  # grpo: no critic
    assert "segments past the window" not in composition(build_config("grpo", None, calc[:1]))


def test_multi_turn_advice_names_the_group_scopes_that_compare_later_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rlmap.recipes import build_config

    assert main(["advise", "--multi-turn"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    scopes = re.findall(r"sampling\.group_scope=(\w+)", out)
    assert {"turn", "branch"} <= set(scopes)
    for scope in ("turn", "branch"):  # both train on rlmap's multi-turn task
        build_config("rloo", None, ["data.task=calculator", f"sampling.group_scope={scope}"])
    capsys.readouterr()
    assert main(["advise"]) == 0  # one turn: no scope to name
    assert "group_scope" not in capsys.readouterr().out
