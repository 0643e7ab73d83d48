"""Top-p kept-set replay (``behaviour.replay_sampling_set``): the learner's log-probs over
the set the rollout engine drew from — a hand-worked case, a plain reference loop, and
the properties (top_p = 1 or a whole-vocabulary set changes nothing, the sampled token is
always in the set, the engine's μ̃ and the learner's π̃ agree, κ loses its log S bias)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer, TopPLogitsWarper

from rlmap.core.batch import Batch, End, RewardStatus, make_batch
from rlmap.core.errors import ConfigError, TrainingError
from rlmap.correction import BehaviourParams, KLParams
from rlmap.engines.engine import Completion, StopStrings, cut_at_stop_strings, kept_rows
from rlmap.engines.hf import HFEngine
from rlmap.engines.hf_sampling import OwnDraw, kept_ids
from rlmap.engines.vllm import VLLMEngine, sampled_sets
from rlmap.experiments.train import run_training
from rlmap.learner.logprobs import ChunkedLogprobs, _full_logprobs, kept_only, token_logprobs
from rlmap.learner.policy import (
    UpdateSettings,
    prepare_batch,
    sampling_set_metrics,
    update_policy,
)
from rlmap.learner.update_loop import Schedule
from rlmap.recipes import build_config
from rlmap.reduction import ReductionParams
from rlmap.rollout.episodes import Episode, _Running, single_turn
from rlmap.rollout.packing import Scored, to_batch
from rlmap.tasks.prompts import encode_prompt

MU = (0.5, 0.25, 0.15, 0.07, 0.03)
PI = (0.55, 0.20, 0.15, 0.06, 0.04)


def _chunked(
    h: Tensor,
    w: Tensor,
    b: Tensor | None,
    y: Tensor,
    kept: Tensor | None,
    *,
    inv_t: float = 1.0,
    chunk: int = 4,
    entropy: bool = False,
) -> tuple[Tensor, Tensor]:
    out: tuple[Tensor, Tensor] = ChunkedLogprobs.apply(h, w, b, y, inv_t, chunk, entropy, kept)
    return out


# --- the hand-worked case ----------------------------------------------------------------------


def test_the_five_token_example_replays_to_0_800_where_the_full_vocabulary_gives_0_720() -> None:
    # μ = (0.5, 0.25, 0.15, 0.07, 0.03), top_p = 0.8. transformers' top-p sorts ascending and
    # drops while the cumulative mass is ≤ 1 − 0.8 = 0.2:
    #   id 4: 0.03 (dropped), id 3: 0.03 + 0.07 = 0.10 (dropped), id 2: 0.10 + 0.15 = 0.25 (kept)
    # so K = {0, 1, 2} and S_μ = 0.5 + 0.25 + 0.15 = 0.9.
    scores = TopPLogitsWarper(0.8)(torch.zeros(1, 1, dtype=torch.long), torch.tensor([MU]).log())
    kept = kept_ids(scores, cap=8)  # (1, 3)
    assert sorted(kept[0].tolist()) == [0, 1, 2]
    # the engine reports y = 1 renormalised over K: μ̃ = 0.25 / 0.9 = 0.27778
    log_mu = torch.log_softmax(scores.double(), -1)[0, 1]
    assert math.isclose(float(log_mu.exp()), 0.25 / 0.9, rel_tol=1e-6)
    # the learner's logits z = log π_θ (hidden = log π, W = I): over K,
    # π̃_θ(1) = 0.20 / (0.55 + 0.20 + 0.15) = 0.20 / 0.90 = 0.22222
    h, w = torch.tensor([PI], dtype=torch.float64).log(), torch.eye(5, dtype=torch.float64)
    y = torch.tensor([1])
    replayed = _chunked(h, w, None, y, kept)[0][0]
    full = _chunked(h, w, None, y, None)[0][0]
    assert math.isclose(float(replayed.exp()), 0.20 / 0.90, rel_tol=1e-12)
    # replay: 0.22222 / 0.27778 = 0.800 (= π_θ(1)/μ(1) = 0.20/0.25, since S_θ(K) = S_μ = 0.9)
    assert math.isclose(float((replayed - log_mu).exp()), 0.800, rel_tol=1e-6)
    # full vocabulary against the processed μ̃: 0.20 / 0.27778 = 0.720 = 0.8 × S_μ
    assert math.isclose(float((full - log_mu).exp()), 0.720, rel_tol=1e-6)


# --- a plain reference loop --------------------------------------------------------------------


SETS = [[], [3], [2], list(range(7)), [0, 4, 6], [5, 1]]
"""Row by row: none recorded; one id without y (y is added); {y} alone; the whole vocabulary;
a subset holding y; a subset without y."""


def _case() -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(3)
    h = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)  # N = 6, H = 4
    w = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)  # V = 7
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1, 0, 2, 6, 4, 3])
    return h, w, b, y, kept_rows(SETS, cap=7)


def _loop_reference(z: list[list[float]], y: list[int], sets: list[list[int]]) -> list[float]:
    """log π̃(y_i) = z_{i,y} − log Σ_{v ∈ K_i ∪ {y_i}} exp z_{i,v}; all of V without a set."""
    out = []
    for i in range(len(z)):
        support = set(range(len(z[i]))) if not sets[i] else set(sets[i]) | {y[i]}
        out.append(z[i][y[i]] - math.log(sum(math.exp(z[i][v]) for v in support)))
    return out


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_the_chunked_kept_set_log_probs_equal_a_plain_loop(chunk: int) -> None:
    h, w, b, y, kept = _case()
    z = ((h @ w.T + b) / 0.7).tolist()
    want = _loop_reference(z, y.tolist(), SETS)
    got = _chunked(h, w, b, y, kept, inv_t=1 / 0.7, chunk=chunk)[0]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert got[2] == 0  # {y} alone: π̃(y) = 1


def test_the_gradients_equal_autograd_through_masked_full_logits_and_pass_gradcheck() -> None:
    h, w, b, y, kept = _case()
    g = torch.randn(6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    keep = torch.zeros(6, 7, dtype=torch.bool)  # K ∪ {y}, built by hand from SETS
    for i, s in enumerate(SETS):
        keep[i, s if s else list(range(7))] = True
        keep[i, y[i]] = True
    z = (h @ w.T + b) / 0.7
    plain = torch.log_softmax(z.masked_fill(~keep, -math.inf), -1)[torch.arange(6), y]
    want = torch.autograd.grad((plain * g).sum(), (h, w, b))
    got = torch.autograd.grad(
        (_chunked(h, w, b, y, kept, inv_t=1 / 0.7, chunk=4)[0] * g).sum(), (h, w, b)
    )
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda h, w, b: _chunked(h, w, b, y, kept, inv_t=1 / 0.7, chunk=4)[0], (h, w, b)
    )


def test_the_full_logits_path_masks_the_same_way(tiny_model_dir: Path) -> None:
    # the path of models with scaled logits against the chunked path, on the tiny model
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokens = torch.randint(4, 40, (2, 6), generator=torch.Generator().manual_seed(5))
    attention = torch.ones_like(tokens, dtype=torch.bool)
    sets = [
        [],
        [],
        [7, 9],
        [int(tokens[0, 3])],
        list(range(20)),
        [],
        [],
        [1, 2, 3],
        [],
        [5],
        [int(tokens[1, 5]), 8],
        [11],
    ]
    kept = kept_rows(sets, cap=64).view(2, 6, -1)
    chunked, ent = token_logprobs(
        model, tokens, attention, with_entropy=True, chunk=3, kept_BTK=kept
    )
    full, full_ent = _full_logprobs(model, tokens, attention, 1.0, True, kept)
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=1e-6)
    assert ent is not None and full_ent is not None
    torch.testing.assert_close(ent, full_ent, rtol=1e-6, atol=1e-6)


# --- properties --------------------------------------------------------------------------------


def test_a_whole_vocabulary_set_or_none_changes_nothing_and_the_entropy_never_changes() -> None:
    h, w, b, y, _ = _case()
    whole = kept_rows([list(range(7))] * 6, cap=7)
    none = kept_rows([[]] * 6, cap=7)  # rows of -1: no set recorded
    base, base_ent = _chunked(h, w, b, y, None, entropy=True)
    for kept in (whole, none):
        lp, ent = _chunked(h, w, b, y, kept, entropy=True)
        torch.testing.assert_close(lp, base, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ent, base_ent, rtol=0, atol=0)
    narrow = kept_rows([[int(v)] for v in y], cap=7)  # {y} alone everywhere
    lp, ent = _chunked(h, w, b, y, narrow, entropy=True)
    assert torch.equal(lp, torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(ent, base_ent, rtol=0, atol=0)  # always the full vocabulary's
    grad = torch.autograd.grad(lp.sum(), (h, w, b))
    assert all(torch.equal(x, torch.zeros_like(x)) for x in grad)  # a set of one: no gradient


def test_kept_only_restores_the_sampled_token_and_leaves_rows_without_a_set() -> None:
    z = torch.zeros(3, 4)
    kept = torch.tensor([[1, 2], [-1, -1], [0, 2]], dtype=torch.int32)
    out = kept_only(z, kept, torch.tensor([3, 1, 2]))
    inf = -math.inf
    # row 0: K = {1, 2}, y = 3 restored; row 1: no set; row 2: K = {0, 2} holds y = 2
    assert out.tolist() == [[inf, 0, 0, 0], [0, 0, 0, 0], [0, inf, 0, inf]]


def test_a_set_larger_than_the_cap_is_not_recorded() -> None:
    scores = torch.tensor([[0.0, 1.0, -math.inf, 2.0], [0.0, -math.inf, -math.inf, -math.inf]])
    # row 0 keeps 3 ids: over a cap of 2, a row of -1; row 1 keeps {0}
    assert kept_ids(scores, cap=2).tolist() == [[-1], [0]]
    assert kept_ids(scores, cap=3).tolist() == [[3, 1, 0], [0, -1, -1]]  # highest first
    assert kept_rows([[4, 5, 6], [1]], cap=2).tolist() == [[-1], [1]]


def _tiny(model_dir: Path) -> tuple[torch.nn.Module, HFEngine, list[list[int]], int]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    prompts = [encode_prompt(tokenizer, p) for p in ("1+2=", "37+85=", "9+9=")]
    return model, engine, prompts, tokenizer.pad_token_id


def _scored(groups: list[list[Completion]]) -> list[Scored]:
    return [
        Scored(single_turn(c), g, float(k % 2), float(k % 2), RewardStatus.OK)
        for g, group in enumerate(groups)
        for k, c in enumerate(group)
    ]


def test_the_hf_engine_records_sets_holding_the_sampled_token_and_draws_the_same(
    tiny_model_dir: Path,
) -> None:
    _, engine, prompts, _ = _tiny(tiny_model_dir)
    runs = []
    for sets in (0, 64):
        torch.manual_seed(0)
        runs.append(
            engine.generate(
                prompts, n=4, max_new_tokens=6, temperature=1.0, top_p=0.6, kept_sets=sets
            )
        )
    plain, recorded = ([c for g in run for c in g] for run in runs)
    sizes = []
    for a, c in zip(plain, recorded, strict=True):
        assert a.kept is None and c.kept is not None
        assert (a.response_ids, a.logprobs) == (c.response_ids, c.logprobs)  # recording is silent
        assert c.kept.shape[0] == len(c.response_ids)
        for token, row in zip(c.response_ids, c.kept.tolist(), strict=True):
            assert token in row  # the sampled token is always in its kept set
            sizes.append(sum(v >= 0 for v in row))
    assert min(sizes) >= 1 and max(sizes) < 51  # V = 51: top-p 0.6 truncated somewhere


def test_the_learner_over_the_recorded_sets_reproduces_the_engine_log_mu(
    tiny_model_dir: Path,
) -> None:
    # One fp32 model for both: the engine's log μ̃ (renormalised over K) equals the learner's
    # log π̃ over the recorded K up to float32 noise; over the full vocabulary the learner is
    # lower by log S(K) ∈ [log 0.6, 0] — the bias replay removes.
    model, engine, prompts, pad = _tiny(tiny_model_dir)
    torch.manual_seed(1)
    groups = engine.generate(
        prompts, n=4, max_new_tokens=6, temperature=0.8, top_p=0.6, kept_sets=64
    )
    batch = to_batch(_scored(groups), pad_token_id=pad)
    assert batch.sampling_set is not None and batch.attention_mask is not None
    mask = batch.action_mask
    with torch.no_grad():
        replayed, _ = token_logprobs(
            model, batch.tokens, batch.attention_mask, temperature=0.8, kept_BTK=batch.sampling_set
        )
        full, _ = token_logprobs(model, batch.tokens, batch.attention_mask, temperature=0.8)
    assert float((replayed - batch.behavior_logprobs)[mask].abs().max()) < 1e-4
    log_s = (full - batch.behavior_logprobs)[mask]
    assert float(log_s.max()) < 1e-4 and float(log_s.min()) > math.log(0.6) - 1e-4
    assert float(log_s.min()) < -0.01  # some sets were truncated: without replay κ ≠ 1


def test_at_top_p_1_the_recorded_sets_are_the_vocabulary_and_change_nothing(
    tiny_model_dir: Path,
) -> None:
    model, engine, prompts, pad = _tiny(tiny_model_dir)
    torch.manual_seed(2)
    groups = engine.generate(
        prompts, n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, kept_sets=64
    )
    batch = to_batch(_scored(groups), pad_token_id=pad)
    assert batch.sampling_set is not None and batch.attention_mask is not None
    sizes = (batch.sampling_set >= 0).sum(-1)[batch.action_mask]
    assert bool((sizes == 51).all())  # every id of V = 51
    with torch.no_grad():
        replayed, _ = token_logprobs(
            model, batch.tokens, batch.attention_mask, kept_BTK=batch.sampling_set
        )
        full, _ = token_logprobs(model, batch.tokens, batch.attention_mask)
    torch.testing.assert_close(replayed, full, rtol=0, atol=1e-6)


def test_own_draw_keeps_no_set_over_its_cap() -> None:
    draw = OwnDraw(torch.Generator().manual_seed(0), kept_cap=2)
    scores = torch.tensor([[0.0, 1.0, -math.inf], [0.0, 1.0, 2.0]])
    draw(torch.zeros(2, 1, dtype=torch.long), scores)
    assert draw.kept[0].tolist() == [[1, 0], [-1, -1]]  # row 1 keeps 3 > 2 ids: not recorded


# --- the record: completions, episodes, the batch ---------------------------------------------


def _completion(ids: tuple[int, ...], kept: list[list[int]]) -> Completion:
    return Completion(
        prompt_ids=(1, 2),
        response_ids=ids,
        logprobs=(-0.5,) * len(ids),
        stopped=True,
        version=0,
        kept=kept_rows(kept, cap=8),
    )


def test_a_stop_string_cut_cuts_the_sets_too() -> None:
    c = dataclasses.replace(_completion((5, 6, 7), [[5], [6, 9], [7]]), stopped=False)
    stops = StopStrings(("b",), lambda ids: "".join("b" if i == 6 else "a" for i in ids))
    cut = cut_at_stop_strings(c, stops)
    assert cut.response_ids == (5, 6) and cut.kept is not None
    assert cut.kept.tolist() == [[5, -1], [6, 9]]


def test_turns_and_observations_line_up_in_the_episode_and_the_batch() -> None:
    r = _Running(env=None, prompt=(1, 2))  # type: ignore[arg-type]
    r.add_turn(_completion((5, 6), [[5, 8, 9], [6]]))
    r.add_observation([20, 21, 22])
    r.add_turn(_completion((7,), [[7, 3]]))
    episode = r.finish(End.TERMINAL, eos=True)
    assert episode.kept is not None
    assert episode.kept.tolist() == [
        [5, 8, 9],
        [6, -1, -1],
        [-1] * 3,
        [-1] * 3,
        [-1] * 3,
        [7, 3, -1],
    ]
    plain = Episode(
        prompt_ids=(4,),
        response_ids=(9,),
        action=(True,),
        logprobs=(0.0,),
        versions=(0,),
        turn_ids=(0,),
        end=End.TERMINAL,
        eos=True,
        rewards=(1.0,),
        status=RewardStatus.OK,
    )
    batch = to_batch(
        [
            Scored(episode, 0, 1.0, 1.0, RewardStatus.OK),
            Scored(plain, 1, 1.0, 1.0, RewardStatus.OK),
        ],
        pad_token_id=0,
    )
    # prompts end at column 2 (the longer one); each response's sets sit under its tokens
    assert batch.sampling_set is not None and tuple(batch.sampling_set.shape) == (2, 8, 3)
    assert batch.sampling_set[0, 2:].tolist() == episode.kept.tolist()
    assert bool((batch.sampling_set[0, :2] == -1).all() and (batch.sampling_set[1] == -1).all())
    picked = batch.select(torch.tensor([0])).to("cpu")
    assert picked.sampling_set is not None and torch.equal(
        picked.sampling_set, batch.sampling_set[:1]
    )


def test_the_batch_names_a_malformed_set_field() -> None:
    mask = torch.ones(2, 3, dtype=torch.bool)
    want = r"Batch.sampling_set: shape \(2, 3\), expected \(2, 3, K\)"
    with pytest.raises(ValueError, match=want):
        make_batch(mask, torch.zeros(2), sampling_set=torch.zeros(2, 3, dtype=torch.int32))


# --- the learner -------------------------------------------------------------------------------


def _settings(epochs: int = 2, **behaviour: object) -> UpdateSettings:
    return UpdateSettings(
        behaviour=BehaviourParams(**behaviour),  # type: ignore[arg-type]
        kl=KLParams(placement="loss", beta=0.1),
        reduction=ReductionParams(name="token_mean"),
        schedule=Schedule(epochs=epochs, minibatches=1, micro_batch_size=5, max_grad_norm=1e9),
        temperature=1.0,
    )


def _replay_batch(model_dir: Path) -> tuple[torch.nn.Module, Batch]:
    model, engine, prompts, pad = _tiny(model_dir)
    torch.manual_seed(3)
    groups = engine.generate(
        prompts, n=4, max_new_tokens=6, temperature=1.0, top_p=0.7, kept_sets=64
    )
    return model, to_batch(_scored(groups), pad_token_id=pad)


def test_pi_old_and_pi_ref_are_scored_over_the_sets(tiny_model_dir: Path) -> None:
    model, batch = _replay_batch(tiny_model_dir)
    mask = batch.action_mask
    on, _ = prepare_batch(batch, model, model, _settings(replay_sampling_set=True))
    off, _ = prepare_batch(batch, model, model, _settings())
    for x in (on.old_logprobs, on.ref_logprobs):  # both replayed: μ̃ reproduced
        assert x is not None
        assert float((x - batch.behavior_logprobs)[mask].abs().max()) < 1e-4
    assert off.old_logprobs is not None and off.ref_logprobs is not None
    assert float((off.old_logprobs - batch.behavior_logprobs)[mask].min()) < -0.01
    with pytest.raises(TrainingError) as info:  # replay asked, nothing recorded
        prepare_batch(
            batch.replace(sampling_set=None), model, None, _settings(replay_sampling_set=True)
        )
    assert "\n" not in str(info.value) and "behaviour.replay_sampling_set" in str(info.value)


def test_a_rank_scores_its_own_rows_over_their_own_sets(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The data-parallel branch of the log-prob pass: each of 2 ranks scores the rows it owns
    # over those rows' sets, and the exchanged rows land in place. Rank 1 runs first and its
    # part is handed to rank 0 as the all-gather would; the result must be the one process's.
    from rlmap.learner import policy as learner
    from rlmap.learner.distributed import World

    model, batch = _replay_batch(tiny_model_dir)
    s = _settings(replay_sampling_set=True)
    kept = learner.replayed_sets(batch, s.behaviour)
    owner = torch.arange(batch.tokens.shape[0]) % 2  # rows split 0, 1, 0, 1, …
    attention = learner.attention_of(batch)
    parts: list[object] = []

    def gather(world: World, obj: object) -> list[object]:
        parts.insert(0, obj) if world.rank == 0 else parts.append(obj)
        return list(parts)

    monkeypatch.setattr(learner, "gather", gather)
    for rank in (1, 0):
        two = learner._shared_logprobs(
            model,
            batch,
            attention,
            s,
            World(rank=rank, size=2),
            owner,
            None,
            sharded=False,
            kept=kept,
        )
    one = learner._shared_logprobs(
        model, batch, attention, s, World(), None, None, sharded=False, kept=kept
    )
    mask = batch.action_mask
    assert torch.allclose(two[mask], one[mask], atol=1e-6)
    assert float((one - batch.behavior_logprobs)[mask].abs().max()) < 1e-4  # over the sets


def test_kappa_tails_vanish_with_replay_and_the_set_metrics_are_logged(
    tiny_model_dir: Path,
) -> None:
    _, batch = _replay_batch(tiny_model_dir)
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(4))
    figures = {}
    for replay in (False, True):
        s = _settings(replay_sampling_set=replay)
        policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        opt = torch.optim.SGD(policy.parameters(), lr=0.0)  # κ is π_old/μ: no step needed
        prepared, _ = prepare_batch(batch, policy, policy, s)
        figures[replay] = update_policy(
            policy,
            opt,
            torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
            prepared,
            advantages * batch.action_mask,
            s,
            learner_version=0,
            generator=torch.Generator().manual_seed(0),
        )
    assert figures[True]["ratio/kappa/max_abs_log"] < 1e-4
    assert figures[False]["ratio/kappa/max_abs_log"] > 0.01  # the log S of truncated sets
    assert figures[True]["ratio/rho/max_abs_log"] < 1e-5  # π_θ over the sets too (lr = 0)
    assert "sampling_set/mean_size" not in figures[False]
    sets = batch.sampling_set
    assert sets is not None
    want = sampling_set_metrics(sets, batch.action_mask)
    assert {k: figures[True][k] for k in want} == want
    assert 1 <= want["sampling_set/mean_size"] < 51 and want["sampling_set/overflow_frac"] == 0


def test_the_set_metrics_by_hand() -> None:
    # 2 rows × 3 columns, action tokens at (0,1), (0,2), (1,0): sets of 2 ids, 1 id, none
    # (over the cap); (1,1) has a set but is not an action token
    sets = torch.tensor([[[-1, -1], [4, 5], [6, -1]], [[-1, -1], [1, 2], [-1, -1]]])
    mask = torch.tensor([[False, True, True], [True, False, False]])
    # mean size over recorded action tokens: (2 + 1) / 2 = 1.5; overflow: 1 of 3 tokens
    assert sampling_set_metrics(sets, mask) == {
        "sampling_set/mean_size": 1.5,
        "sampling_set/overflow_frac": 1 / 3,
    }


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_training_run_records_the_sets_and_its_kappa_loses_the_top_p_bias(
    tiny_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]], mode: str
) -> None:
    # fp32 engine sharing the fp32 learner: without replay |log κ| is the −log S(K) of each
    # truncated set (up to −log 0.7 = 0.357); with replay it is float32 noise
    base = [*toy(tiny_model_dir), "generation.top_p=0.7", f"system.mode={mode}"]
    kappa = {}
    for replay in ("false", "true"):
        cfg = build_config("grpo", None, [*base, f"behaviour.replay_sampling_set={replay}"])
        run_training(cfg, tmp_path / replay)
        records = [
            json.loads(x)
            for x in (tmp_path / replay / "metrics.jsonl").read_text().splitlines()[1:]
        ]
        kappa[replay] = max(r["ratio/kappa/max_abs_log"] for r in records)
        assert ("sampling_set/mean_size" in records[0]) == (replay == "true")
    assert kappa["true"] < 1e-4 < 0.01 < kappa["false"] <= -math.log(0.7) + 1e-4


# --- configuration and vLLM ----------------------------------------------------------------------


def test_replay_with_top_p_below_1_on_the_hf_engine_is_accepted() -> None:
    cfg = build_config(None, None, ["behaviour.replay_sampling_set=true", "generation.top_p=0.9"])
    assert cfg.behaviour.replay_sampling_set and cfg.behaviour.sampling_set_cap == 512


def test_vllm_sets_come_from_its_sampling_mask_and_a_missing_one_is_refused() -> None:
    sample = SimpleNamespace(
        token_ids=[4, 2], sampling_mask=SimpleNamespace(token_ids=[[4, 7, 9], [2]])
    )
    assert sampled_sets(sample, cap=8).tolist() == [[4, 7, 9], [2, -1, -1]]
    assert sampled_sets(sample, cap=2).tolist() == [[-1], [2]]  # 3 ids over a cap of 2
    for mask in (None, SimpleNamespace(token_ids=[[4]])):  # none, or one set for two tokens
        with pytest.raises(TrainingError, match="vLLM returned no kept set"):
            sampled_sets(SimpleNamespace(token_ids=[4, 2], sampling_mask=mask), cap=8)
    engine = VLLMEngine.__new__(VLLMEngine)  # one built without return_sampling_mask
    engine.sampling_masks = False
    with pytest.raises(ConfigError, match=r"behaviour\.replay_sampling_set: this vLLM engine"):
        engine.generate([[1, 2]], n=1, max_new_tokens=2, temperature=1.0, top_p=0.9, kept_sets=8)
