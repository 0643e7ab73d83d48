"""examples/minimal_ppo.py runs, and its one page computes the full trainer's ppo update."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.assembly.settings import critic_settings, update_settings
from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.engines.hf import HFEngine
from rlmap.estimators import registry as estimators
from rlmap.learner.critic import compute_values, load_critic, update_critic
from rlmap.learner.policy import update_policy
from rlmap.recipes import build_config
from rlmap.rollout.packing import to_batch
from rlmap.tasks.arithmetic import make_splits

EXAMPLES = Path(__file__).parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def minimal() -> ModuleType:
    _load("minimal_grpo")  # minimal_ppo imports its sampling, as a sibling script would
    return _load("minimal_ppo")


def test_its_constants_are_the_ppo_presets(minimal: ModuleType) -> None:
    cfg = build_config("ppo")
    assert (cfg.sampling.group_size, cfg.sampling.prompts_per_step) == (1, minimal.PROMPTS)
    assert (cfg.optim.lr, cfg.optim.critic_lr) == (minimal.LR, minimal.CRITIC_LR)
    assert (cfg.credit.estimator, cfg.credit.gamma, cfg.credit.lam) == (
        "gae",
        minimal.GAMMA,
        minimal.LAM,
    )
    assert cfg.behaviour.clip_low == cfg.behaviour.clip_high == minimal.CLIP
    assert (cfg.critic.enabled, cfg.critic.value_clip) == (True, minimal.VALUE_CLIP)
    assert cfg.reduction.name == "token_mean" and cfg.kl.placement == "none"
    assert (cfg.optim.epochs_per_batch, cfg.optim.minibatches_per_epoch) == (1, 1)
    assert (cfg.optim.max_grad_norm, cfg.optim.weight_decay) == (
        minimal.MAX_GRAD_NORM,
        minimal.WEIGHT_DECAY,
    )


def test_gae_by_hand(minimal: ModuleType) -> None:
    # Two rows, action columns 1..3 (column 0 the prompt), reward 1 on the last action.
    # γ = 1, λ = 0.95, V = (0.5, 0.25, 0.125) on the actions. Row 0 ended (V after = 0):
    #   δ_3 = 1 + 0 − 0.125 = 0.875;   Â_3 = 0.875
    #   δ_2 = 0 + 0.125 − 0.25 = −0.125; Â_2 = −0.125 + 0.95·0.875 = 0.70625
    #   δ_1 = 0 + 0.25 − 0.5 = −0.25;  Â_1 = −0.25 + 0.95·0.70625 = 0.4209375
    # Row 1 truncated, V(s_final) = 2: δ_3 = 1 + 2 − 0.125 = 2.875, Â_3 = 2.875,
    #   Â_2 = −0.125 + 0.95·2.875 = 2.60625, Â_1 = −0.25 + 0.95·2.60625 = 2.2259375
    action = torch.tensor([[False, True, True, True]] * 2)
    batch = Batch(
        tokens=torch.zeros(2, 4, dtype=torch.long),
        action_mask=action,
        behavior_logprobs=torch.zeros(2, 4),
        rewards=torch.tensor([1.0, 1.0]),
        group_id=torch.tensor([0, 1]),
        end=torch.tensor([End.TERMINAL, End.TRUNCATED]),
        reward_status=torch.tensor([RewardStatus.OK] * 2),
    )
    values = torch.tensor([[0.0, 0.5, 0.25, 0.125]] * 2)
    adv, ret = minimal.gae(batch, values, torch.tensor([9.0, 2.0]))  # row 0's 9 never read
    expected = torch.tensor([[0.0, 0.4209375, 0.70625, 0.875], [0.0, 2.2259375, 2.60625, 2.875]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, torch.where(action, expected + values, 0.0))


def test_it_runs_a_few_steps(
    minimal: ModuleType,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The grpo test's verifier: held-out prompts 0 and 2 pass whatever the model writes, so
    # pass@1 over 4 held-out prompts is 2/4 = 0.5 before and after
    heldout = make_splits(0, 6000, 256)[1][:4]
    passes = {heldout[0].answer, heldout[2].answer}
    assert len({e.answer for e in heldout}) == 4
    monkeypatch.setattr(
        sys.modules["minimal_grpo"], "exact_match", lambda text, answer: float(answer in passes)
    )
    monkeypatch.setattr(minimal, "PROMPTS", 6)  # 6 prompts a step keep the test short
    before, after = minimal.main(tiny_model_dir, steps=2, heldout_size=4)
    out = capsys.readouterr().out
    assert "step 2: loss" in out and "value_loss" in out
    assert "held-out pass@1 0.500 -> 0.500" in out and (before, after) == (0.5, 0.5)
    assert len((EXAMPLES / "minimal_ppo.py").read_text().splitlines()) <= 200  # one page


def test_its_step_is_the_full_trainers_update(minimal: ModuleType, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).double()
    critic = load_critic(tiny_model_dir, dtype=torch.float64, seed=3)
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    torch.manual_seed(0)
    scored = minimal.sample(engine, tokenizer, make_splits(0, 40, 4)[0][:6], 1)
    for k in range(0, len(scored), 3):  # mixed rewards
        scored[k] = type(scored[k])(scored[k].episode, scored[k].group, 1.0, 1.0, scored[k].status)
    batch = to_batch(scored, pad_token_id=tokenizer.pad_token_id)
    ends = torch.tensor([End.TERMINAL, End.TRUNCATED] * 3)  # both kinds of end, bootstrapped
    status = torch.tensor([RewardStatus.OK] * 5 + [RewardStatus.INFRA_ERROR])  # one excluded
    # float64 rewards: the trainer's GAE takes its λ in the rewards' dtype (float32 λ is not 0.95)
    batch = batch.replace(end=ends, reward_status=status, rewards=batch.rewards.double())
    cfg = build_config("ppo", overrides=["optim.micro_batch_size=4"])

    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    our_critic, their_critic = copy.deepcopy(critic), copy.deepcopy(critic)
    sgd, critic_sgd = (
        torch.optim.SGD(ours.parameters(), lr=0.5),
        torch.optim.SGD(our_critic.parameters(), lr=0.5),
    )
    stats = minimal.ppo_step(ours, our_critic, sgd, critic_sgd, batch)

    values, bootstrap = compute_values(their_critic, batch, 4, torch.float64)  # the trainer's
    batch = batch.replace(values=values, bootstrap_values=bootstrap)
    credit = estimators.get("gae").fn(batch, cfg.credit)
    assert credit.returns is not None
    torch.testing.assert_close(
        minimal.gae(batch, values, bootstrap)[0], credit.advantages, rtol=1e-12, atol=1e-12
    )
    assert float(credit.advantages.abs().sum()) > 0 and bool((batch.end == End.TRUNCATED).any())
    c_sgd = torch.optim.SGD(their_critic.parameters(), lr=0.5)
    critic_out = update_critic(
        their_critic,
        c_sgd,
        torch.optim.lr_scheduler.LambdaLR(c_sgd, lambda _: 1.0),
        batch,
        credit.returns,
        critic_settings(cfg),
        generator=torch.Generator(),
    )
    p_sgd = torch.optim.SGD(theirs.parameters(), lr=0.5)
    policy_out = update_policy(
        theirs,
        p_sgd,
        torch.optim.lr_scheduler.LambdaLR(p_sgd, lambda _: 1.0),
        batch,
        credit.advantages,
        update_settings(cfg),
        learner_version=0,
        generator=torch.Generator(),
    )

    assert stats["value_loss"] == pytest.approx(critic_out["critic/value_loss"], rel=1e-9)
    assert stats["loss"] == pytest.approx(policy_out["loss/total"], rel=1e-9, abs=1e-12)
    for mine, full, start in ((ours, theirs, model), (our_critic, their_critic, critic)):
        pairs = list(zip(mine.parameters(), full.parameters(), start.parameters(), strict=True))
        assert any(not torch.equal(a, c) for a, _, c in pairs)  # the step moved it
        for a, b, _ in pairs:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
