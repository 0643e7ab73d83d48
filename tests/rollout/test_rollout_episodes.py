"""Multi-turn episodes: the runner, the batch layout, and where gradient may flow.

A scripted engine stands in for the model where the test is about bookkeeping; the
tiny Hugging Face model (and critic) where it is about gradients and values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.core.batch import End, RewardStatus
from rlmap.correction import BehaviourParams, KLParams
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.engines.engine import Completion
from rlmap.estimators import CreditParams, registry
from rlmap.feedback.verifiers import exact_match
from rlmap.learner import logprobs as logprobs_module
from rlmap.learner.critic import (
    CriticSettings,
    compute_values,
    critic_outputs,
    load_critic,
    update_critic,
)
from rlmap.learner.policy import UpdateSettings, update_policy
from rlmap.learner.update_loop import Schedule
from rlmap.reduction import ReductionParams
from rlmap.rollout.episode_stats import episode_metrics
from rlmap.rollout.episodes import Episode, run_episodes
from rlmap.rollout.packing import Scored, to_batch
from rlmap.tasks.arithmetic import make_problem
from rlmap.tasks.calculator import TOOL_TOKENS, CalculatorEnv
from rlmap.tasks.env import AnswerEnv, EnvStep

TOKENIZER = build_tokenizer(extra_tokens=TOOL_TOKENS)
EOS = int(TOKENIZER.eos_token_id)
LOGPROB = -0.25
VERSION = 7


def ids(text: str) -> list[int]:
    return [int(i) for i in TOKENIZER.encode(text, add_special_tokens=False)]


class Scripted:
    """A rollout engine whose next turn is ``script(context text)``, cut like a real one."""

    def __init__(self, script: Callable[[str], str]) -> None:
        self.script = script
        self.contexts: list[str] = []

    @property
    def version(self) -> int:
        return VERSION

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: Sequence[int] = (),
        stop_strings: object = None,
    ) -> list[list[Completion]]:
        out = []
        for p in prompts:
            context = TOKENIZER.decode(list(p))
            self.contexts.append(context)
            want = ids(self.script(context).replace("<eos>", "")) + (
                [EOS] if self.script(context).endswith("<eos>") else []
            )
            stops = {EOS, *stop_token_ids}
            cut = next((k + 1 for k, t in enumerate(want) if t in stops), len(want))
            response = tuple(want[: min(cut, max_new_tokens)])
            stopped = cut <= max_new_tokens and response[-1] in stops
            out.append(
                [Completion(tuple(p), response, (LOGPROB,) * len(response), stopped, VERSION)]
            )
        return out

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        raise NotImplementedError


def calc_env(a: int, b: int, max_turns: int = 3) -> CalculatorEnv:
    return CalculatorEnv(TOKENIZER, make_problem(a, "*", b), exact_match, max_turns=max_turns)


def run(script: Callable[[str], str], envs: list, max_new_tokens: int = 16) -> list[Episode]:  # type: ignore[type-arg]
    return run_episodes(
        Scripted(script), envs, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0
    )


def tool_then_answer(context: str) -> str:
    """Call the tool once, then copy its result."""
    if "<result>" not in context:
        return f"<calc>{context.removeprefix('<bos>').removesuffix('=')}</calc>"
    return context.split("<result>")[-1].split("</result>")[0] + "<eos>"


# --- the runner --------------------------------------------------------------------------


def test_tool_episode_layout_actions_observations_turns_and_reward() -> None:
    (e,) = run(tool_then_answer, [calc_env(37, 85)])
    text = TOKENIZER.decode(list(e.response_ids))
    assert text == "<calc>37*85</calc><result>3145</result>3145<eos>"
    call, obs, answer = len(ids("<calc>37*85</calc>")), len(ids("<result>3145</result>")), 5
    assert e.action == (True,) * call + (False,) * obs + (True,) * answer
    assert e.turn_ids == (0,) * call + (-1,) * obs + (1,) * answer
    assert e.logprobs == (LOGPROB,) * call + (0.0,) * obs + (LOGPROB,) * answer
    assert e.versions == (VERSION,) * call + (0,) * obs + (VERSION,) * answer
    assert e.end == End.TERMINAL and e.eos and e.rewards == (0.0, 1.0) and e.outcome == 1.0
    assert (e.turns, e.tool_calls, e.tool_errors, e.action_tokens) == (2, 1, 0, call + answer)


def test_the_engine_sees_the_observation_in_the_next_turns_context() -> None:
    engine = Scripted(tool_then_answer)
    run_episodes(engine, [calc_env(3, 4)], max_new_tokens=16, temperature=1.0, top_p=1.0)
    assert engine.contexts == ["<bos>3*4=", "<bos>3*4=<calc>3*4</calc><result>12</result>"]


def test_turn_budget_truncates_and_keeps_the_final_observation() -> None:
    (e,) = run(lambda c: "<calc>1+1</calc>", [calc_env(2, 2, max_turns=2)])
    assert e.end == End.TRUNCATED and e.eos  # stopped by the budget, not the length limit
    assert TOKENIZER.decode(list(e.response_ids)).endswith("<result>2</result>")
    assert not e.action[-1] and e.turns == 2 and e.tool_calls == 2 and e.outcome == 0.0


def test_a_turn_cut_by_the_length_limit_truncates_the_episode() -> None:
    (e,) = run(lambda c: "<calc>11111111*2</calc>", [calc_env(2, 2)], max_new_tokens=4)
    assert e.end == End.TRUNCATED and not e.eos and e.turns == 1 and e.action_tokens == 4
    assert e.tool_calls == 0  # the call never closed: the environment saw an (unfinished) answer


def test_episodes_of_one_call_run_independently_and_keep_their_order() -> None:
    envs = [calc_env(2, 3), AnswerEnv(TOKENIZER, make_problem(2, "+", 2), exact_match)]

    def script(context: str) -> str:
        return "4<eos>" if "+" in context else tool_then_answer(context)

    tool, answer = run(script, envs)
    assert tool.turns == 2 and tool.outcome == 1.0
    assert answer.turns == 1 and answer.outcome == 1.0 and answer.end == End.TERMINAL


class Exploding:
    """An environment that fails at a chosen moment."""

    stop_token_ids: tuple[int, ...] = ()

    def __init__(self, at: str) -> None:
        self.at = at

    def reset(self) -> list[int]:
        if self.at == "reset":
            raise ConnectionError("sandbox unreachable")
        return ids("1+1=")

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        raise TimeoutError("tool hung")


@pytest.mark.parametrize("at", ["reset", "step"])
def test_an_environment_failure_aborts_the_episode_as_infra_error(at: str) -> None:
    envs = [Exploding(at), AnswerEnv(TOKENIZER, make_problem(1, "+", 1), exact_match)]
    failed, fine = run(lambda c: "2<eos>", envs)
    assert failed.end == End.ABORTED and failed.status == RewardStatus.INFRA_ERROR
    assert fine.end == End.TERMINAL and fine.outcome == 1.0  # the others carry on
    metrics = episode_metrics([failed, fine])
    assert metrics["aborted_frac"] == 0.5


def test_episode_metrics_by_hand() -> None:
    eps = run(
        lambda c: "<calc>1*</calc>" if "<result>" not in c else "0<eos>",
        [calc_env(1, 1), calc_env(1, 2, max_turns=1)],
    )
    # episode 0: error call, then answer "0" (wrong) -> 2 turns, 1 call, 1 error, terminal
    # episode 1: error call, budget of 1 turn spent -> 1 turn, 1 call, 1 error, truncated
    m = episode_metrics(eps)
    assert m == {
        "turns": 1.5,  # (2 + 1) / 2
        "tool_call_rate": 1.0,
        "tool_calls": 1.0,  # 2 calls / 2 episodes
        "tool_error_frac": 1.0,  # 2 errors / 2 calls
        "turn_budget_frac": 0.5,
        "aborted_frac": 0.0,
    }


# --- the batch ---------------------------------------------------------------------------


def _scored(episodes: list[Episode]) -> list[Scored]:
    return [Scored(e, i, e.outcome, e.outcome, e.status) for i, e in enumerate(episodes)]


def test_to_batch_places_observations_off_the_action_mask_with_turn_ids() -> None:
    eps = run(tool_then_answer, [calc_env(37, 85), calc_env(2, 3)])
    batch = to_batch(_scored(eps), pad_token_id=int(TOKENIZER.pad_token_id))
    assert batch.turn_id is not None and batch.attention_mask is not None
    for i, e in enumerate(eps):
        row = batch.attention_mask[i]
        real = batch.tokens[i][row].tolist()
        assert real == [*e.prompt_ids, *e.response_ids]
        response = slice(len(real) - len(e.response_ids), len(real))
        on_row = torch.nonzero(row).squeeze(-1)[response]
        assert batch.action_mask[i, on_row].tolist() == list(e.action)
        assert batch.turn_id[i, on_row].tolist() == list(e.turn_ids)
    observation = batch.attention_mask & ~batch.action_mask & (batch.turn_id == -1)
    assert batch.behavior_logprobs[observation].abs().sum() == 0  # observations carry no μ
    assert batch.token_rewards is None  # outcome reward only: R at the last action token


def test_intermediate_rewards_go_to_each_turns_last_action_token() -> None:
    e = Episode(
        prompt_ids=(1, 5),
        response_ids=(6, 7, 8, 9, 10),
        action=(True, True, False, True, True),
        logprobs=(0.0,) * 5,
        versions=(0,) * 5,
        turn_ids=(0, 0, -1, 1, 1),
        end=End.TERMINAL,
        eos=True,
        rewards=(0.5, 1.0),
        status=RewardStatus.OK,
    )
    # shaped return 1.5 - 0.25: the shaping (-0.25) is in the last turn's reward
    scored = Scored(e, 0, 1.5, 1.25, RewardStatus.OK, per_turn=(0.5, 0.75))
    batch = to_batch([scored], pad_token_id=0)
    assert batch.token_rewards is not None
    assert batch.token_rewards[0].tolist() == [0, 0, 0, 0.5, 0, 0, 0.75]
    assert batch.rewards.tolist() == [1.25]


# --- gradients and values on a real (tiny) model ------------------------------------------


def _tool_batch(model_dir: Path) -> tuple[list[Episode], object]:
    # one terminal episode (call, answer) and one truncated by a one-turn budget (call only)
    terminal = run(tool_then_answer, [calc_env(3, 4)])[0]
    truncated = run(tool_then_answer, [calc_env(5, 6, max_turns=1)])[0]
    assert terminal.end == End.TERMINAL and truncated.end == End.TRUNCATED
    return [terminal, truncated], to_batch(_scored([terminal, truncated]), pad_token_id=0)


def _observations(eps: list[Episode], batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """(B, T) bool: observation tokens, located from the episodes (not from the batch's mask)."""
    out = torch.zeros_like(batch.action_mask)
    for i, e in enumerate(eps):
        cols = torch.nonzero(batch.attention_mask[i]).squeeze(-1)[len(e.prompt_ids) :]
        out[i, cols] = ~torch.tensor(e.action)
    return out


def test_observation_tokens_get_no_policy_gradient(
    tiny_calc_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eps, batch = _tool_batch(tiny_calc_model_dir)
    policy = AutoModelForCausalLM.from_pretrained(tiny_calc_model_dir)
    # The prediction at position p is the LM head's input there: the chunked log-probs take
    # the final hidden states (B·(T−1), H) and apply the head position by position.
    captured: list[torch.Tensor] = []
    real = logprobs_module.ChunkedLogprobs.apply

    def keep_hidden(hidden, *rest):  # type: ignore[no-untyped-def]
        hidden.retain_grad()
        captured.append(hidden)
        return real(hidden, *rest)

    monkeypatch.setattr(logprobs_module.ChunkedLogprobs, "apply", keep_hidden)
    # Advantages set everywhere — on observation, prompt and padding positions too: the
    # action mask, not the advantage, must keep them out of the loss.
    adv = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(0))
    s = UpdateSettings(
        behaviour=BehaviourParams(),
        kl=KLParams(),
        reduction=ReductionParams(),
        schedule=Schedule(epochs=1, minibatches=1, micro_batch_size=2, max_grad_norm=1.0),
        temperature=1.0,
    )
    sgd = torch.optim.SGD(policy.parameters(), lr=0.0)
    update_policy(
        policy,
        sgd,
        torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0),
        batch,
        adv,
        s,
        learner_version=VERSION,
        generator=torch.Generator(),
    )
    (hidden,) = captured
    per_position = hidden.grad.abs().sum(-1).view(batch.size, -1)  # (B, T − 1)
    grad = torch.cat([per_position, per_position.new_zeros(batch.size, 1)], dim=1)  # (B, T)
    predicts_obs = _next_is(_observations(eps, batch))
    predicts_action = _next_is(batch.action_mask)
    assert predicts_obs.any(-1).all()  # both rows have observation tokens
    assert grad[predicts_obs].max() == 0.0
    assert (grad[predicts_action] > 0).all()


