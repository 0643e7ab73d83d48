"""Long-context key–value recall: facts over more turns than a small model's window holds.

An episode reveals ``pairs`` key–value facts, one per turn, the policy acknowledging each
with ``ok``; then it asks about one early key, and the run's verifier checks the answer
against that pair as it was shown::

    remember    ok<eos>   a=37     ok<eos>   q=52   …   ok<eos>   a?        a=37<eos>
    prompt      turn 0    obs      turn 1    obs        turn N    obs       turn N+1
                (ack)     fact 0   (ack)     fact 1     (ack)     question  (the answer)

On a tokenizer with a chat template the facts and the question are user messages of the
template (appended as :func:`rlmap.tasks.tool_calls.tail_ids` renders them, token in and
token out, the EOS that ended the acknowledgement not repeated); on one without, they are
plain text between spaces. The prompt holds the instruction only, never a fact: a context
policy that keeps the prompt and drops the oldest turns (``truncate_oldest``) loses the early
facts, and with them the answer, unless the policy carried them forward (``compact``).

The answer repeats the pair (``a=37``), not the bare value: recall is then the copy an
induction head makes — what followed ``a=`` before —, where a bare ``37`` would ask the
model to carry the key across the template's tokens to the answer and look it up there.

With the defaults (10 pairs, the question about one of the first 2) a well-formed episode
is 193 tokens on the embedded chat model, whose window is 128 (:func:`episode_ids` counts
them): it cannot be answered without segments.

Deterministic from the seed: :func:`draw` gives the keys (distinct lowercase letters), the
values (10-99) and the asked pair from ``random.Random(seed)`` alone, so an environment is
replayable (``replayable``: reset and the same actions give the same observations).

Mistakes are the policy's, never an infrastructure failure: an acknowledgement that is not
``ok`` is counted as a failed tool call (as a gym task's invalid action: error class
``tool_error``) and the episode goes on; an answer that is not the pair is a reward of 0
(``wrong_answer``, or ``format_miss`` when empty).
"""

from __future__ import annotations

import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from rlmap.core.errors import ConfigError
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import SUMMARY_LEAD, EnvStep, PromptIds, Verifier, verify_safely
from rlmap.tasks.prompts import decode_response, encode_prompt
from rlmap.tasks.tool_calls import tail_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INSTRUCTION = "remember"
"""The prompt: the same for every episode (the facts come as observations)."""
ACK = "ok"
"""The acknowledgement the policy answers each fact with."""
KEYS = string.ascii_lowercase
VALUES = range(10, 100)
"""Two-digit values: a guess is right 1 time in 90."""


@dataclass(frozen=True)
class RecallSettings:
    """``data.task_args`` of the task."""

    pairs: int = 10
    """Facts revealed, one per turn (1-26: the keys are distinct letters)."""
    ask_first: int = 2
    """The question is about one of the first ``ask_first`` pairs, drawn uniformly (1: always
    the first; ``pairs``: any)."""

    @property
    def turns(self) -> int:
        """Policy turns of an episode: an acknowledgement of the instruction and of each
        pair, then the answer."""
        return self.pairs + 2


