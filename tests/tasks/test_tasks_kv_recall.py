"""The long-context key-value recall task: its episodes, verdicts, seeds, length and kind.

Hand-scripted actions against hand-built episodes; the expected texts and token counts are
written out (and counted) here, not read back from the code under test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

from rlmap.assembly.embedded import warm_start_spec
from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.embedded.warmstart import WarmStartSpec, chat_tokenizer, sft_batch, task_tokenizer
from rlmap.feedback.verifiers import exact_match
from rlmap.recipes import build_config
from rlmap.runs.samples import Judged, error_class
from rlmap.tasks import kv_recall as kv
from rlmap.tasks.env import EnvStep
from rlmap.tasks.kind import Split
from rlmap.tasks.prompts import encode_prompt
from rlmap.tasks.registry import kind_of
from rlmap.tasks.sources import kv_recall as source

CHAT = chat_tokenizer()
PLAIN = task_tokenizer("kv_recall")  # the embedded character tokenizer
TWO = kv.Recall((("a", "37"), ("q", "52")), asked=0)  # a=37, q=52; asks a? → a=37


def say(tokenizer: Any, text: str) -> list[int]:
    """A turn saying ``text``, ended by EOS (as a sampled turn ends)."""
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def play(tokenizer: Any, recall: kv.Recall, turns: list[str]) -> tuple[list[int], list[EnvStep]]:
    """Every id of an episode whose turns say ``turns``, and the environment's steps."""
    env = kv.RecallEnv(tokenizer, recall, exact_match)
    ids, steps = env.reset(), []
    for text in turns:
        step = env.step(say(tokenizer, text))
        ids += say(tokenizer, text) + list(step.observation)
        steps.append(step)
    return ids, steps


def well_formed(recall: kv.Recall, answer: str | None = None) -> list[str]:
    return [kv.ACK] * (len(recall.pairs) + 1) + [recall.answer if answer is None else answer]


# --- observations ------------------------------------------------------------------------


def test_a_chat_episode_is_the_templates_conversation_token_for_token() -> None:
    ids, steps = play(CHAT, TWO, well_formed(TWO))
    turn = "<|im_start|>assistant\n{}<|im_end|>\n"
    user = "<|im_start|>user\n{}<|im_end|>\n"
    expected = (
        user.format("remember")
        + turn.format("ok")
        + user.format("a=37")
        + turn.format("ok")
        + user.format("q=52")
        + turn.format("ok")
        + user.format("a?")
        + "<|im_start|>assistant\na=37<|im_end|>"
    )
    assert CHAT.decode(ids) == expected
    # the ids are the template's own rendering of those messages, not a re-encoding's
    messages = (("user", "remember"), ("assistant", "ok"), ("user", "a=37"), ("assistant", "ok"))
    messages += (("user", "q=52"), ("assistant", "ok"), ("user", "a?"))
    assert ids == encode_prompt(CHAT, messages) + say(CHAT, "a=37")
    assert [s.reward for s in steps] == [0.0, 0.0, 0.0, 1.0]
    assert [s.terminated for s in steps] == [False, False, False, True]


def test_a_plain_episode_is_text_between_spaces() -> None:
    ids, _ = play(PLAIN, TWO, well_formed(TWO))
    assert PLAIN.decode(ids) == "<bos>rememberok<eos> a=37 ok<eos> q=52 ok<eos> a? a=37<eos>"


def test_the_prompt_holds_no_fact() -> None:
    # truncate_oldest keeps the prompt: a fact in it would survive, and the task would not
    # need the early turns
    env = kv.RecallEnv(CHAT, TWO, exact_match)
    assert (
        CHAT.decode(env.reset()) == "<|im_start|>user\nremember<|im_end|>\n<|im_start|>assistant\n"
    )


# --- verdicts and error classes ------------------------------------------------------------


def judged(tokenizer: Any, recall: kv.Recall, turns: list[str]) -> tuple[float, str]:
    """(return, error class) of a scripted episode, as the evaluation classifies it."""
    _, steps = play(tokenizer, recall, turns)
    last = steps[-1]
    assert last.terminated and all(not s.terminated and not s.truncated for s in steps[:-1])
    status = last.status
    judged = Judged(
        outcome=sum(s.reward for s in steps),
        status=status,
        end=End.TERMINAL,
        eos=True,
        tool_errors=sum(s.tool_error for s in steps),
        answer=turns[-1],
    )
    return judged.outcome, error_class(judged)