def _next_is(mask: torch.Tensor) -> torch.Tensor:
    """(B, T): position p predicts a token where ``mask`` is set (mask at p + 1)."""
    out = torch.zeros_like(mask)
    out[:, :-1] = mask[:, 1:]
    return out


def _critic(model_dir: Path) -> torch.nn.Module:
    return load_critic(model_dir, dtype=torch.float32, seed=0)


def test_observation_tokens_get_no_value_gradient(tiny_calc_model_dir: Path) -> None:
    eps, batch = _tool_batch(tiny_calc_model_dir)
    critic = _critic(tiny_calc_model_dir)
    values, bootstrap = compute_values(critic, batch, micro_batch_size=2)
    batch = batch.replace(values=values, bootstrap_values=bootstrap)
    captured: list[torch.Tensor] = []

    def keep_logits(module, args, kwargs, output):  # type: ignore[no-untyped-def]
        output.logits.retain_grad()
        captured.append(output.logits)

    critic.register_forward_hook(keep_logits, with_kwargs=True)
    returns = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(1))
    settings = CriticSettings(
        value_clip=100.0,
        updates=1,
        schedule=Schedule(epochs=1, minibatches=1, micro_batch_size=2, max_grad_norm=1.0),
    )
    sgd = torch.optim.SGD(critic.parameters(), lr=0.0)
    update_critic(
        critic,
        sgd,
        torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0),
        batch,
        returns,
        settings,
        generator=torch.Generator(),
    )
    (outputs,) = captured
    grad = outputs.grad[..., 0].abs()  # (B, T): gradient reaching V(state after token p)
    # no state before an observation token is a value target ...
    predicts_obs = _next_is(_observations(eps, batch))
    assert predicts_obs.any(-1).all()
    assert grad[predicts_obs].max() == 0.0
    # ... only states an action is taken in: p with an action token at p + 1
    assert grad[~_next_is(batch.action_mask)].max() == 0.0
    assert (grad[_next_is(batch.action_mask)] > 0).all()