def settings_problems(task_args: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with ``data.task_args`` for the task, one line each."""
    args = dict(task_args or {})
    known = {"pairs", "ask_first"}
    problems = [
        f"data.task_args: kv_recall takes {sorted(known)}, not {name!r}"
        for name in sorted(set(args) - known)
    ]
    for name in sorted(known & set(args)):
        value = args[name]
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"data.task_args: {name} must be an integer, got {value!r}")
    if problems:
        return problems
    s = RecallSettings(**args)
    if not 1 <= s.pairs <= len(KEYS):
        problems.append(f"data.task_args: pairs must be in 1..{len(KEYS)}, got {s.pairs}")
    elif not 1 <= s.ask_first <= s.pairs:
        problems.append(
            f"data.task_args: ask_first must be in 1..pairs={s.pairs}, got {s.ask_first}"
        )
    return problems


def recall_settings(task_args: Mapping[str, Any] | None) -> RecallSettings:
    """The settings in ``data.task_args``; ConfigError naming the first problem."""
    problems = settings_problems(task_args)
    if problems:
        raise ConfigError(problems[0])
    return RecallSettings(**dict(task_args or {}))


@dataclass(frozen=True)
class Recall:
    """One episode's facts and question."""

    pairs: tuple[tuple[str, str], ...]
    """(key, value) in the order they are revealed."""
    asked: int
    """Index of the pair the question is about."""

    @property
    def key(self) -> str:
        return self.pairs[self.asked][0]

    @property
    def value(self) -> str:
        return self.pairs[self.asked][1]

    @property
    def answer(self) -> str:
        """The right answer: the asked pair as it was shown (``a=37``; see the module
        docstring for why not the bare value)."""
        return fact_text(self.key, self.value)


def draw(seed: int, settings: RecallSettings) -> Recall:
    """The episode of ``seed``: a function of the seed and the settings alone."""
    rng = random.Random(seed)
    keys = rng.sample(KEYS, settings.pairs)
    values = [str(rng.choice(VALUES)) for _ in keys]
    return Recall(tuple(zip(keys, values, strict=True)), rng.randrange(settings.ask_first))


def fact_text(key: str, value: str) -> str:
    return f"{key}={value}"


def question_text(key: str) -> str:
    return f"{key}?"


def shown_after(recall: Recall, turn: int) -> str:
    """The observation's text after acknowledgement turn ``turn`` (0: the instruction's):
    fact ``turn``, or the question after the last fact's."""
    if turn < len(recall.pairs):
        return fact_text(*recall.pairs[turn])
    return question_text(recall.key)


def observation_ids(
    tokenizer: PreTrainedTokenizerBase, text: str, action_ids: Sequence[int]
) -> list[int]:
    """The ids appended after a turn: ``text`` as a user message of the chat template (the
    template's closing EOS dropped when the turn already ended with it), or after a space
    without a template (and a space before the next turn)."""
    if not getattr(tokenizer, "chat_template", None):
        return [int(i) for i in tokenizer.encode(f" {text} ", add_special_tokens=False)]
    ids = tail_ids(tokenizer, (("user", text),))
    eos = tokenizer.eos_token_id
    if action_ids and action_ids[-1] == eos and ids[:1] == [eos]:
        ids = ids[1:]  # the turn's own EOS closed the assistant message
    return ids


class RecallEnv:
    """One episode of the task (module docstring). ``encode`` and ``verify_waits`` as in
    :class:`~rlmap.tasks.env.AnswerEnv`."""

    stop_token_ids: tuple[int, ...] = ()
    replayable = True

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        recall: Recall,
        verify: Verifier,
        *,
        encode: PromptIds | None = None,
        verify_waits: bool = True,
    ) -> None:
        self.tokenizer, self.recall, self.verify = tokenizer, recall, verify
        self.encode = partial(encode_prompt, tokenizer) if encode is None else encode
        self.waits = verify_waits
        self.turns = 0

    def reset(self) -> list[int]:
        self.turns = 0
        return self.encode(INSTRUCTION)

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        turn, ids = self.turns, [int(i) for i in action_ids]
        self.turns += 1
        text = decode_response(self.tokenizer, ids)
        if turn > len(self.recall.pairs) + 1:
            raise RuntimeError(f"kv_recall: step after the episode's answer (turn {turn})")
        if turn == len(self.recall.pairs) + 1:
            reward, status = verify_safely(self.verify, text, self.recall.answer)
            return EnvStep(reward=reward, terminated=True, status=status)
        malformed = text.strip() != ACK
        shown = observation_ids(self.tokenizer, shown_after(self.recall, turn), ids)
        return EnvStep(observation=tuple(shown), tool_call=malformed, tool_error=malformed)