@pytest.mark.parametrize("tokenizer", [CHAT, PLAIN], ids=["chat", "plain"])
@pytest.mark.parametrize(
    ("turns", "outcome", "cls"),
    [
        (["ok", "ok", "ok", "a=37"], 1.0, "correct"),  # a asked: the pair a=37
        (["ok", "ok", "ok", " a=37 "], 1.0, "correct"),  # exact_match: spaces aside
        (["ok", "ok", "ok", "a=52"], 0.0, "wrong_answer"),  # q's value, not a's
        (["ok", "ok", "ok", "q=52"], 0.0, "wrong_answer"),  # another pair
        (["ok", "ok", "ok", "37"], 0.0, "wrong_answer"),  # the bare value: not the pair
        (["ok", "ok", "ok", ""], 0.0, "format_miss"),  # an empty answer
        (["ok", "sure", "ok", "q=52"], 0.0, "tool_error"),  # a malformed acknowledgement
        (["ok", "sure", "ok", "a=37"], 1.0, "correct"),  # counted, but the answer stands
    ],
)
def test_right_value_is_one_wrong_is_zero_and_mistakes_are_classed(
    tokenizer: Any, turns: list[str], outcome: float, cls: str
) -> None:
    assert judged(tokenizer, TWO, turns) == (outcome, cls)


def test_a_malformed_acknowledgement_is_a_counted_mistake_and_the_episode_goes_on() -> None:
    _, steps = play(CHAT, TWO, ["ok", "a=37", "ok"])  # answering early, on q=52's turn
    assert [(s.tool_call, s.tool_error) for s in steps] == [
        (False, False),
        (True, True),
        (False, False),
    ]
    assert steps[1].status == RewardStatus.OK and not steps[1].terminated
    assert CHAT.decode(list(steps[1].observation)).count("q=52") == 1  # the next fact, as usual


def test_a_step_after_the_answer_is_an_environment_failure() -> None:
    env = kv.RecallEnv(PLAIN, TWO, exact_match)
    env.reset()
    for text in well_formed(TWO):
        env.step(say(PLAIN, text))
    with pytest.raises(RuntimeError, match="after the episode's answer"):
        env.step(say(PLAIN, "ok"))


# --- seeds -----------------------------------------------------------------------------------


def test_an_episode_is_a_function_of_its_seed() -> None:
    s = kv.RecallSettings()
    forward = [kv.draw(seed, s) for seed in range(50)]
    random.Random(1).random()  # the global stream and the order of draws play no part
    backward = [kv.draw(seed, s) for seed in reversed(range(50))][::-1]
    assert forward == backward
    assert len({r.pairs for r in forward}) == 50  # seeds give different episodes


def test_an_episode_draws_distinct_letters_two_digit_values_and_an_early_question() -> None:
    recalls = [kv.draw(seed, kv.RecallSettings(pairs=10, ask_first=3)) for seed in range(300)]
    for r in recalls:
        keys = [k for k, _ in r.pairs]
        assert len(keys) == 10 == len(set(keys)) and set(keys) <= set("abcdefghijklmnopqrstuvwxyz")
        assert all(10 <= int(v) <= 99 for _, v in r.pairs)
    assert {r.asked for r in recalls} == {0, 1, 2}  # uniform over the first ask_first
    assert {kv.draw(s, kv.RecallSettings(ask_first=1)).asked for s in range(50)} == {0}


def test_the_same_seed_gives_the_same_observations_and_verdicts() -> None:
    train, _ = source.splits(Data())
    make = source.environment(CHAT, Data(), Scoring())
    runs = []
    for _ in range(2):
        env = make(train[3])
        ids = env.reset()
        for _ in range(11):
            ids += list(env.step(say(CHAT, "ok")).observation)
        runs.append((ids, env.step(say(CHAT, train[3].answer)).reward))
    assert runs[0] == runs[1] and runs[0][1] == 1.0


def test_train_and_held_out_episodes_never_share_a_seed_and_answer_their_own_draw() -> None:
    train, heldout = source.splits(Data(train_size=200, eval_size=50))
    assert not {e.reference for e in train} & {e.reference for e in heldout}
    assert len({e.prompt for e in [*train, *heldout]}) == 250  # prompts are unique labels
    s = kv.RecallSettings()
    assert all(e.answer == kv.draw(int(e.reference or -1), s).answer for e in [*train, *heldout])
    moved, _ = source.splits(Data(split_seed=1, train_size=200))
    assert not {e.reference for e in moved} & {e.reference for e in train}


