"""Data-parallel learners: two gloo ranks give the single-process gradient, exactly.

One optimiser step on the same global batch — responses of unequal lengths, split
unevenly so that the ranks hold different row and token counts, micro-batched so that
each rank accumulates over several backward passes (rank 1 pads with a zero-weight one).
The gradients *before* the AdamW step are compared as well as the parameters after it:
AdamW is nearly invariant to a uniform rescaling of the gradient, so parameters alone
would hide a denominator off by the world size. Two planted defects — a per-rank
denominator, and a loss divided by the world size once more — must each be caught.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from dp_worker import Recording, critic_update
from test_learner_policy import _rollouts, _settings, rescheduled
from transformers import AutoModelForCausalLM

from rlmap.correction import KLParams
from rlmap.learner.policy import prepare_batch, update_policy
from rlmap.models.lora import rollout_weights

WORKER = Path(__file__).with_name("dp_worker.py")


def _case(model_dir: Path, reduction: str) -> dict[str, object]:
    _, scored, pad = _rollouts(model_dir, n=3)  # 3 prompts × 3 samples, lengths vary
    from rlmap.rollout.packing import to_batch

    batch = to_batch(scored, pad_token_id=pad)
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(2))
    owner = torch.tensor([0] * 6 + [1] * 3)  # rank 0: groups 0-1, rank 1: group 2
    return {
        "model_dir": str(model_dir),
        "batch": batch,
        "advantages": (advantages * batch.action_mask).double(),
        "owner": owner,
        "settings": _settings(reduction, 2),
        "world": 2,
    }


def _single(case: dict[str, object]) -> dict[str, object]:
    policy = AutoModelForCausalLM.from_pretrained(case["model_dir"]).double()
    policy.train()
    optimizer = Recording(policy.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    s = case["settings"]
    reference = None
    if case.get("reference"):
        reference = AutoModelForCausalLM.from_pretrained(case["model_dir"]).double().eval()
    batch, _ = prepare_batch(case["batch"], policy, reference, s)  # type: ignore[arg-type]
    metrics = update_policy(
        policy,
        optimizer,
        scheduler,
        batch,
        case["advantages"],
        s,  # type: ignore[arg-type]
        learner_version=0,
        generator=torch.Generator().manual_seed(0),
    )
    params = copy.deepcopy(policy.state_dict())
    return {"grads": optimizer.seen, "params": params, "metrics": metrics}


def _parallel(cases: list[dict[str, object]], tmp_path: Path) -> list[dict]:
    """Each case's result on 2 gloo ranks (one launch for all of them)."""
    spec, out = tmp_path / "cases.pt", tmp_path / "out.pt"
    torch.save(cases, spec)
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(WORKER), str(spec), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=False)


