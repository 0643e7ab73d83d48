"""The environment interface every task implements, and the single-turn environment.

An episode alternates the policy's turns and the environment's observations::

    ids = env.reset()                          # the prompt, as token ids
    loop:
        turn = policy samples after ids         # ends at EOS, at one of env.stop_token_ids
                                                # (e.g. the end of a tool call) or at the
                                                # length limit
        s = env.step(turn)                      # EnvStep
        if s.terminated or s.truncated: stop
        ids = ids + turn + s.observation         # observation tokens: action mask 0

``terminated`` and ``truncated`` follow Gymnasium's meaning. *Terminated*: the
episode reached a terminal state (an answer was given); its value is 0, nothing is
bootstrapped. *Truncated*: the episode was stopped from outside (the turn budget ran
out) in a state that has a future; credit bootstraps from the critic's value of that
final state, which includes ``observation`` (so a truncating step still returns
it). A turn cut by the length limit ends the episode truncated whatever the
environment says (:func:`rlmap.rollout.episodes.run_episodes`).

Failures: an exception raised by ``reset`` or ``step`` is an infrastructure failure:
the runner records the episode as ``aborted`` with reward status ``infra_error``,
never as a terminal state. A reward the environment could not compute (its verifier
crashed) is reported as ``status=INFRA_ERROR`` on the step.

One environment object runs one episode; a task makes one per prompt and sample.

Optionally an environment has ``stop_strings``
(:class:`~rlmap.engines.engine.StopStrings`): texts that end a turn however they are
spelled in tokens (``</tool_call>`` in a BPE vocabulary); the turn's ids are the
engine's, cut after the token that completes one, never re-encoded.

Optionally an environment has ``waits``: True when its ``step`` may wait on something
outside this process (a tool, a service, a verifier's worker process). The runner steps
the environments of a round concurrently when any of them waits, and one after another
otherwise (a thread pool costs more than 64 steps of pure Python, which the GIL runs
one at a time anyway). Without the attribute an environment is taken to wait.

Optionally an environment has ``replayable``: True when a fresh one from the same factory
and prompt, reset and given the same actions, always returns the same observations and
ends (and rewards, when its verifier is deterministic) — its state after k turns is a
function of the prompt and the first k actions (the calculator; a gymnasium environment,
which resets with the episode's seed; the key-value recall task). Re-running a trajectory's
actions then puts a new environment in the state the trajectory was in
(:mod:`rlmap.tasks.replay`: branching from one state). Without the attribute an environment
is taken not to be replayable (:func:`is_replayable`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rlmap.core.batch import RewardStatus
from rlmap.feedback.reward import verify_score
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.prompts import Messages, decode_response, encode_prompt

SUMMARY_LEAD = "summary: "
"""What a compaction summary's turn starts with (``data.context_policy=compact``): the
request to summarise, given to the policy as the first words of its own turn, so that the
template's roles stay as an episode has them; a task kind may set its own
(``TaskKind.summary_lead``)."""

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Verifier = Callable[[str, str], float]
"""(response text, reference answer) → reward."""


@dataclass(frozen=True)
class EnvStep:
    """What the environment returns after one policy turn."""

    observation: tuple[int, ...] = ()
    """Tokens appended after the turn (tool output); never trained on (action mask 0)."""
    reward: float = 0.0
    """Reward of this step (the outcome on the answering step; 0 on tool calls)."""
    terminated: bool = False
    """The episode reached a terminal state: no bootstrap."""
    truncated: bool = False
    """The episode stops in a non-terminal state (turn budget): bootstrap from its value."""
    status: RewardStatus = RewardStatus.OK
    """Whether ``reward`` can be trusted (a crashed verifier is ``INFRA_ERROR``)."""
    tool_call: bool = False
    """The turn was a tool call."""
    tool_error: bool = False
    """The tool call could not be executed (malformed input); the episode goes on."""
    tool_result: str | None = None
    """What a tool call that ran returned, as text before any framing (the calculator's
    ``3145``, not ``<result>3145</result>`` or the chat template's tool message); None for
    an answer or a failed call. What a process reward reads (:mod:`rlmap.feedback.process`)."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (see the module docstring)."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens besides EOS that end a policy turn and hand over to ``step``."""
        ...

    def reset(self) -> list[int]:
        """The prompt's token ids; called once, before the first turn."""
        ...

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        """React to one policy turn (its tokens, the stop token included)."""
        ...


EnvFactory = Callable[[Example], Environment]
"""Makes the environment of one episode on one prompt."""


def is_replayable(env: Environment) -> bool:
    """Whether ``env`` declares itself replayable (module docstring): ``replayable`` is True."""
    return getattr(env, "replayable", False) is True


def verify_safely(verify: Verifier, response: str, reference: str) -> tuple[float, RewardStatus]:
    """The verifier's reward, isolating failures: a crash or a timeout is not a zero.

    :func:`rlmap.feedback.reward.verify_score`'s mapping: ``TimeoutError`` → ``timeout``,
    ``InvalidOutput`` → ``invalid``, any other exception → ``infra_error``. A failed
    sample is excluded and counted, its 0.0 never used.
    """
    score = verify_score(verify, response, reference)
    return score.value, score.status


def reference_for(example: Example, items: bool) -> str:
    """What a verifier checks a response to ``example`` against: the item's key
    (``example.reference``) for a verifier that reads items, else the answer."""
    if items:
        if example.reference is None:
            raise ValueError("the verifier reads items, and this example is no task's item")
        return example.reference
    return example.answer


PromptIds = Callable[[str | Messages], list[int]]
"""A prompt's text (or chat messages) → its ids (:func:`rlmap.tasks.prompts.encode_prompt`,
or a shared :class:`~rlmap.tasks.prompts.PromptEncoder`)."""


class AnswerEnv:
    """Single turn: the prompt, one response, its verdict; every episode ends terminated.

    ``encode``: the prompt encoder (default :func:`encode_prompt` with ``tokenizer``; a
    task's factory shares one :class:`~rlmap.tasks.prompts.PromptEncoder` among its
    environments). ``verify_waits``: whether ``verify`` waits on another process
    (``rlmap.feedback.Verifier.waits``), which makes the environment's ``waits`` (module
    docstring); an unknown verifier is taken to.
    """

    stop_token_ids: tuple[int, ...] = ()

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        example: Example,
        verify: Verifier,
        *,
        encode: PromptIds | None = None,
        verify_waits: bool = True,
    ) -> None:
        self.tokenizer, self.example, self.verify = tokenizer, example, verify
        self.encode = partial(encode_prompt, tokenizer) if encode is None else encode
        self.waits = verify_waits

    def reset(self) -> list[int]:
        return self.encode(self.example.chat)

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        return answer_step(self.tokenizer, self.verify, self.example, action_ids)


def answer_step(
    tokenizer: PreTrainedTokenizerBase,
    verify: Verifier,
    example: Example,
    action_ids: Sequence[int],
) -> EnvStep:
    """The step of a turn that answers: its text's verdict against the example's answer; the
    episode ends terminated."""
    text = decode_response(tokenizer, tuple(action_ids))
    reward, status = verify_safely(verify, text, example.answer)
    return EnvStep(reward=reward, terminated=True, status=status)