# --- length: the episode outgrows the window -------------------------------------------------


def test_a_default_episode_outgrows_the_chat_models_128_positions() -> None:
    recall = kv.draw(0, kv.RecallSettings())
    ids, _ = play(CHAT, recall, well_formed(recall))
    # prompt 14 (<|im_start|> user \n r e me m b er <|im_end|> \n <|im_start|> assistant \n)
    # + 11 acknowledgements × 3 (o k <|im_end|>)
    # + 10 facts × 13 (\n <|im_start|> user \n x = d d <|im_end|> \n <|im_start|> assistant \n)
    # + the question 11 (x ? instead of x = d d) + the answer 5 (x = d d <|im_end|>)
    # = 14 + 33 + 130 + 11 + 5 = 193
    assert len(ids) == 193 > 128
    assert len(kv.episode_ids(CHAT, recall)) == 193
    # context_need: the episode with a last turn of the whole budget (16) instead of 5 ids
    assert source.context_need(Data(), CHAT, 14, 16) == 193 - 5 + 16


def test_under_fail_an_episode_that_does_not_fit_is_refused_in_one_line() -> None:
    with pytest.raises(
        ConfigError, match=r"^data.context_policy: kv_recall with 10 pairs takes 204 "
    ):
        source.check_model(Data(), 16, CHAT, 128)
    source.check_model(Data(context_policy="truncate_oldest"), 16, CHAT, 128)  # segments: fine
    source.check_model(Data(context_policy="compact"), 16, CHAT, 128)
    # 5 pairs: 14 + 6 × 3 + 5 × 13 + 11 = 108, and a turn of 16 → 124 <= 128
    source.check_model(Data(task_args={"pairs": 5}), 16, CHAT, 128)
    with pytest.raises(ConfigError, match="takes 140 positions"):  # 6 pairs: 108 + 16 + 16
        source.check_model(Data(task_args={"pairs": 6}), 16, CHAT, 128)


# --- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"pair": 3}, "kv_recall takes ['ask_first', 'pairs'], not 'pair'"),
        ({"pairs": "8"}, "pairs must be an integer, got '8'"),
        ({"pairs": True}, "pairs must be an integer, got True"),
        ({"pairs": 0}, "pairs must be in 1..26, got 0"),
        ({"pairs": 27}, "pairs must be in 1..26, got 27"),
        ({"pairs": 4, "ask_first": 5}, "ask_first must be in 1..pairs=4, got 5"),
        ({"ask_first": 0}, "ask_first must be in 1..pairs=10, got 0"),
    ],
)
def test_bad_settings_are_one_line_each(args: dict[str, Any], problem: str) -> None:
    assert kv.settings_problems(args) == [f"data.task_args: {problem}"]
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        kv.recall_settings(args)


def test_the_turn_budget_must_reach_the_question() -> None:
    problems = list(source.check_settings(Data(max_turns=11), "embedded:tiny-chat"))
    assert problems == [
        "data.max_turns: kv_recall with 10 pairs takes 12 turns (an acknowledgement of the "
        "instruction and of each pair, then the answer); set data.max_turns=12 or more, got 11"
    ]
    assert list(source.check_settings(Data(max_turns=12), "embedded:tiny-chat")) == []
    assert list(source.check_settings(Data(task_args={"pairs": 3}, max_turns=5), "m")) == []


# --- the kind ------------------------------------------------------------------------------


def test_kv_recall_is_a_registered_multi_turn_kind_on_the_chat_model() -> None:
    kind = kind_of("kv_recall")
    assert kind.name == "kv_recall" and kind.multi_turn and not kind.own_reward
    assert kind_of("kv_recall.jsonl").name == "files"  # a file, whatever its name
    cfg = build_config("grpo", None, ["data.task=kv_recall", "data.max_turns=12"])
    assert cfg.model.path == "embedded:tiny-chat"  # 128 positions: the window it outgrows
    with pytest.raises(ConfigError, match=r"data\.max_turns: kv_recall with 10 pairs takes 12"):
        build_config("grpo", None, ["data.task=kv_recall"])


# --- the warm start's demonstrations -----------------------------------------------------------


def _facts(texts: list[str]) -> list[str]:
    return [t for text in texts for t in text.split() if "=" in t]


