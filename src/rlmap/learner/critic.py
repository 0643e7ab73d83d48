"""The value critic: its own Hugging Face model, its values, and its update.

Value model. The critic is a separate ``AutoModelForTokenClassification`` with one
label (``Qwen2ForTokenClassification`` for the embedded default): the start
checkpoint's transformer trunk plus a freshly initialised linear ``score`` head that
gives one scalar per position. It is saved and loaded with plain ``transformers``.

Trade-off against a value head on the policy's trunk (one model, two heads):

- a separate model costs a second set of weights, optimiser state, and a forward
  pass (values) plus a forward/backward (update) per step — about double the
  learner's memory and compute;
- a shared trunk would also let the value read features the policy keeps learning;
- in exchange the value loss cannot pull on the policy's features (no weighting of
  value against policy loss to tune), the critic has its own learning rate (VAPO
  uses 2× the actor's), it can be trained while the policy is frozen — the warm-up
  and VAPO's value pre-training need exactly that — and both checkpoints load with
  plain ``transformers`` classes (a head bolted onto a causal LM would need rlmap's
  code to load). verl's critic makes the same choice.

Alignment. Left-padded prompt, then response (and observations), right-padded.
The critic's output at position p reads tokens ≤ p, so it is V(state after token p).
The action token at column t is chosen in the state after tokens < t, hence

    Batch.values[:, t]        = V(s_t)     = output[:, t − 1]           (action columns)
    Batch.bootstrap_values[i] = V(s_final) = output[i, last real token of row i]

Position ids are counted over real tokens only (:func:`rlmap.learner.logprobs.position_ids`),
as for the policy. Values are returned in at least float32.

Update. The critic regresses the estimator's targets (``Credit.returns``) with the
clipped value loss (docs/formulas.md §2.1) around the values the estimator saw (V_old),
reduced with ``token_mean`` over the action tokens of valid rows of each optimiser
mini-batch — every state weighs the same, whatever reduction the policy uses — with
the denominator pinned before the micro-batches run, so micro-batching does not
change the gradient. One critic *update* is one pass of the policy's schedule
(``epochs_per_batch`` × ``minibatches_per_epoch`` optimiser steps); a step runs
``critic.updates_per_step`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForTokenClassification, PreTrainedModel

from rlmap.core.batch import Batch, cross
from rlmap.core.device import cuda_indices, model_device
from rlmap.core.hf import loading_onto, quiet_new_head
from rlmap.core.ops import at_least_float32
from rlmap.estimators import train_mask, value_loss
from rlmap.learner.distributed import SINGLE, World
from rlmap.learner.logprobs import attention_of, position_ids
from rlmap.learner.memory import autocast_to
from rlmap.learner.update_loop import Kept, Schedule, Weights, optimise
from rlmap.reduction import ReductionParams, reduce, token_weights

CRITIC_DIR = "critic"
"""Name of the critic's directory inside a checkpoint (``extra_models``)."""
_HEAD = ("score.weight", "score.bias")


@dataclass(frozen=True)
class CriticSettings:
    """What one critic update needs to know, gathered from the recipe config."""

    value_clip: float
    """ε_v: V is clipped to V_old ± ε_v in the value loss."""
    updates: int
    """``critic.updates_per_step``: passes of ``schedule`` per step."""
    schedule: Schedule
    """One pass: the policy's schedule (epochs, mini-batches, micro-batch size, clip)."""
    train_dtype: torch.dtype = torch.float32
    """The forward passes' precision: autocast to it over float32 weights when narrower."""

    @property
    def optimizer_steps(self) -> int:
        """Critic optimiser steps per rollout batch."""
        return self.updates * self.schedule.optimizer_steps


def load_critic(
    path: Path, *, dtype: torch.dtype, seed: int, device: torch.device | None = None
) -> PreTrainedModel:
    """The value model from ``path``: a causal LM's trunk + a new head, or a saved critic, on
    ``device`` (None: the CPU; a GPU's weights load straight onto it).

    The new head's initialisation is drawn from ``seed`` on a CPU generator (not the global
    RNG, nor a GPU's), so a run's critic does not depend on what ran before in the process
    or on its device. Classifier dropout is off: a regression target has no use for it,
    and it would make the values used for GAE differ from those being trained. Raises
    ValueError when any weight other than the head is missing (a trunk that did not load).
    """
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    with (
        torch.random.fork_rng(devices=[] if device is None else cuda_indices(device)),
        quiet_new_head(),
    ):
        torch.manual_seed(seed)
        critic, info = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=dtype, output_loading_info=True, **loading_onto(device)
        )
    missing = sorted(set(info["missing_keys"]) - set(_HEAD))
    if missing:
        raise ValueError(f"critic from {path}: weights missing from the checkpoint: {missing}")
    if set(_HEAD) & set(info["missing_keys"]):
        draw_head(critic, seed)
    with torch.no_grad():
        # Fresh storage for every weight: loaded tensors sit at arbitrary offsets of the
        # file's buffer, and CPU kernels round differently at different alignments, so a
        # resumed critic would give values 1 ulp away from an uninterrupted run's.
        for param in critic.parameters():
            param.data = param.data.clone()
    critic.train()
    return critic if device is None else critic.to(device)


def draw_head(critic: PreTrainedModel, seed: int) -> None:
    """A new value head as ``transformers`` draws one on a CPU seeded ``seed`` (weight
    ~ N(0, initializer_range²), bias 0: the same numbers, checked), copied to wherever the
    critic lives: on a GPU its own draw would come from the GPU's generator."""
    head = critic.get_submodule("score")
    assert isinstance(head, nn.Linear)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.empty(head.weight.shape, dtype=head.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight.normal_(0.0, critic.config.initializer_range, generator=generator))
        head.bias.zero_()


