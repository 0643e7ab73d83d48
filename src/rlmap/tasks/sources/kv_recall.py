"""The long-context key–value recall task (``data.task=kv_recall``;
:mod:`rlmap.tasks.kv_recall`): facts one per turn, then a question about an early one.

Its episodes outgrow the embedded chat model's window by design, so it trains that model
(128 positions) unless the run names another, and is refused under
``data.context_policy=fail`` when a well-formed episode does not fit: every episode would
end truncated before its question.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlmap.core.errors import ConfigError
from rlmap.tasks import kv_recall
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory
from rlmap.tasks.kind import DataSettings, Labelled, Scoring, Split, TaskKind
from rlmap.tasks.prompts import encode_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

NAME = "kv_recall"
SPLIT_STRIDE = 10**9
"""Held-out episode ``i`` has seed ``SPLIT_STRIDE + i`` beyond the training ones' base (as a
gym task's): the two sets never share a seed."""


def seeds(split_seed: int, train_size: int, eval_size: int) -> tuple[range, range]:
    """(train, held-out) episode seeds; ``data.split_seed`` moves both."""
    train = 2 * SPLIT_STRIDE * split_seed
    heldout = train + SPLIT_STRIDE
    return range(train, train + train_size), range(heldout, heldout + eval_size)


def episode(seed: int, settings: kv_recall.RecallSettings) -> Example:
    """Episode ``seed`` as an example: a unique label for a prompt (the text the model sees is
    the environment's), the asked pair as the answer, the seed as the reference."""
    return Example(
        prompt=f"{NAME} episode {seed}",
        answer=kv_recall.draw(seed, settings).answer,
        reference=str(seed),
    )


def splits(d: DataSettings) -> tuple[list[Example], list[Example]]:
    settings = kv_recall.recall_settings(d.task_args)
    train, heldout = seeds(d.split_seed, d.train_size, d.eval_size)
    return [episode(s, settings) for s in train], [episode(s, settings) for s in heldout]


def prompts(d: DataSettings) -> list[Labelled]:
    """Every episode begins with the instruction."""
    return [(f"data.task={d.task} instruction", kv_recall.INSTRUCTION)]


def environment(
    tokenizer: PreTrainedTokenizerBase, d: DataSettings, scoring: Scoring
) -> EnvFactory:
    """The episode of an example's seed, answered against the run's verifier."""
    settings = kv_recall.recall_settings(d.task_args)
    verify, encode, waits = scoring.verify, scoring.encode, scoring.waits

    def make(e: Example) -> kv_recall.RecallEnv:
        if e.reference is None:
            raise ValueError(f"kv_recall: {e.prompt!r} carries no episode seed")
        recall = kv_recall.draw(int(e.reference), settings)
        return kv_recall.RecallEnv(tokenizer, recall, verify, encode=encode, verify_waits=waits)

    return make


def check_settings(d: DataSettings, model_path: str) -> Iterator[str]:
    """``data.task_args``' problems; a turn budget that cannot reach the question."""
    problems = kv_recall.settings_problems(d.task_args)
    yield from problems
    if problems:
        return
    s = kv_recall.recall_settings(d.task_args)
    if d.max_turns < s.turns:
        yield (
            f"data.max_turns: kv_recall with {s.pairs} pairs takes {s.turns} turns (an "
            f"acknowledgement of the instruction and of each pair, then the answer); set "
            f"data.max_turns={s.turns} or more, got {d.max_turns}"
        )


def context_need(
    d: DataSettings, tokenizer: PreTrainedTokenizerBase, longest: int, turn: int
) -> int:
    """Positions of a whole episode: the prompt (``longest`` tokens), each acknowledgement
    (``ok``, EOS) and the observation after it, then an answer of the turn budget ``turn``
    (counted on the first training episode: every fact is a letter and two digits)."""
    recall = kv_recall.draw(seeds(d.split_seed, 1, 0)[0][0], kv_recall.recall_settings(d.task_args))
    prompt = len(encode_prompt(tokenizer, kv_recall.INSTRUCTION))
    answer = len(kv_recall.turn_ids(tokenizer, recall.answer))
    return longest + len(kv_recall.episode_ids(tokenizer, recall)) - prompt - answer + turn


def check_model(
    d: DataSettings, max_new_tokens: int, tokenizer: PreTrainedTokenizerBase, context: int | None
) -> None:
    """ConfigError under ``data.context_policy=fail`` (today's behaviour, and the default)
    when a whole episode does not fit the model's ``context``: each would end truncated
    before its question, and nothing could be learned. Segments (``truncate_oldest``,
    ``compact``) are what the task is for."""
    if context is None or d.context_policy != "fail":
        return
    prompt = len(encode_prompt(tokenizer, kv_recall.INSTRUCTION))
    need = context_need(d, tokenizer, prompt, max_new_tokens)
    if need > context:
        pairs = kv_recall.recall_settings(d.task_args).pairs
        raise ConfigError(
            f"data.context_policy: kv_recall with {pairs} pairs takes {need} positions and the "
            f"model has {context}; under fail every episode would end truncated before its "
            "question: use truncate_oldest or compact (segments), or fewer pairs"
        )


def demonstrations(split: Split) -> list[Example]:
    """A window of the pairs of each training episode, then a question about one of them or
    an acknowledgement (:func:`rlmap.tasks.kv_recall.demonstration`); never a held-out one."""
    settings = kv_recall.recall_settings(split.task_args)
    train, _ = seeds(split.split_seed, split.train_size, split.eval_size)
    return [kv_recall.demonstration(seed, settings) for seed in train]


def warm_start(chat: bool) -> dict[str, Any]:
    """On a chat model, whose template renders a demonstration's messages into an episode's
    very ids, the default steps without the blur phase: the model's recall is blurred
    enough already (measured, docs/tasks.md: held-out pass@1 0.21, pass@8 0.50, the regime
    the blur phase is there to make). None without a template (a plain tokenizer would join
    the messages by newlines, not by the episode's EOS-ended turns): the model starts from
    its initialisation. Demonstrations version 2: with compaction summaries."""
    return {"blur_steps": 0, "demonstrations": 2} if chat else {"steps": 0, "blur_steps": 0}


KV_RECALL = TaskKind(
    name=NAME,
    matches=lambda task: task == NAME,
    splits=splits,
    prompts=prompts,
    environment=environment,
    check_model=check_model,
    check_settings=check_settings,
    context_need=context_need,
    multi_turn=True,
    demonstrations=demonstrations,
    warm_start=warm_start,
    embedded_model="embedded:tiny-chat",
    listing=(
        (
            NAME,
            "multi-turn: key-value pairs one per turn, then a question about an early one; "
            "longer than the model's window (data.context_policy)",
        ),
    ),
)