@pytest.mark.parametrize("time_unit", ["token", "turn"])
def test_turn_budget_truncation_bootstraps_from_the_state_after_the_observation(
    tiny_calc_model_dir: Path, time_unit: str
) -> None:
    # γ = 1, λ = 1: the last turn's advantage is  r + V(s_final) − V(s_last)  when truncated
    # (V(s_final) = critic output at the last real token: after the tool's observation) and
    # r − V(s_last) when terminal. For turns, V(s_last) is V at the turn's first token.
    eps, batch = _tool_batch(tiny_calc_model_dir)
    critic = _critic(tiny_calc_model_dir)
    values, bootstrap = compute_values(critic, batch, micro_batch_size=2)
    batch = batch.replace(values=values, bootstrap_values=bootstrap)
    params = CreditParams(estimator="gae", gamma=1.0, lam=1.0, time_unit=time_unit)
    credit = registry.get("gae").fn(batch, params)
    for i, e in enumerate(eps):
        full = torch.tensor([[*e.prompt_ids, *e.response_ids]])
        with torch.no_grad():
            out = critic_outputs(critic, full, torch.ones_like(full, dtype=torch.bool))[0]
        p = len(e.prompt_ids)
        last_turn = max(e.turn_ids)
        cols = [p + k for k, t in enumerate(e.turn_ids) if t == last_turn]
        start = cols[-1] if time_unit == "token" else cols[0]
        v_last = out[start - 1]  # V of the state the (last) action was taken in
        row_cols = torch.nonzero(batch.attention_mask[i]).squeeze(-1)
        adv = credit.advantages[i, row_cols[cols[-1]]]
        if e.end == End.TRUNCATED:
            assert abs(float(out[-1])) > 1e-4  # the bootstrap term is visible
            assert float(bootstrap[i]) == pytest.approx(float(out[-1]), abs=1e-5)
            torch.testing.assert_close(adv, e.outcome + out[-1] - v_last, atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(adv, e.outcome - v_last, atol=1e-5, rtol=0)


def test_the_tokenizer_fixture_has_the_markers(tiny_calc_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_calc_model_dir)
    assert tok.encode("</calc>", add_special_tokens=False) == ids("</calc>")


class Endless:
    """An environment that never ends an episode (a bug the runner must survive)."""

    stop_token_ids: tuple[int, ...] = ()

    def reset(self) -> list[int]:
        return ids("1+1=")

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        return EnvStep(observation=tuple(ids("?")))


def test_an_episode_without_room_for_a_whole_turn_in_the_context_ends_truncated() -> None:
    # prompt "1+1=" is 4 ids; each round adds a turn "1<eos>" (2) and the observation "?" (1):
    # 4 → 7 → 10 → 13. A turn may take 4 tokens: in a context of 12 a third turn at 10 could
    # reach 14 > 12, so the episode stops after two
    engine = Scripted(lambda c: "1<eos>")
    engine.max_len = 12  # type: ignore[attr-defined]
    (e,) = run_episodes(
        engine, [Endless()], max_new_tokens=4, temperature=1.0, top_p=1.0, max_turns=10
    )
    assert e.turns == 2 and e.end == End.TRUNCATED and e.eos
    assert len(e.prompt_ids) + len(e.response_ids) == 10
    engine.max_len = 14  # type: ignore[attr-defined]  # 10 + 4 fits: a third turn, then 13 + 4 > 14
    (e,) = run_episodes(
        engine, [Endless()], max_new_tokens=4, temperature=1.0, top_p=1.0, max_turns=10
    )
    assert e.turns == 3


def test_the_runner_caps_turns_even_when_the_environment_never_ends() -> None:
    (e,) = run_episodes(
        Scripted(lambda c: "1<eos>"),
        [Endless()],
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
        max_turns=3,
    )
    assert e.turns == 3 and e.end == End.TRUNCATED and not e.action[-1]  # ends on its observation


def test_environment_steps_of_a_round_wait_together_not_in_turn() -> None:
    import time

    # 8 episodes × 2 steps, each step waiting 0.3 s: one after another that is 4.8 s;
    # stepped together each round waits for its slowest step: about 2 × 0.3 s
    envs = [
        CalculatorEnv(
            TOKENIZER, make_problem(3, "*", 4), exact_match, max_turns=3, latency=lambda: 0.3
        )
        for _ in range(8)
    ]
    started = time.perf_counter()
    episodes = run(tool_then_answer, envs)
    took = time.perf_counter() - started
    assert all(e.outcome == 1.0 and e.turns == 2 for e in episodes)
    assert took < 2.4, f"{took:.2f} s: the steps did not overlap"


def test_environments_that_do_not_wait_are_stepped_in_the_calling_thread() -> None:
    import threading

    from rlmap.rollout.episodes import step_all

    class Where(AnswerEnv):
        def step(self, action_ids: Sequence[int]) -> EnvStep:
            threads.append(threading.get_ident())
            return super().step(action_ids)

    threads: list[int] = []
    answer = [*ids("4"), EOS]
    for waits in (False, True):
        envs = [
            Where(TOKENIZER, make_problem(2, "+", 2), exact_match, verify_waits=waits)
            for _ in range(4)
        ]
        for e in envs:
            e.reset()
        threads.clear()
        steps = step_all(envs, [answer] * 4)
        assert [s.reward for s in steps if s is not None] == [1.0] * 4
        # pure Python steps skip the thread pool; a verifier that waits gets its threads
        assert (set(threads) == {threading.get_ident()}) == (not waits)


def test_the_task_factory_says_which_environments_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlmap import feedback
    from rlmap.assembly.environments import environment_factory
    from rlmap.recipes import build_config

    added = feedback.Verifier(exact_match, "registered by a user: it might call a service")
    monkeypatch.setitem(feedback.registry._items, "added", added)

    def waits(task: str, *overrides: str, latency: bool = False) -> bool:
        cfg = build_config("grpo", None, [f"data.task={task}", *overrides])
        env = environment_factory(cfg, TOKENIZER, latency=latency)(make_problem(3, "*", 4))
        return bool(env.waits)

    assert not waits("arithmetic") and not waits("calculator")  # exact_match: pure Python
    assert waits("arithmetic", "feedback.verifier=code_tests")  # the code sandbox's process
    assert waits("arithmetic", "feedback.verifier=added")  # unknown: stepped as before
    assert waits("arithmetic", "feedback.timeout_s=1")  # an isolated verifier's worker
    assert waits("calculator", "data.env_latency=fixed:0.01", latency=True)  # the tool sleeps
    assert not waits("calculator", "data.env_latency=fixed:0.01")  # evaluation never sleeps


def test_a_trajectory_spanning_a_weight_update_carries_both_versions_and_goes_on() -> None:
    # partial rollout: new weights (version 8) arrive between the call and the answer; the
    # episode is not cut at the update, and each turn's tokens carry their own version
    class Updating(Scripted):
        def __init__(self) -> None:
            super().__init__(tool_then_answer)
            self.current = VERSION

        @property
        def version(self) -> int:
            return self.current

        def generate(self, prompts, **kw):  # type: ignore[no-untyped-def, override]
            out = super().generate(prompts, **kw)
            return [[replace(c, version=self.current) for c in g] for g in out]

    engine = Updating()
    turns = iter([VERSION, VERSION + 1])

    def update() -> None:
        engine.current = next(turns)

    (e,) = run_episodes(
        engine,
        [calc_env(37, 85)],
        max_new_tokens=16,
        temperature=1.0,
        top_p=1.0,
        before_turn=update,
    )
    assert e.end == End.TERMINAL and e.outcome == 1.0  # finished, not cut by the update
    versions = {v for v, a in zip(e.versions, e.action, strict=True) if a}
    assert versions == {VERSION, VERSION + 1}
    first, last = e.turn_ids.index(0), e.turn_ids.index(1)
    assert e.versions[first] == VERSION and e.versions[last] == VERSION + 1