def critic_outputs(critic: nn.Module, tokens_BT: Tensor, attention_BT: Tensor) -> Tensor:
    """(B, T): the critic's scalar at every position, V(state after tokens ≤ p).

    At least float32 (a bfloat16 critic's values are upcast; float64 stays).
    """
    out = critic(
        input_ids=tokens_BT,
        attention_mask=attention_BT,
        position_ids=position_ids(attention_BT),
        use_cache=False,
    )
    return at_least_float32(out.logits[..., 0])  # (B, T, 1) -> (B, T)


def align_values(
    outputs_BT: Tensor, action_BT: Tensor, attention_BT: Tensor
) -> tuple[Tensor, Tensor]:
    """(values (B, T), bootstrap (B,)) from the per-position outputs (module docstring).

    values[:, t] = outputs[:, t − 1] on action columns, 0 elsewhere; bootstrap[i] =
    outputs[i, p_i] with p_i the last real (attended) column of row i. Differentiable.
    """
    b, t = outputs_BT.shape
    before_BT = torch.cat([outputs_BT.new_zeros(b, 1), outputs_BT[:, :-1]], dim=1)
    values_BT = torch.where(action_BT.bool(), before_BT, 0.0)
    cols_BT = torch.arange(t, device=outputs_BT.device).expand(b, t)
    last_B = torch.where(attention_BT.bool(), cols_BT, -1).amax(-1).clamp(min=0)
    bootstrap_B = outputs_BT.gather(1, last_B.unsqueeze(1)).squeeze(1)
    return values_BT, bootstrap_B


@torch.no_grad()
def compute_values(
    critic: nn.Module, batch: Batch, micro_batch_size: int, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """(Batch.values (B, T), Batch.bootstrap_values (B,)): detached, in eval mode, micro-batched,
    under autocast to ``dtype`` when it is narrower than the critic's weights."""
    was_training = critic.training
    critic.eval()
    attention_BT = attention_of(batch)
    device = model_device(critic)
    parts: list[tuple[Tensor, Tensor]] = []
    try:
        for start in range(0, batch.size, micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            tokens, attention = cross(batch.tokens[rows], device), cross(attention_BT[rows], device)
            with autocast_to(critic, dtype):
                out_BT = critic_outputs(critic, tokens, attention)
            parts.append(align_values(out_BT, cross(batch.action_mask[rows], device), attention))
    finally:
        critic.train(was_training)
    host = batch.tokens.device  # back once, after every micro-batch ran
    return (torch.cat([v for v, _ in parts]).to(host), torch.cat([b for _, b in parts]).to(host))


def value_weights(mb: Batch) -> Tensor:
    """(B, T) token-mean weights over the action tokens of valid rows of a whole mini-batch.

    Computed once per optimiser mini-batch (the pinned denominator); zero on prompt,
    observation and padding tokens and on excluded rows, whose targets mean nothing.
    """
    return token_weights(train_mask(mb), ReductionParams(name="token_mean"))


def critic_loss(
    outputs_BT: Tensor,
    batch: Batch,
    returns_BT: Tensor,
    weights_BT: Tensor,
    *,
    value_clip: float,
) -> Tensor:
    """Σ w · ½ max((V − R)², (clip(V, V_old ± ε_v) − R)²), V aligned from ``outputs_BT``.

    ``batch`` supplies the action mask, attention and V_old (``batch.values``); all
    (B, T) for the same rows. ``weights_BT`` are the mini-batch's pinned token-mean
    weights, zero off the action tokens of valid rows, so prompt, observation and
    padding positions get no gradient.
    """
    if batch.values is None:
        raise ValueError("critic_loss: batch.values (V_old) is None; run compute_values first")
    values_BT, _ = align_values(outputs_BT, batch.action_mask, attention_of(batch))
    j_BT = value_loss(values_BT, batch.values, returns_BT, value_clip)
    return reduce(j_BT, weights_BT)


def update_critic(
    critic: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: Batch,
    returns_BT: Tensor,
    s: CriticSettings,
    *,
    generator: torch.Generator,
    world: World = SINGLE,
    owner: Tensor | None = None,
) -> dict[str, float]:
    """All critic optimiser steps on one batch (V_old = ``batch.values``), on the policy's
    update loop (:func:`rlmap.learner.update_loop.optimise`); means over the steps. With
    several learner ranks, as the policy's: ``batch`` global, this rank's rows ``owner``."""

    def micro(mb: Batch, rows: Tensor, w: Weights) -> tuple[Tensor, dict[str, Tensor], Kept]:
        with autocast_to(critic, s.train_dtype):
            outputs_BT = critic_outputs(critic, mb.tokens, attention_of(mb))
        returns = cross(returns_BT[rows], mb.tokens.device)  # the micro-batch's device
        return critic_loss(outputs_BT, mb, returns, w[0], value_clip=s.value_clip), {}, {}

    schedule = replace(s.schedule, epochs=s.updates * s.schedule.epochs)  # passes back to back
    out = optimise(
        critic,
        optimizer,
        scheduler,
        batch,
        schedule,
        weights_of=lambda mb: (value_weights(mb),),
        micro_loss=micro,
        generator=generator,
        what="critic",
        world=world,
        owner=owner,
    )
    steps = out.step_means()
    return {
        "critic/value_loss": steps["loss"],
        "critic/grad_norm": steps["grad_norm"],
        "critic/lr": steps["lr"],
        "optim/critic_steps": float(len(out.steps["loss"])),
    }
