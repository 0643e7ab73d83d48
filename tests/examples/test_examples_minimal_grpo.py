"""examples/minimal_grpo.py runs, and its one page computes the full trainer's update."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.correction import BehaviourParams, KLParams
from rlmap.engines.hf import HFEngine
from rlmap.estimators import CreditParams
from rlmap.estimators import registry as estimators
from rlmap.learner.policy import UpdateSettings, update_policy
from rlmap.learner.update_loop import Schedule
from rlmap.reduction import ReductionParams
from rlmap.rollout.packing import to_batch
from rlmap.tasks.arithmetic import make_splits

EXAMPLE = Path(__file__).parents[2] / "examples" / "minimal_grpo.py"


@pytest.fixture(scope="module")
def minimal() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["minimal_grpo"] = module
    spec.loader.exec_module(module)
    return module


def test_it_runs_a_few_steps(
    minimal: ModuleType,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A verifier that passes held-out prompts 0 and 2 whatever the model writes: pass@1,
    # one sample on each of the 4 held-out prompts, is then 2/4 = 0.5 before and after —
    # the wrong prompts, a second sample or another denominator would show
    heldout = make_splits(0, 6000, 256)[1][:4]  # the script's split: 49-5=, 33-51=, ...
    passes = {heldout[0].answer, heldout[2].answer}
    assert len({e.answer for e in heldout}) == 4  # distinct: only those two pass
    monkeypatch.setattr(minimal, "exact_match", lambda text, answer: float(answer in passes))
    before, after = minimal.main(tiny_model_dir, steps=2, heldout_size=4)
    out = capsys.readouterr().out
    assert "step 2: loss" in out and "held-out pass@1 0.500 -> 0.500" in out
    assert (before, after) == (0.5, 0.5)
    assert len(EXAMPLE.read_text().splitlines()) <= 150  # a page, as the issue asks


def test_its_step_is_the_full_trainers_update(minimal: ModuleType, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).double()
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    torch.manual_seed(0)
    scored = minimal.sample(engine, tokenizer, make_splits(0, 40, 4)[0][:3], 4)
    for k in range(0, len(scored), 3):  # mixed rewards, so the advantages are not all 0
        scored[k] = type(scored[k])(scored[k].episode, scored[k].group, 1.0, 1.0, scored[k].status)
    batch = to_batch(scored, pad_token_id=tokenizer.pad_token_id)
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    minimal.grpo_step(ours, torch.optim.SGD(ours.parameters(), lr=0.5), batch)
    adv = estimators.get("grpo").fn(batch, CreditParams(estimator="grpo")).advantages
    s = UpdateSettings(
        behaviour=BehaviourParams(objective="ppo_clip"),
        kl=KLParams(),
        reduction=ReductionParams(name="token_mean"),
        schedule=Schedule(epochs=1, minibatches=1, micro_batch_size=5, max_grad_norm=1.0),
        temperature=1.0,
    )
    sgd = torch.optim.SGD(theirs.parameters(), lr=0.5)
    update_policy(
        theirs,
        sgd,
        torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0),
        batch,
        adv,
        s,
        learner_version=0,
        generator=torch.Generator(),
    )
    moved = [
        not torch.equal(a, b) for a, b in zip(ours.parameters(), model.parameters(), strict=True)
    ]
    assert any(moved)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
