"""The episodes of a verifiers environment (:mod:`rlmap.tasks.verifiers_env`) in rlmap's tokens.

The environment runs its own rollout (its ``MultiTurnEnv`` loop: ``env_response``, tools,
stop conditions) and its own rubric; rlmap's engine plays the model. Each call the
environment makes for a model response is answered by the episode's next policy turn
(:class:`Turns`, a verifiers ``Client``), so the conversation is verifiers' while the tokens
are rlmap's, token in and token out:

- the first request's messages (with the environment's tools, for the chat template's
  ``tools=``) are the prompt's ids;
- each later request must extend the conversation: the messages it adds after the policy's
  turn (tool results, the environment's user turns) are rendered with the chat template and
  appended after the exact sampled ids (:func:`rlmap.tasks.tool_calls.tail_ids`); the
  conversation so far is never re-encoded. An environment that rewrites earlier messages
  cannot be trained on as one token sequence: the episode is aborted;
- a turn with a Qwen-style ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (a stop
  string: the turn ends at it) reaches the environment as an OpenAI tool call; one whose JSON
  does not parse is passed on with its raw text as arguments, so that the environment answers
  with its own error, and is counted as a tool error.

When the rollout ends the episode ends with the rubric's reward: *truncated* when a budget
stopped it (``max_turns_reached`` and the like, checked after the environment's own stop
conditions; not the one turn of a ``SingleTurnEnv``, which is its whole episode),
*terminated* otherwise. The environment's ``max_turns`` must fit in ``data.max_turns``,
and one without a budget gets rlmap's (:func:`~rlmap.tasks.verifiers_env.fit_turn_budget`).
Failures are infrastructure, never a zero reward: an environment that raises (in
``setup_state``, ``env_response``, a tool set up to stop the rollout) or records an error
aborts the episode, and a weighted reward function that raises or returns no number —
verifiers itself would score it 0.0 — makes the reward ``infra_error``; a rollout past the
environment's ``timeout_seconds`` is a ``timeout`` (one past it before its first turn, in
its own set-up, aborts). All are excluded and counted.

The rollouts run on one asyncio event loop in a daemon thread (:class:`Loop`), each episode's
coroutine waiting in :class:`Turns` for its next turn; an episode the runner drops (its context
is full) has its rollout cancelled when it is collected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import queue
import threading
import uuid
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlmap.core.batch import RewardStatus
from rlmap.core.errors import ConfigError, first_line
from rlmap.engines.engine import StopStrings
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvStep
from rlmap.tasks.prompts import encode_prompt
from rlmap.tasks.tool_calls import CLOSE, OPEN, ToolCallError, decoder, parse_tool_call, tail_ids
from rlmap.tasks.verifiers_env import (
    FAILED_REWARDS,
    TRUNCATING_STOPS,
    content_text,
    fit_turn_budget,
    load,
    require,
    rows,
    tool_schemas,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TURN_TIMEOUT_S = 600.0
"""Seconds the environment may take to answer a turn (its tools, its rubric) before the
episode is aborted as an infrastructure failure."""


TIMED_OUT = "timeout_reached"
"""The stop condition of a rollout past the environment's ``timeout_seconds``: verifiers scores
what it has (without the turn rlmap was generating, when that is where the time ran out), so
the episode is a timeout (excluded, counted), whatever that score."""


MODEL = "rlmap-policy"
"""The model name the environment's requests carry (rlmap's engine answers them all)."""


class Loop:
    """An asyncio event loop in a daemon thread, where the environment's rollouts run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="rlmap-verifiers", daemon=True)
        thread.start()

    def submit(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


@dataclass(frozen=True)
class Request:
    """The environment asks for the next policy turn after ``messages``."""

    messages: list[Any]
    tools: list[Any] | None
    reply: asyncio.Future[Any]


@dataclass(frozen=True)
class Finished:
    """The rollout ended: verifiers' output, or what it raised; the reward functions that
    failed."""

    output: Mapping[str, Any] | None
    error: BaseException | None
    failed_rewards: tuple[str, ...]


def turns_client(vf: Any, events: queue.Queue[Request | Finished]) -> Any:
    """A verifiers ``Client`` whose responses are the policy's turns: each request is put on
    ``events`` and waits for :class:`VerifiersEnv` to answer it."""
    return _turns_class(vf)(events)


@functools.cache
def _turns_class(vf: Any) -> Any:
    """The ``Client`` subclass of :func:`turns_client` (made once: verifiers is imported late)."""

    class Turns(vf.Client):
        def __init__(self, events: queue.Queue[Request | Finished]) -> None:
            super().__init__(None)
            self.events = events

        def setup_client(self, config: Any) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(
            self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **_: Any
        ) -> Any:
            reply = asyncio.get_running_loop().create_future()
            self.events.put(Request(list(prompt), tools, reply))
            return await reply

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return Turns


async def _rollout(
    env: Any, row: Mapping[str, Any], client: Any, events: queue.Queue[Request | Finished]
) -> None:
    failed: list[str] = []
    FAILED_REWARDS.set(failed)  # this task's own context: its reward functions record here
    try:
        output = await env.run_rollout(dict(row), client, MODEL, {})
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # the environment's failure, whatever it is
        events.put(Finished(None, exc, tuple(failed)))
        return
    events.put(Finished(output, None, tuple(failed)))


class VerifiersEnv:
    """One episode of a verifiers environment in tokens (module docstring)."""

    waits = True  # the rollout runs on another thread: stepping waits on it

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, env: Any, row: Mapping[str, Any], loop: Loop
    ) -> None:
        self.tokenizer, self.env, self.row, self.loop = tokenizer, env, row, loop
        self.stop_token_ids: tuple[int, ...] = ()
        self.stop_strings = StopStrings((CLOSE,), decoder(tokenizer))
        self.events: queue.Queue[Request | Finished] = queue.Queue()
        self.pending: Request | None = None
        self.shown: list[tuple[str, str]] = []  # the conversation already in tokens
        self.ended: int | None = None  # the stop token the last turn ended with, if any

    def reset(self) -> list[int]:
        client = turns_client(require(), self.events)
        self.rollout = self.loop.submit(_rollout(self.env, self.row, client, self.events))
        weakref.finalize(self, self.rollout.cancel)  # dropped by the runner: its rollout too
        event = self._next()
        if not isinstance(event, Request):
            raise RuntimeError(f"the environment ended before the first turn: {_why(event)}")
        self.pending, self.shown = event, _texts(event.messages)
        return encode_prompt(self.tokenizer, tuple(self.shown), tool_schemas(event.tools))

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        if self.pending is None:
            raise RuntimeError("step() without a pending request: reset() first")
        response, call, malformed = self._response(action_ids)
        eos = self.tokenizer.eos_token_id
        self.ended = eos if action_ids and int(action_ids[-1]) == eos else None
        reply = self.pending.reply
        self.loop.loop.call_soon_threadsafe(_answer, reply, response)
        event = self._next()
        if isinstance(event, Request):
            self.pending = event
            return EnvStep(
                observation=tuple(self._tail(event.messages)), tool_call=call, tool_error=malformed
            )
        self.pending = None
        if event.error is not None or event.output is None:
            raise RuntimeError(f"the verifiers environment failed: {_why(event)}")
        output = event.output
        if output.get("error"):
            raise RuntimeError(f"the verifiers environment failed: {_error_text(output['error'])}")
        if output.get("stop_condition") == TIMED_OUT:  # whatever the rubric made of the rest
            return EnvStep(
                truncated=True, tool_call=call, tool_error=malformed, status=RewardStatus.TIMEOUT
            )
        # a budget stopped it, except the one turn that is a SingleTurnEnv's whole episode
        single = isinstance(self.env, require().SingleTurnEnv)
        truncated = output.get("stop_condition") in TRUNCATING_STOPS and not single
        if event.failed_rewards:
            return EnvStep(
                terminated=not truncated,
                truncated=truncated,
                tool_call=call,
                tool_error=malformed,
                status=RewardStatus.INFRA_ERROR,
            )
        return EnvStep(
            reward=float(output.get("reward") or 0.0),
            terminated=not truncated,
            truncated=truncated,
            tool_call=call,
            tool_error=malformed,
        )

    def _next(self) -> Request | Finished:
        try:
            return self.events.get(timeout=TURN_TIMEOUT_S)
        except queue.Empty:
            raise TimeoutError(
                f"the verifiers environment did not answer a turn in {TURN_TIMEOUT_S:.0f} s"
            ) from None

    def _response(self, action_ids: Sequence[int]) -> tuple[Any, bool, bool]:
        """(verifiers Response of the turn, whether it calls a tool, whether the call is
        malformed)."""
        vf = require()
        ids = [int(i) for i in action_ids]
        raw = str(self.tokenizer.decode(ids, skip_special_tokens=False))
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        calls, finish, malformed = None, "stop", False
        if CLOSE in raw:  # cut at the token completing the tag (the token may go on)
            content, _, rest = text.partition(OPEN)
            try:
                name, arguments = parse_tool_call(text)
                arguments_text = json.dumps(arguments)
            except ToolCallError:
                name, arguments_text, malformed = "", rest.split(CLOSE)[0], True
            calls = [
                vf.ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=name, arguments=arguments_text)
            ]
            text, finish = content, "tool_calls"
        elif not ids or ids[-1] != self.tokenizer.eos_token_id:
            finish = "length"
        message = vf.ResponseMessage(
            content=text, tool_calls=calls, finish_reason=finish, is_truncated=finish == "length"
        )
        response = vf.Response(id=uuid.uuid4().hex, created=0, model=MODEL, message=message)
        return response, calls is not None, malformed

    def _tail(self, messages: list[Any]) -> list[int]:
        """Ids of what the environment added after the policy's turn (module docstring). A turn
        that ended at the end-of-turn token already holds the template's first token after it
        (ChatML's ``<|im_end|>``), so the tail starts after it."""
        texts, n = _texts(messages), len(self.shown)
        added = texts[n + 1 :]
        if (
            texts[:n] != self.shown
            or len(texts) < n + 2  # the policy's turn, then at least one message
            or texts[n][0] != "assistant"
            or any(role == "assistant" for role, _ in added)
        ):
            raise RuntimeError(
                "the verifiers environment rewrote the conversation; rlmap trains "
                "on one token sequence per episode"
            )
        self.shown = texts
        ids = tail_ids(self.tokenizer, added)
        return ids[1:] if self.ended is not None and ids[:1] == [self.ended] else ids


