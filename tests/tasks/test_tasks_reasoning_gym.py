"""reasoning-gym tasks: parsing ``data.task``, disjoint splits, scoring by the task's own
``score_answer`` (in the isolation worker), per-task evaluation, and a short training run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlmap.assembly.checks import check_inputs
from rlmap.assembly.data import load_data
from rlmap.assembly.embedded import embedded_tokenizer, warm_start_spec
from rlmap.assembly.environments import environment_factory, make_verifier
from rlmap.core.batch import RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.embedded import warmstart
from rlmap.embedded.tiny import TinySpec
from rlmap.embedded.warmstart import PRINTABLE, chat_tokenizer, task_tokenizer
from rlmap.feedback.isolation import IsolatedVerifier
from rlmap.feedback.reasoning_gym import score, score_full
from rlmap.recipes import build_config
from rlmap.rollout.evaluate import per_task
from rlmap.tasks import reasoning_gym as rg
from rlmap.tasks.arithmetic import Example

pytest.importorskip("reasoning_gym")

SMALL = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}
SMALL_SUMS = ["data.task=reasoning_gym:chain_sum", f"data.task_args={json.dumps(SMALL)}"]


def test_a_task_and_a_weighted_mixture_parse() -> None:
    (one,) = rg.parse("reasoning_gym:chain_sum", {"min_terms": 2})
    assert (one.name, one.weight, dict(one.args)) == ("chain_sum", 1.0, {"min_terms": 2})
    a, b = rg.parse("reasoning_gym:chain_sum*3+basic_arithmetic", {"chain_sum": {"max_terms": 3}})
    assert (a.name, a.weight, dict(a.args)) == ("chain_sum", 3.0, {"max_terms": 3})
    assert (b.name, b.weight, dict(b.args)) == ("basic_arithmetic", 1.0, {})


@pytest.mark.parametrize(
    ("task", "args", "says"),
    [
        ("reasoning_gym:chain_sun", None, "no task 'chain_sun' (closest: chain_sum"),
        ("reasoning_gym:chain_sum*0", None, "weight of 'chain_sum' must be > 0"),
        ("reasoning_gym:chain_sum+chain_sum", None, "appears twice"),
        ("reasoning_gym:chain_sum+gcd", {"min_terms": 2}, "keyed by task name; 'min_terms'"),
        ("reasoning_gym:chain_sum", {"bogus": 1}, "chain_sum refuses its settings"),
        ("reasoning_gym:chain_sum", {"min_terms": 5, "max_terms": 2}, "max_terms must be >="),
        ("reasoning_gym:chain sum", None, "is not NAME or NAME*WEIGHT"),
    ],
)
def test_a_bad_task_is_one_line_naming_the_field(task: str, args: dict | None, says: str) -> None:
    with pytest.raises(ConfigError, match=r"^data\.task(_args)?: .*" + _escaped(says)):
        rg.parse(task, args)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_mixture_counts_follow_the_weights() -> None:
    # 10 items, weights 3:1 → 7.5 and 2.5 → floors 7 and 2, the one left goes to the first
    # of the tied remainders → 8, 2. Three equal weights for 5 → 1.67 each → 1, 1, 1 + 2 → 2, 2, 1
    parts = rg.parse("reasoning_gym:chain_sum*3+gcd", None)
    assert rg._counts(parts, 10) == [8, 2]
    three = rg.parse("reasoning_gym:chain_sum+gcd+lcm", None)
    assert rg._counts(three, 5) == [2, 2, 1]
    train, heldout = rg.make_splits("reasoning_gym:chain_sum*3+gcd", None, 0, 40, 8)
    assert [e.task for e in heldout].count("chain_sum") == 6  # 3:1 of 8, none repeated
    assert {e.task for e in train} == {"chain_sum", "gcd"}


def test_train_and_heldout_share_no_question() -> None:
    # a small space (4,200 distinct sums): the seed streams overlap in questions, and the
    # split drops the training questions that are held out, and repeats
    train, heldout = rg.make_splits("reasoning_gym:chain_sum", SMALL, 0, 3000, 200)
    questions = [e.prompt for e in train]
    assert not set(questions) & {e.prompt for e in heldout}
    assert len(set(questions)) == len(questions)
    assert 0 < len(train) < 3000 and len(heldout) <= 200
    seeds = {json.loads(e.reference or "")["seed"] for e in train}
    held_seeds = {json.loads(e.reference or "")["seed"] for e in heldout}
    assert seeds == {0} and held_seeds == {rg.SPLIT_STRIDE}
    assert rg.make_splits("reasoning_gym:chain_sum", SMALL, 0, 3000, 200)[0] == train


def test_another_split_seed_gives_other_questions() -> None:
    a, _ = rg.make_splits("reasoning_gym:chain_sum", None, 0, 50, 10)
    b, _ = rg.make_splits("reasoning_gym:chain_sum", None, 1, 50, 10)
    assert {e.prompt for e in a} != {e.prompt for e in b}


def test_the_task_own_score_answer_scores_with_and_without_partial_credit() -> None:
    train, _ = rg.make_splits("reasoning_gym:chain_sum", None, 0, 5, 2)
    e = train[0]
    assert e.reference is not None
    assert score_full(e.answer, e.reference) == 1.0
    assert score_full(f" {e.answer}\n", e.reference) == 1.0  # surrounding space stripped
    assert score_full(e.answer + "1", e.reference) == 0.0
    # reasoning-gym's default partial credit: the answer inside a longer response scores
    # len(answer) / len(response): one character more → n / (n + 1)
    n = len(e.answer)
    assert score("9" + e.answer, e.reference) == pytest.approx(n / (n + 1))
    assert score_full("9" + e.answer, e.reference) == 0.0
    with pytest.raises(ValueError, match="not a reasoning-gym item's key"):
        score_full(e.answer, e.answer)


def test_the_verifier_runs_isolated_and_scores_through_the_environment(tmp_path: Path) -> None:
    cfg = build_config("grpo", None, SMALL_SUMS)
    assert cfg.feedback.verifier == "reasoning_gym"  # the task's own scorer, chosen for it
    verify = make_verifier(cfg, "reasoning_gym")
    assert isinstance(verify, IsolatedVerifier)
    tokenizer = task_tokenizer(cfg.data.task)
    train, _ = load_data(cfg)
    make_env = environment_factory(cfg, tokenizer)
    for text, reward in ((train[0].answer, 1.0), ("x" + train[0].answer, 0.0)):
        env = make_env(train[0])
        assert tokenizer.decode(env.reset(), skip_special_tokens=True) == train[0].prompt
        ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        step = env.step(ids)
        assert (step.reward, step.status, step.terminated) == (reward, RewardStatus.OK, True)


def test_an_explicit_verifier_is_kept_and_an_item_verifier_needs_the_task() -> None:
    cfg = build_config("grpo", None, [*SMALL_SUMS, "feedback.verifier=exact_match"])
    assert cfg.feedback.verifier == "exact_match"  # it reads the answer text
    with pytest.raises(ConfigError, match=r"^feedback.verifier: reasoning_gym scores"):
        build_config("grpo", None, ["feedback.verifier=reasoning_gym"])
    with pytest.raises(ConfigError, match=r"^feedback.eval_verifier: reasoning_gym_partial"):
        build_config("grpo", None, ["feedback.eval_verifier=reasoning_gym_partial"])
    with pytest.raises(
        ConfigError, match=r"^data.task_args: only reasoning-gym, gym and verifiers tasks"
    ):
        build_config("grpo", None, ["data.task_args={a: 1}"])


def test_per_task_pass_at_k_by_hand() -> None:
    # two samples per prompt; task a: 2 and 0 correct, task b: 1 correct
    # pass@1 = mean c/n: a (1 + 0)/2 = 0.5, b 0.5; pass@2: a (1 + 0)/2 = 0.5, b 1
    examples = [
        Example("p1", "1", task="a"),
        Example("p2", "2", task="a"),
        Example("p3", "3", task="b"),
    ]
    got = per_task(examples, [2, 0, 1], 2)
    assert got == {
        "eval/a/pass@1": 0.5,
        "eval/a/pass@k": 0.5,
        "eval/b/pass@1": 0.5,
        "eval/b/pass@k": 1.0,
    }
    assert per_task([Example("p", "1")], [1], 2) == {}  # no task named: no per-task keys


def test_the_embedded_model_gets_the_context_the_task_needs() -> None:
    cfg = build_config("grpo", None, SMALL_SUMS)
    train, heldout = load_data(cfg)
    tokenizer = task_tokenizer(cfg.data.task)
    longest = max(len(tokenizer(e.prompt)["input_ids"]) for e in (*train, *heldout))
    context = warm_start_spec(cfg).model.max_position_embeddings
    assert context % 64 == 0 and longest + 32 <= context < longest + 32 + 64
    assert context > TinySpec().max_position_embeddings  # 64 would not hold ~72 characters
    check_inputs(cfg)  # every prompt fits


def test_the_wide_tokenizer_round_trips_a_question_without_unknowns() -> None:
    tokenizer = task_tokenizer("reasoning_gym:chain_sum")
    question = rg.make_splits("reasoning_gym:basic_arithmetic", None, 0, 3, 1)[0][0].prompt
    ids = tokenizer(question)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == question
    assert len(set(PRINTABLE)) == len(PRINTABLE)


def test_the_chat_model_learns_the_words_of_its_reasoning_gym_task() -> None:
    """On a reasoning-gym task the chat model's BPE is trained on the task's text as well,
    so its prose costs about a token a word; on any other task it is the shared one."""
    cfg = build_config("grpo", None, [*SMALL_SUMS, "model.path=embedded:tiny-chat"])
    tokenizer = embedded_tokenizer(cfg)
    question = load_data(cfg)[1][0].prompt  # held out: its own ids were never seen
    ids = tokenizer(question, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == question
    # "State the final answer to the following arithmetic problem:" is 9 words and a colon;
    # then " ", "0", and for each further term " -", " ", "4", then " =": 2 + 3 + 3 + 1
    words = [tokenizer.decode([i]) for i in ids]
    assert words[:10] == [
        "State",
        " the",
        " final",
        " answer",
        " to",
        " the",
        " following",
        " arithmetic",
        " problem",
        ":",
    ]
    assert len(ids) <= 10 + 9  # 3 terms at most (digits one by one, as Qwen2 splits them)
    shared = chat_tokenizer()
    assert len(shared(question, add_special_tokens=False)["input_ids"]) > 2 * len(ids)
    calculator = build_config(
        "ppo", None, ["data.task=calculator", "model.path=embedded:tiny-chat"]
    )
    assert embedded_tokenizer(calculator).get_vocab() == shared.get_vocab()
    args = json.dumps(SMALL, sort_keys=True)
    rebuilt = warmstart._chat_tokenizer.__wrapped__(cfg.data.task, args, (0, cfg.data.eval_size))
    assert rebuilt.get_vocab() == tokenizer.get_vocab()  # built again, not cached: the same
    # it learns from the run's training text only: no held-out question is in its corpus
    train, heldout = load_data(cfg)
    corpus = set(warmstart.chat_corpus(cfg.data.task, args, (0, cfg.data.eval_size)))
    assert {e.prompt for e in train[:100]} <= corpus
    assert not corpus & {e.prompt for e in heldout}
    spec = warm_start_spec(cfg)  # short rows: the default batch of demonstrations
    assert spec.chat and spec.batch_size == 128 and spec.model.max_position_embeddings == 128
    check_inputs(cfg)  # every prompt fits, with its template


def test_training_on_a_mixture_logs_each_task(wide_model_dir: Path, tmp_path: Path) -> None:
    model = wide_model_dir
    out = tmp_path / "run"
    args = [
        "--recipe",
        "grpo",
        "--out",
        str(out),
        f"model.path={model}",
        "optim.steps=1",
        "data.task=reasoning_gym:chain_sum+basic_arithmetic",
        "sampling.prompts_per_step=2",
        "sampling.group_size=2",
        "generation.max_new_tokens=4",
        "generation.eval_samples=2",
        "data.train_size=20",
        "data.eval_size=4",
        "run.progress=false",
        "optim.micro_batch_size=4",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "rlmap.cli", "train", *args],
        text=True,
        capture_output=True,
        env={"OMP_NUM_THREADS": "1", **_env()},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/pass@1" in r]
    for task in ("chain_sum", "basic_arithmetic"):
        assert all(f"eval/{task}/pass@1" in r for r in evals)
    # the held-out set is 2 + 2: the overall pass@1 is the mean of the two tasks'
    last = evals[-1]
    mean = (last["eval/chain_sum/pass@1"] + last["eval/basic_arithmetic/pass@1"]) / 2
    assert last["eval/pass@1"] == pytest.approx(mean)
    assert (out / "checkpoints" / "step_1" / "trainer_state.pt").is_file()


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_rlmap_tasks_lists_and_shows_reasoning_gym_tasks() -> None:
    run = [sys.executable, "-m", "rlmap.cli", "tasks"]
    listing = subprocess.run(run, text=True, capture_output=True, check=True).stdout
    assert "arithmetic" in listing and "calculator" in listing
    assert "gym:ENV_ID" in listing and "verifiers:ENV_ID" in listing
    assert "chain_sum" in listing and "reasoning-gym, 106 tasks" in listing
    shown = subprocess.run([*run, "chain_sum"], text=True, capture_output=True, check=True).stdout
    assert "min_terms: 2" in shown and "max_digits: 4" in shown and "answer: " in shown
    bad = subprocess.run([*run, "chain_sun"], text=True, capture_output=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "no task 'chain_sun' (closest: chain_sum" in bad.stderr


def test_a_task_is_scored_by_its_own_settings() -> None:
    # decimal_arithmetic scores within a tolerance its precision sets: at 14 significant
    # digits an answer 9e-4 off is wrong; at the default settings' tolerance it would pass
    args = {"min_num_decimal_places": 6, "max_num_decimal_places": 6, "precision": 14}
    (e, *_), _ = rg.make_splits("reasoning_gym:decimal_arithmetic", args, 0, 3, 1)
    assert e.reference is not None
    off = f"{float(e.answer) + 9e-4:.12f}"
    assert score_full(e.answer, e.reference) == 1.0
    assert score_full(off, e.reference) == 0.0


def test_partial_credit_trains_but_pass_at_k_counts_full_scores() -> None:
    cfg = build_config("grpo", None, [*SMALL_SUMS, "feedback.verifier=reasoning_gym_partial"])
    assert (cfg.feedback.verifier, cfg.feedback.eval_verifier) == (
        "reasoning_gym_partial",
        "reasoning_gym",
    )
    kept = build_config(
        "grpo",
        None,
        [
            *SMALL_SUMS,
            "feedback.verifier=reasoning_gym_partial",
            "feedback.eval_verifier=reasoning_gym_partial",
        ],
    )
    assert kept.feedback.eval_verifier == "reasoning_gym_partial"  # an override is kept


def test_a_saved_reasoning_gym_config_reused_for_another_task_gets_its_verifier() -> None:
    saved = build_config("grpo", None, SMALL_SUMS).model_dump(mode="json")
    other = build_config(None, saved, ["data.task=arithmetic", "data.task_args=null"])
    assert (other.feedback.verifier, other.feedback.eval_verifier) == ("exact_match", None)
    plain = build_config("grpo", None, []).model_dump(mode="json")
    back = build_config(None, plain, SMALL_SUMS)
    assert back.feedback.verifier == "reasoning_gym"


def test_tasks_whose_items_depend_on_the_hash_seed_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^data.task: reasoning-gym's word_ladder does not"):
        rg.parse("reasoning_gym:chain_sum+word_ladder", None)


def test_the_items_are_the_same_in_another_process() -> None:
    code = (
        "import json, sys; from rlmap.tasks import reasoning_gym as rg; "
        "t, h = rg.make_splits('reasoning_gym:chain_sum+basic_arithmetic', None, 3, 30, 6); "
        "print(json.dumps([[e.prompt, e.answer, e.reference] for e in t + h]))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            text=True,
            capture_output=True,
            check=True,
            env={**_env(), "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1] and len(json.loads(runs[0])) == 36


def test_mixture_settings_must_be_mappings_and_every_task_held_out() -> None:
    with pytest.raises(ConfigError, match=r"^data.task_args.chain_sum: a task's settings"):
        rg.parse("reasoning_gym:chain_sum+gcd", {"chain_sum": 3})
    with pytest.raises(ConfigError, match=r"^data.eval_size: 1 held out for 2 tasks"):
        rg.make_splits("reasoning_gym:chain_sum+gcd", None, 0, 10, 1)


def test_a_reasoning_gym_task_gets_the_chat_model_unless_a_model_is_named() -> None:
    # Before: `rlmap train data.task=reasoning_gym:chain_sum` trained the character-level
    # model, which stalls on prose (0.018 -> 0.017 held-out pass@1 in 100 steps).
    from rlmap.recipes.build import embedded_task_note
    from rlmap.tasks.sources.reasoning_gym import PROSE_MODEL

    cfg = build_config("grpo", None, ["data.task=reasoning_gym:chain_sum"])
    assert cfg.model.path == PROSE_MODEL == "embedded:tiny-chat"
    mixture = build_config("grpo", None, ["data.task=reasoning_gym:chain_sum*3+basic_arithmetic"])
    assert mixture.model.path == PROSE_MODEL
    named = build_config(
        "grpo", None, ["data.task=reasoning_gym:chain_sum", "model.path=embedded:tiny"]
    )
    assert named.model.path == "embedded:tiny"
    in_file = build_config(
        None, {"model": {"path": "embedded:tiny"}}, ["data.task=reasoning_gym:chain_sum"]
    )
    assert in_file.model.path == "embedded:tiny"
    assert build_config("grpo", None, []).model.path == "embedded:tiny"  # arithmetic: as before
    # the model, and the task's own settings on an embedded model: one line before training
    note = embedded_task_note(cfg)
    assert note is not None and "\n" not in note
    assert "trains embedded:tiny-chat" in note and "data.task_args unset" in note
    easy = build_config(
        "grpo", None, ["data.task=reasoning_gym:chain_sum", 'data.task_args={"max_terms": 3}']
    )
    said = embedded_task_note(easy)
    assert said is not None and "trains embedded:tiny-chat" in said and "task_args" not in said
    assert embedded_task_note(build_config("grpo", None, [])) is None


def test_rlmap_train_says_the_note_before_training(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI prints it (after the inputs passed their checks; no training here).
    from rlmap import cli

    monkeypatch.setattr("rlmap.assembly.checks.check_inputs", lambda cfg: None)
    monkeypatch.setattr("rlmap.cli.train._train_rank", lambda args, cfg, world: 0)
    assert cli.main(["train", "data.task=reasoning_gym:chain_sum"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("rlmap: note: reasoning_gym:chain_sum trains ")
