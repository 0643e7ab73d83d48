"""A non-finite loss, gradient or weight stops the run in one line; nothing non-finite is saved.

Before the guard, ``generation.temperature=0`` (now refused by validation) divided the
learner's logits by zero: after one step every weight was NaN, the run exited 0 and saved
the NaN checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from rlmap.cli import main
from rlmap.core.errors import TrainingError
from rlmap.embedded.tiny import TinySpec, build_tiny_model
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.engines.hf import HFEngine
from rlmap.experiments.checkpoint import save_checkpoint
from rlmap.learner import policy as learner
from rlmap.learner.optim_step import all_finite, guarded_step

Toy = Callable[..., list[str]]


def _linear() -> tuple[nn.Linear, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def test_a_finite_step_returns_the_pre_clip_norm_and_steps() -> None:
    model, optimizer, scheduler = _linear()
    before = [p.detach().clone() for p in model.parameters()]
    model.weight.grad = torch.full((2, 3), 2.0)  # ‖g‖ = sqrt(6·4 + 2·1) = sqrt(26)
    model.bias.grad = torch.ones(2)
    norm = guarded_step(model, optimizer, scheduler, loss=1.0, max_grad_norm=100.0, what="policy")
    assert norm == pytest.approx(26**0.5)
    assert not torch.equal(before[0], model.weight)
    assert model.weight.grad is None  # zeroed for the next mini-batch


@pytest.mark.parametrize(
    ("loss", "grad"),
    [(float("nan"), 1.0), (1.0, float("nan")), (1.0, float("inf")), (float("-inf"), 1.0)],
)
def test_a_non_finite_loss_or_gradient_stops_before_any_weight_changes(
    loss: float, grad: float
) -> None:
    model, optimizer, scheduler = _linear()
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, 1.0)
    model.bias.grad = torch.tensor([grad, 0.0])
    with pytest.raises(TrainingError, match="critic update: non-finite"):
        guarded_step(model, optimizer, scheduler, loss=loss, max_grad_norm=1.0, what="critic")
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert optimizer.state_dict()["state"] == {}  # AdamW never saw the step


def test_all_finite_sees_one_bad_element() -> None:
    good = [torch.zeros(4), torch.ones(2, 2)]
    assert all_finite(good) and all_finite([])
    for bad in (float("nan"), float("inf"), float("-inf")):
        tensor = torch.zeros(5)
        tensor[3] = bad
        assert not all_finite([*good, tensor])


def test_a_checkpoint_of_non_finite_weights_is_refused(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, TinySpec(num_hidden_layers=1), seed=0)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(TrainingError, match="step 3: policy weights are not finite"):
        save_checkpoint(
            tmp_path, 3, model=model, tokenizer=tokenizer, optimizers={}, schedulers={}, extra={}
        )
    assert not (tmp_path / "checkpoints" / "step_3").exists()


def test_a_rollout_from_overflowing_weights_is_a_one_line_error() -> None:
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, TinySpec(num_hidden_layers=1), seed=0)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("inf"))
    engine = HFEngine(model, pad_token_id=0, eos_token_id=2)
    with pytest.raises(TrainingError, match="rollout: the policy's scores are NaN"):
        engine.generate([[1, 5, 6]], n=2, max_new_tokens=3, temperature=1.0, top_p=1.0)


def test_a_run_whose_loss_turns_nan_stops_in_one_line_and_saves_nothing_non_finite(
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    toy: Toy,
) -> None:
    real = learner.policy_loss

    def nan_from_the_third_step(terms: Any, *args: Any, **kwargs: Any) -> Any:
        j_BT, diag = real(terms, *args, **kwargs)
        third = terms.learner_version >= 2  # the learner's version is the 0-based step
        return (j_BT * float("nan"), diag) if third else (j_BT, diag)

    monkeypatch.setattr(learner, "policy_loss", nan_from_the_third_step)
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                *toy(tiny_model_dir, steps=5),
                "sampling.prompts_per_step=1",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("rlmap: error: step 3: policy update: non-finite loss nan"), err
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]  # everything before the failing step is kept
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step_1", "step_2"]
    for name in checkpoints:
        assert all_finite(load_file(run / "checkpoints" / name / "model.safetensors").values())