def turn_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A well-formed turn saying ``text``: its ids, then EOS."""
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    return [*ids, int(tokenizer.eos_token_id)]


def episode_ids(
    tokenizer: PreTrainedTokenizerBase, recall: Recall, encode: PromptIds | None = None
) -> list[int]:
    """Every token of a well-formed episode (each fact acknowledged with ``ok``, the right
    pair answered): what it takes of a context that holds it whole."""
    env = RecallEnv(tokenizer, recall, lambda response, reference: 0.0, encode=encode)
    ids, ack = env.reset(), turn_ids(tokenizer, ACK)
    for _ in range(len(recall.pairs) + 1):
        ids += ack + list(env.step(ack).observation)
    return ids + turn_ids(tokenizer, recall.answer)


DEMO_PAIRS = 5
"""Most pairs a warm-start demonstration shows: 113 tokens on the embedded chat model, within
its 128 positions (4 after a summary)."""
SUMMARY_SHARE = 0.25
"""Share of demonstrations that write a compaction summary (``data.context_policy=compact``)."""
ASK_SHARE = 0.75
"""Share of the other demonstrations that answer a question (the rest acknowledge a fact)."""
QUESTION_SHARE = 0.25
"""Share of the summaries written after the question (the last fact's observation may close
a segment), and of the questions after a summary asked with no fact between (the newest
observation carried was the question)."""
CARRY_SHARE = 0.5
"""Share of windows that do not start at the first pair which follow a summary (the shape of
a segment after a compaction; the rest lost their oldest turns, as under ``truncate_oldest``)."""


def summary_text(pairs: Sequence[tuple[str, str]], settings: RecallSettings) -> str:
    """What a demonstrated summary of the facts ``pairs`` says: the first ``ask_first`` of
    them — every fact a question can be about, and nothing else — as they were shown
    (``a=37 q=52``: 10 tokens with the EOS on the embedded chat model, within
    ``data.summary_tokens``' 16)."""
    return " ".join(fact_text(*p) for p in pairs[: settings.ask_first])


def demonstration(seed: int, settings: RecallSettings) -> Example:
    """A warm-start demonstration drawn from episode ``seed``: a window of at most
    ``DEMO_PAIRS`` consecutive pairs after the instruction — the first segment's, one that
    lost its oldest turns, or one after a compaction: the summary of every earlier fact (as
    the policy's turn after ``SUMMARY_LEAD``), then the newest of them again (the
    observation the compaction cut before answering) —, then either a summary of every fact
    shown so far (``Example.lead``: the turn starts with the lead; some after the question),
    the question about a fact in view and its pair (some right after a summary, the question
    the newest observation), or an acknowledgement. As chat messages: a chat template
    renders them into the very ids an episode has (a test compares them)."""
    recall, rng = draw(seed, settings), random.Random(f"kv_recall demonstration {seed}")
    summarize = rng.random() < SUMMARY_SHARE
    first = summarize and rng.random() < 0.5  # half the summaries close a first segment
    start = 0 if first else rng.randint(0, settings.pairs - 1)
    carried = start > 0 and (summarize or rng.random() < CARRY_SHARE)
    width = rng.randint(1, min(DEMO_PAIRS - carried, settings.pairs - start))
    window = recall.pairs[start : start + width]
    messages: list[tuple[str, str]] = [("user", INSTRUCTION)]
    if carried:
        earlier = summary_text(recall.pairs[: start + 1], settings)
        messages.append(("assistant", SUMMARY_LEAD + earlier))
    summarized = recall.pairs[: min(settings.ask_first, start + 1)] if carried else ()
    in_view = list(dict.fromkeys([*summarized, *window]))
    if summarize:
        shown = [fact_text(*p) for p in window]
        if rng.random() < QUESTION_SHARE:
            shown.append(question_text(rng.choice(in_view)[0]))
        answer, lead = summary_text(recall.pairs[: start + width], settings), SUMMARY_LEAD
    elif rng.random() < ASK_SHARE:
        if carried and rng.random() < QUESTION_SHARE:  # the question was the newest observation
            window, in_view = (), list(summarized)
        asked = rng.choice(in_view)
        shown = [*(fact_text(*p) for p in window), question_text(asked[0])]
        answer, lead = fact_text(*asked), ""
    else:
        acknowledged = window[: rng.randint(carried, width)]
        shown, answer, lead = [fact_text(*p) for p in acknowledged], ACK, ""
    for k, text in enumerate(shown):
        messages += [] if carried and k == 0 else [("assistant", ACK)]
        messages.append(("user", text))
    return Example(prompt=messages[-1][1], answer=answer, messages=tuple(messages), lead=lead)