def test_a_demonstration_is_a_window_of_the_episode_in_the_episodes_own_ids() -> None:
    s = kv.RecallSettings()
    shapes = set()
    for seed in range(200):
        demo, recall = kv.demonstration(seed, s), kv.draw(seed, s)
        pairs = [kv.fact_text(*p) for p in recall.pairs]
        messages = list(demo.messages or ())
        assert messages[0] == ("user", "remember")
        carried = len(messages) > 1 and messages[1][1].startswith("summary: ")
        if carried:  # after a compaction: the summary of the first facts, then the newest
            summary = messages[1][1].removeprefix("summary: ").split()
            newest = messages[2][1]  # a fact, or the question
            upto = pairs.index(newest) + 1 if newest in pairs else len(pairs)
            assert summary == pairs[: min(2, upto)]  # ask_first = 2: the facts asked about
            messages = [messages[0], ("assistant", "ok"), *messages[2:]]  # as an episode
        assert messages[1::2] == [("assistant", "ok")] * (len(messages) // 2)
        shown = [text for _, text in messages[2::2]]
        facts = [f for f in shown if "=" in f]
        first = pairs.index(facts[0]) if facts else 0
        assert facts == pairs[first : first + len(facts)]  # consecutive facts of the episode
        in_view = set(facts) | (set(summary) if carried else set())
        if demo.lead:  # a summary of every fact shown so far: the first two
            asked = shown[len(facts) :]  # after the facts, a question or nothing
            assert demo.lead == "summary: " and (carried or first == 0)
            assert asked in ([], [f"{f[0]}?" for f in in_view if f[0] + "?" in asked])
            assert demo.answer.split() == pairs[: min(2, first + len(facts))]
            shapes.add(("summary after the question" if asked else "summary", carried))
        elif demo.answer != "ok":  # a question about a fact in view, answered with its pair
            assert shown[-1] == f"{demo.answer[0]}?" and demo.answer in in_view
            assert shown[:-1] == facts
            shapes.add(("ask" if facts else "ask right after the summary", carried))
        else:
            assert shown == facts  # an acknowledgement after the instruction or a fact
            shapes.add(("ok", carried))
    kinds = ("summary", "summary after the question", "ask", "ok")
    assert shapes == {(kind, c) for kind in kinds for c in (False, True)} | {
        ("ask right after the summary", True)
    }
    # the ids a demonstration trains on are the episode's: a window of TWO's pairs
    demo_ids = encode_prompt(
        CHAT,
        (
            ("user", "remember"),
            ("assistant", "ok"),
            ("user", "a=37"),
            ("assistant", "ok"),
            ("user", "q=52"),
            ("assistant", "ok"),
            ("user", "a?"),
        ),
    )
    episode, _ = play(CHAT, TWO, ["ok", "ok", "ok"])
    assert demo_ids == episode


def test_a_compacted_segment_is_the_templates_conversation_token_for_token() -> None:
    # the rollout under compact, scripted: the policy acknowledges, and after the lead writes
    # "a=37 q=52". The next segment's context must be what the chat template renders for a
    # demonstration after a compaction: the summary as the assistant's turn, the newest fact.
    from rlmap.engines.engine import Completion
    from rlmap.rollout.episodes import run_episodes
    from rlmap.rollout.segments import Compaction

    lead = tuple(CHAT.encode("summary: ", add_special_tokens=False))
    recall = kv.draw(3, kv.RecallSettings(pairs=6))
    contexts: list[tuple[int, ...]] = []

    class Scripted:
        max_len = 96  # a turn 16 + lead 8 + summary 16 = 40: close over 56 (after 3 facts)
        version = 0

        def generate(self, prompts: Any, *, n: int, max_new_tokens: int, **_: Any) -> Any:
            out = []
            for p in prompts:
                contexts.append(tuple(p))
                text = (
                    kv.summary_text(recall.pairs[:3], kv.RecallSettings())
                    if tuple(p[-len(lead) :]) == lead
                    else "ok"
                )
                ids = tuple(say(CHAT, text))
                out.append([Completion(tuple(p), ids, (0.0,) * len(ids), True, 0)])
            return out

    env = kv.RecallEnv(CHAT, recall, exact_match)
    (e,) = run_episodes(
        Scripted(),
        [env],
        max_new_tokens=16,
        temperature=1.0,
        top_p=1.0,
        next_context=Compaction(lead, 16),
    )
    assert e.summaries and len(e.segments) >= 2
    after = next(c for c in contexts if c[: len(lead) + 14][-len(lead) :] == lead)
    (k0, v0), (k1, v1), (k2, v2) = recall.pairs[:3]
    messages = (
        ("user", "remember"),
        ("assistant", f"summary: {k0}={v0} {k1}={v1}"),
        ("user", f"{k2}={v2}"),
    )
    assert after == tuple(encode_prompt(CHAT, messages))
    demo = kv.Example("", "", messages=messages, lead="summary: ")
    ids, _, labels = sft_batch(CHAT, [demo], 0.0, random.Random(0))
    assert ids[0, : len(after) + len(lead)].tolist() == [*after, *lead]  # a lead, untrained
    assert set(labels[0, : len(after) + len(lead)].tolist()) == {-100}


def test_demonstrations_fit_the_chat_model_and_train_on_the_answer_only() -> None:
    split, split_settings = Split("kv_recall", {}, 0, 500, 16), kv.RecallSettings()
    demos = source.demonstrations(split)
    assert len(demos) == 500
    summaries = sum(bool(d.lead) for d in demos)
    asks = sum(d.answer != "ok" and not d.lead for d in demos)
    assert 0.19 < summaries / len(demos) < 0.31  # SUMMARY_SHARE = 0.25 of 500
    assert 0.68 < asks / (len(demos) - summaries) < 0.82  # ASK_SHARE = 0.75 of the others
    ids, _, labels = sft_batch(CHAT, demos, 0.0, random.Random(0))
    assert ids.shape[1] <= 128  # the longest: 5 pairs, 14 + 6 × 3 + 5 × 13 + 11 + 5 = 113
    for row, demo in zip(labels.tolist(), demos, strict=True):
        assert [t for t in row if t != -100] == say(CHAT, demo.answer)  # never the lead
    train, _ = source.seeds(0, 500, 16)  # demonstration i: a window of training episode i
    for seed, demo in zip(train, demos, strict=True):
        texts = [text for role, text in demo.messages or () if role == "user"]
        episode = [kv.fact_text(*p) for p in kv.draw(seed, split_settings).pairs]
        assert all(f in episode for f in _facts(texts))


def test_the_warm_start_imitates_on_the_chat_model_and_skips_the_blur() -> None:
    cfg = build_config("grpo", None, ["data.task=kv_recall", "data.max_turns=12"])
    spec = warm_start_spec(cfg)
    assert spec.chat and spec.model.max_position_embeddings == 128  # the window to outgrow
    assert spec.steps == WarmStartSpec.steps and spec.blur_steps == 0  # measured: docs/tasks.md
    plain = ["data.task=kv_recall", "data.max_turns=12", "model.path=embedded:tiny"]
    spec = warm_start_spec(build_config("grpo", None, plain))
    assert not spec.chat and spec.steps == 0  # no template: no demonstration in its ids


@dataclass(frozen=True)
class Data:
    """The fields of the ``data`` section the kind reads."""

    task: str = "kv_recall"
    task_args: dict[str, Any] | None = None
    split_seed: int = 0
    train_size: int = 20
    eval_size: int = 8
    max_turns: int = 12
    context_policy: str = "fail"


@dataclass(frozen=True)
class Scoring:
    verify: Any = exact_match
    encode: Any = None
    waits: bool = False


def test_a_new_version_of_the_demonstrations_is_a_new_warm_start() -> None:
    # version 2 (with summaries) must not reuse a version-1 checkpoint, and a kind that never
    # versioned its demonstrations keeps the digest it had: the field is left out at 0
    chat = WarmStartSpec(task="kv_recall", chat=True, blur_steps=0)
    assert WarmStartSpec(**{**chat.__dict__, "demonstrations": 2}).digest() != chat.digest()
    spec = warm_start_spec(build_config("grpo", None, ["data.task=kv_recall", "data.max_turns=12"]))
    assert spec.demonstrations == 2
    import hashlib
    import json
    from dataclasses import asdict

    from rlmap.embedded.warmstart import FORMAT_VERSION, spec_tokenizer

    plain = WarmStartSpec()
    payload = {"spec": asdict(plain), "tokenizer": spec_tokenizer(plain).backend_tokenizer.to_str()}
    del payload["spec"]["chat"], payload["spec"]["demonstrations"]
    payload["format"] = FORMAT_VERSION
    old = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    assert plain.digest() == old  # what the digest was before the field existed