REDUCTIONS = (
    "response_mean",
    "token_mean",
    "fixed_budget",
    "prompt_mean",
    "token_sum",
    "seq_mean_token_sum",
)
BUGS = ("per_rank", "averaged")
TWO_STEPS = "token_mean, 2 steps, KL"
IDLE_RANK = "token_mean, 2 steps, rank 1 owns nothing, clipped"
CRITIC = "the critic: values and two steps of its value loss"
STREAM = "the start weights, sharded, streamed back whole"


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def runs(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """(single-process, two-rank) results per reduction, and per planted bug (token mean)."""
    sharding = request.param
    cases = {r: _case(tiny_model_dir, r) for r in REDUCTIONS}
    # prompt 1 (rows 3-5) split between the ranks: its N_g and P must still be global
    cases["prompt_mean"]["owner"] = torch.tensor([0] * 4 + [1] * 5)
    # two optimiser steps (π_old recomputed, each rank scoring its rows) with a KL to π_ref
    two_steps = _case(tiny_model_dir, "token_mean")
    two_steps["settings"] = replace(
        rescheduled(two_steps["settings"], minibatches=2),  # type: ignore[arg-type]
        kl=KLParams(placement="loss", beta=0.1),
    )
    cases[TWO_STEPS] = {**two_steps, "reference": True}
    # rank 1 owns no row at all (a filter dropped its groups): it only runs padding passes;
    # and a clip that binds, so the global norm decides
    idle = _case(tiny_model_dir, "token_mean")
    idle["settings"] = rescheduled(idle["settings"], minibatches=2, max_grad_norm=0.05)  # type: ignore[arg-type]
    cases[IDLE_RANK] = {**idle, "owner": torch.zeros(9, dtype=torch.long)}
    cases[CRITIC] = {**_case(tiny_model_dir, "token_mean"), "critic": True}  # returns: random
    cases[TWO_STEPS]["stream"] = True  # the rollout stream after the update, too
    cases[STREAM] = {"model_dir": str(tiny_model_dir), "world": 2, "stream_only": True}
    extra = (TWO_STEPS, IDLE_RANK, CRITIC, STREAM)
    planned = [(r, None) for r in (*REDUCTIONS, *extra)] + [("token_mean", b) for b in BUGS]
    launched = [{**cases[r], "sharding": sharding, "bug": b} for r, b in planned]
    two = _parallel(launched, tmp_path_factory.mktemp(f"dp-{sharding}"))
    singles = {r: _single(cases[r]) for r in (*REDUCTIONS, TWO_STEPS, IDLE_RANK)}
    singles[CRITIC] = critic_update(cases[CRITIC])
    return {
        "cases": cases,
        "one": singles,
        "sharding": sharding,
        "two": {key: res for key, res in zip(planned, two, strict=True)},
    }


def _gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest relative difference of two lists of tensors."""
    return max(
        float((x - y).abs().max() / y.abs().max().clamp(min=1e-30))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_two_ranks_match_one_process(runs: dict, reduction: str) -> None:
    mask = runs["cases"][reduction]["batch"].action_mask
    assert mask[:6].sum() != mask[6:].sum() * 2  # the ranks' token shares are not their row shares
    one, two = runs["one"][reduction], runs["two"][(reduction, None)]
    _same_update(one, two, steps=1)
    _same_metrics(one["metrics"], two["metrics"])


def test_two_steps_with_pi_old_and_pi_ref_match_one_process(runs: dict) -> None:
    one, two = runs["one"][TWO_STEPS], runs["two"][(TWO_STEPS, None)]
    assert "kl/mean" in one["metrics"]  # π_ref's scores, shared between the ranks
    _same_update(one, two, steps=2)  # the second step's gradient reads the shared π_old
    _same_metrics(one["metrics"], two["metrics"])


def test_a_rank_without_rows_and_a_binding_clip_change_nothing(runs: dict) -> None:
    one, two = runs["one"][IDLE_RANK], runs["two"][(IDLE_RANK, None)]
    assert one["metrics"]["optim/grad_norm"] > 0.05  # the clip binds (pre-clip norm, mean)
    _same_update(one, two, steps=2)
    _same_metrics(one["metrics"], two["metrics"])


def test_the_critic_on_two_ranks_matches_one_process(runs: dict) -> None:
    one, two = runs["one"][CRITIC], runs["two"][(CRITIC, None)]
    _same_update(one, two, steps=2)
    for key in ("critic/value_loss", "critic/grad_norm"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-6)


def _same_update(one: dict, two: dict, *, steps: int) -> None:
    """Each optimiser step's gradient (before AdamW) and the parameters after the last one
    agree to 1e-6, relative."""
    assert len(one["grads"]) == len(two["grads"]) == steps
    for step in range(steps):
        assert _gap(two["grads"][step], one["grads"][step]) < 1e-6
    names = list(one["params"])
    assert _gap([two["params"][k] for k in names], [one["params"][k] for k in names]) < 1e-6


def _same_metrics(one: dict[str, float], two: dict[str, float]) -> None:
    """Every figure of the update (losses, ratio tails, KL, entropy, clip fractions) is the
    global batch's: two ranks report what one process does (timings aside)."""
    assert set(one) == set(two)
    assert "entropy" in one and "ratio/rho/clipped_frac" in one
    for key, value in one.items():
        if not key.endswith("_s"):
            assert two[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_every_ranks_rollout_stream_is_the_single_process_rollout_weights(runs: dict) -> None:
    # FSDP2: each parameter is a shard, gathered whole (full_tensor) when the stream reaches
    # it; DDP: each rank's own replica. Either way every rank must yield exactly the names,
    # order and values one process's rollout_weights has, and the bfloat16 stream (cast on
    # the shard, before the gather) exactly those values rounded once.
    model = AutoModelForCausalLM.from_pretrained(runs["cases"][STREAM]["model_dir"]).double()
    one, names = rollout_weights(model), {n for n, _ in model.named_parameters()}
    ranks = runs["two"][(STREAM, None)]["streams"]
    assert len(ranks) == 2
    for rank in ranks:
        _same_stream(rank, one)
        if runs["sharding"] == "fsdp2":  # every parameter was a shard: the gathers ran
            assert set(rank["sharded"]) == names
        else:
            assert rank["sharded"] == []


def test_the_rollout_stream_after_an_update_is_the_updated_policy(runs: dict) -> None:
    # after two optimiser steps (FSDP2: parameters resharded after the backward passes),
    # every rank streams the gathered state dict exactly, and the single process's weights
    # after the same update to the suite's 1e-6
    two = runs["two"][(TWO_STEPS, None)]
    for rank in two["streams"]:
        _same_stream(rank, two["params"])
    one = runs["one"][TWO_STEPS]["params"]
    full = dict(two["streams"][1]["full"])
    assert _gap([full[k] for k in one], [one[k] for k in one]) < 1e-6


def _same_stream(rank: dict, expected: dict[str, torch.Tensor]) -> None:
    """A rank's streams hold ``expected``'s names in its order, its values exactly, and those
    values cast to bfloat16 in the bfloat16 one."""
    assert [n for n, _ in rank["full"]] == list(expected) == [n for n, _ in rank["bf16"]]
    for (name, full), (_, half) in zip(rank["full"], rank["bf16"], strict=True):
        assert full.dtype == expected[name].dtype and torch.equal(full, expected[name]), name
        assert half.dtype == torch.bfloat16 and torch.equal(half, expected[name].bfloat16())


@pytest.mark.parametrize("bug", BUGS)
def test_a_wrong_denominator_is_caught(runs: dict, bug: str) -> None:
    one, two = runs["one"]["token_mean"], runs["two"][("token_mean", bug)]
    assert _gap(two["grads"][0], one["grads"][0]) > 1e-2


LAUNCH = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
"""What torchrun sets for rank 1 of 2 (the variables rlmap reads)."""


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (0, 1)),  # no launcher: one process
        ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, (0, 1)),  # a cluster's exports
        (LAUNCH, (1, 2)),
        (LAUNCH | {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (1, 2)),
        (LAUNCH | {"RANK": "0", "WORLD_SIZE": "1"}, (0, 1)),  # torchrun --nproc-per-node 1
        ({"WORLD_SIZE": "1"}, (0, 1)),  # stray exports of a world of one: no rendezvous
        ({"RANK": "0"}, (0, 1)),
        ({"RANK": "0", "WORLD_SIZE": "1"}, (0, 1)),
    ],
)
def test_the_launched_rank_is_read_from_a_full_environment(
    environ: dict[str, str], expected: tuple[int, int]
) -> None:
    from rlmap.learner.launch import launched_rank

    assert launched_rank(environ) == expected


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"RANK": ""}, "RANK: not set, but WORLD_SIZE, MASTER_ADDR, MASTER_PORT are"),
        ({"MASTER_ADDR": ""}, "MASTER_ADDR: not set, but RANK, WORLD_SIZE, MASTER_PORT are"),
        ({"RANK": "2"}, "RANK: must be an integer from 0 to 1, got '2'"),  # 2 ranks: 0 and 1
        ({"RANK": "-1"}, "RANK: must be an integer from 0 to 1, got '-1'"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE: must be an integer >= 1, got 'two'"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE: must be an integer >= 1, got '0'"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT: must be an integer from 1 to 65535"),
        ({"WORLD_SIZE": "", "MASTER_ADDR": ""}, "WORLD_SIZE, MASTER_ADDR: not set, but RANK, "),
    ],
)
def test_a_launcher_environment_that_names_no_rank_is_refused(
    change: dict[str, str], says: str
) -> None:
    from rlmap.core.errors import ConfigError
    from rlmap.learner.launch import launched_rank

    with pytest.raises(ConfigError) as err:
        launched_rank(LAUNCH | change)
    assert str(err.value).startswith(says), str(err.value)