def _texts(messages: Sequence[Any]) -> list[tuple[str, str]]:
    """(role, content text) of each message: what the chat template renders into tokens."""
    return [(str(m.role), content_text(m.content)) for m in messages]


def _answer(reply: asyncio.Future[Any], response: Any) -> None:
    if not reply.done():
        reply.set_result(response)


def _why(event: Request | Finished) -> str:
    if isinstance(event, Request):
        return "it asked for a turn"
    if event.error is not None:
        return f"{type(event.error).__name__}: {first_line(event.error)}"
    error = (event.output or {}).get("error")
    return (
        _error_text(error)
        if error
        else f"stop condition {(event.output or {}).get('stop_condition')}"
    )


def _error_text(error: Any) -> str:
    """A rollout's recorded error in a line: of verifiers' ``ErrorData`` (error, message, the
    chain's repr and str), the chain's repr, which holds the cause a wrapping error's message
    lacks (``ToolCallError() -> PermissionError('...')``), not the dict."""
    if isinstance(error, Mapping):
        error = error.get("error_chain_repr") or f"{error.get('error')}: {error.get('message')}"
    return (str(error).strip().splitlines() or ["an error"])[0]


def factory(
    tokenizer: PreTrainedTokenizerBase,
    task: str,
    task_args: Mapping[str, Any] | None,
    max_turns: int,
) -> Callable[[Example], VerifiersEnv]:
    """The environment maker of a verifiers task, ``max_turns`` turns at most
    (:func:`fit_turn_budget`): one rollout loop shared by its episodes."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "model.path: verifiers environments speak in chat messages; the model "
            "needs a chat template (the embedded chat model: "
            "model.path=embedded:tiny-chat)"
        )
    env = load(task, task_args)
    fit_turn_budget(env, task, max_turns)
    train, heldout = rows(task, task_args)
    table = {"train": train, "eval": heldout or []}
    loop = Loop()

    def make(e: Example) -> VerifiersEnv:
        split, _, index = (e.reference or "").partition(":")
        return VerifiersEnv(tokenizer, env, table[split][int(index)], loop)

    return make
