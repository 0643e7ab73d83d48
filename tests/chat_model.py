"""A chat model in miniature for the token-in-token-out tests: the embedded chat model's
byte-level BPE tokenizer with the ChatML template, and a small Qwen2 on it that has
learned one tool-call conversation by heart, with ``</tool_call>`` spelled one byte per
token, as a policy may sample it (the tokenizer itself would encode it otherwise)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rlmap.core.batch import End
from rlmap.embedded.tiny import TinySpec, build_tiny_model
from rlmap.embedded.warmstart import chat_tokenizer as embedded_chat_tokenizer
from rlmap.engines.engine import Completion, RolloutEngine
from rlmap.rollout.episodes import run_episodes
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.calculator import calculator_tool
from rlmap.tasks.env import Environment
from rlmap.tasks.tool_calls import CLOSE, ToolEnv, observation_ids

QUESTION, EXPRESSION, RESULT = "37*85=", "37*85", "3145"
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*85"}}'
"""Turn 0 without its closing tag."""
SPEC = TinySpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=128,
)


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """The embedded chat model's tokenizer (byte-level BPE, ChatML)."""
    return embedded_chat_tokenizer()


def bytewise(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """``text`` one token per character (each is a byte token of the vocabulary)."""
    return [int(tokenizer.convert_tokens_to_ids(c)) for c in text]


def conversation(
    tokenizer: PreTrainedTokenizerFast, question: str = QUESTION
) -> tuple[list[int], list[list[int]]]:
    """(prompt ids, [turn 0, observation, turn 1]) of the conversation the model learns:
    whatever the question, the call of ``CALL`` and the answer ``RESULT``."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = [int(i) for i in tokenizer.encode(str(prompt), add_special_tokens=False)]
    turn0 = [int(i) for i in tokenizer.encode(CALL, add_special_tokens=False)]
    turn0 += bytewise(tokenizer, CLOSE)
    turn1 = [int(i) for i in tokenizer.encode(RESULT, add_special_tokens=False)]
    turn1 += [int(tokenizer.eos_token_id)]
    return prompt_ids, [turn0, observation_ids(tokenizer, RESULT), turn1]


QUESTIONS = (QUESTION, "12*34=", "56*78=", "90*11=", "23*45=", "67*89=")
"""The questions it learns the conversation on (so that it answers any product alike)."""


def scripted_model(steps: int = 300, questions: Sequence[str] = QUESTIONS) -> PreTrainedModel:
    """The small Qwen2 trained until greedy decoding replays :func:`conversation` on each
    of ``questions``."""
    tokenizer = chat_tokenizer()
    rows = []
    for question in questions:
        prompt, parts = conversation(tokenizer, question)
        rows.append(prompt + [t for part in parts for t in part])
    width = max(len(r) for r in rows)  # right-padded; the padding is not learned
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in rows])
    model = build_tiny_model(tokenizer, SPEC, seed=0)
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    return model.eval()


class Recording:
    """An engine that keeps what every ``generate`` call returned."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine, self.calls = engine, []  # type: list[list[Completion]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompts: Sequence[Sequence[int]], **kw: Any) -> list[list[Completion]]:
        out = self.engine.generate(prompts, **kw)
        self.calls.append([c for (c,) in out])
        return out


def check_token_in_token_out(engine: RolloutEngine, env: Environment | None = None) -> None:
    """The episode of the scripted model: every turn's ids are the engine's, token for
    token; the observation is the template's; re-encoding the text would change the ids.
    ``env``: the episode's environment on ``QUESTION`` (default rlmap's own ToolEnv with the
    calculator), which must answer the call with the tool message ``RESULT``."""
    tokenizer = chat_tokenizer()
    prompt, (turn0, observation, turn1) = conversation(tokenizer)
    if env is None:
        env = ToolEnv(
            tokenizer,
            Example(QUESTION, RESULT),
            lambda r, a: float(r.strip() == a),
            {"calculator": calculator_tool},
            max_turns=3,
        )
    recording = Recording(engine)
    (episode,) = run_episodes(recording, [env], max_new_tokens=48, temperature=0.0, top_p=1.0)
    assert list(episode.prompt_ids) == prompt
    assert [len(call) for call in recording.calls] == [1, 1]  # two turns, one episode each
    (first,), (second,) = recording.calls
    assert first.response_ids == tuple(turn0) and first.stopped  # cut at the stop string
    assert second.response_ids == tuple(turn1) and second.stopped  # EOS
    assert second.prompt_ids == tuple(prompt + turn0 + observation)  # nothing re-encoded
    assert list(episode.response_ids) == turn0 + observation + turn1
    assert episode.action == (True,) * len(turn0) + (False,) * len(observation) + (True,) * len(
        turn1
    )
    assert episode.logprobs == first.logprobs + (0.0,) * len(observation) + second.logprobs
    assert episode.end == End.TERMINAL and episode.rewards == (0.0, 1.0) and episode.tool_calls == 1
    # what a loop that decodes and re-encodes the conversation would have trained on instead
    text = tokenizer.decode(list(episode.prompt_ids + episode.response_ids))
    reencoded = tokenizer.encode(text, add_special_tokens=False)
    assert reencoded != list(episode.prompt_ids + episode.response_ids)
    assert tokenizer.decode(reencoded) == text  # the same text, other ids
    closing = tokenizer.encode(CALL + CLOSE, add_special_tokens=False)
    assert closing[-len(bytewise(tokenizer, CLOSE)) :] != bytewise(tokenizer, CLOSE)
