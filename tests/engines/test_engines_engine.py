"""The Hugging Face rollout engine: behaviour log-probs, stopping, seeding, precision, isolation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor
from transformers import Qwen2ForCausalLM

from rlmap.embedded.tiny import TinySpec, build_tiny_model
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.engines.engine import Completion, RolloutEngine
from rlmap.engines.hf import HFEngine, left_pad, response_lengths

PAD, BOS, EOS = 0, 1, 2
# different lengths, so left padding and the attention mask matter
PROMPTS = [[BOS, 10, 11, 12, 13], [BOS, 20], [BOS, 30, 31]]


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    spec = TinySpec(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return build_tiny_model(build_tokenizer(), spec, seed).eval()


def engine(
    model: torch.nn.Module, dtype: torch.dtype = torch.float32, max_batch: int = 256
) -> HFEngine:
    return HFEngine(model, pad_token_id=PAD, eos_token_id=EOS, dtype=dtype, max_batch=max_batch)


def sample(eng: HFEngine, seed: int, own: bool = False, **kw: object) -> list[list[Completion]]:
    """Completions from torch's default generator seeded with ``seed``, or (``own``) from
    the engine's own generator seeded with it (what the asynchronous loop's workers do)."""
    args: dict = {"n": 3, "max_new_tokens": 8, "temperature": 0.7, "top_p": 1.0, **kw}
    eng.reseed(seed if own else None)
    torch.manual_seed(seed)
    return eng.generate(PROMPTS, **args)


def step_logits(model: torch.nn.Module, c: Completion) -> Tensor:
    """(L, V) float32 logits that predicted each response token, from one unpadded forward."""
    ids = torch.tensor([c.prompt_ids + c.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    return logits[len(c.prompt_ids) - 1 : -1]


def flat(groups: list[list[Completion]]) -> list[Completion]:
    return [c for g in groups for c in g]


# --- pure helpers -----------------------------------------------------------------------


def test_left_pad_right_aligns_and_masks_by_length() -> None:
    ids, mask = left_pad([[1, 2, 3], [4], [PAD, 5]], PAD, torch.device("cpu"))
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4], [0, 0, 5]]
    # the third prompt's own leading 0 is a real token: the mask comes from its length (2)
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]


def test_response_lengths_cut_after_first_eos() -> None:
    tokens = torch.tensor(
        [[5, EOS, PAD, PAD], [5, 6, 7, 8], [EOS, PAD, PAD, PAD], [6, EOS, 7, EOS]]
    )
    lengths, ended = response_lengths(tokens, (EOS,))
    # EOS at index 1 -> length 2; no EOS -> all 4 steps; EOS first -> 1; the first EOS counts
    assert lengths.tolist() == [2, 4, 1, 2]
    assert ended.tolist() == [True, False, True, True]


# --- behaviour log-probs ------------------------------------------------------------------


OWN = pytest.mark.parametrize("own", [False, True], ids=["default-generator", "own-generator"])


@OWN
def test_logprobs_equal_tempered_recomputation_across_chunks(own: bool) -> None:
    model = tiny_model()
    eng = engine(model, max_batch=4)  # 3 prompts x 3 samples = 9 sequences -> chunks of 4, 4, 1
    for c in flat(sample(eng, seed=1, own=own, temperature=0.7)):
        want = step_logits(model, c).div(0.7).log_softmax(-1)
        want = want.gather(-1, torch.tensor(c.response_ids)[:, None]).squeeze(-1)
        assert len(c.logprobs) == len(c.response_ids) > 0
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0)


def nucleus_mass(probs: Tensor, top_p: float) -> Tensor:
    """(L,) mass of the tokens top-p keeps: those with < top_p probability ranked above them."""
    p = probs.sort(-1, descending=True).values  # (L, V)
    return (p * ((p.cumsum(-1) - p) < top_p)).sum(-1)


@OWN
def test_top_p_samples_inside_nucleus_with_renormalised_logprob(own: bool) -> None:
    model, top_p, temperature = tiny_model(), 0.3, 0.5
    for c in flat(sample(engine(model), seed=2, own=own, temperature=temperature, top_p=top_p)):
        probs = step_logits(model, c).div(temperature).softmax(-1)  # (L, V)
        chosen = probs.gather(-1, torch.tensor(c.response_ids)[:, None]).squeeze(-1)  # (L,)
        mass_above = (probs * (probs > chosen[:, None])).sum(-1)
        assert (mass_above < top_p).all(), "a sampled token lies outside the nucleus"
        # log μ = log p(token) - log(nucleus mass): renormalised, so above the raw tempered log p
        want = chosen.log() - nucleus_mass(probs, top_p).log()
        got = torch.tensor(c.logprobs)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        assert (got > chosen.log() + 0.1).all()  # the nucleus holds well under e^-0.1 of the mass


@OWN
def test_greedy_decodes_argmax_with_raw_logprobs(own: bool) -> None:
    model = tiny_model()
    for c in flat(sample(engine(model), seed=3, own=own, temperature=0.0, n=2)):
        log_p = step_logits(model, c).log_softmax(-1)  # raw softmax: no temperature at greedy
        assert list(c.response_ids) == log_p.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(c.logprobs), log_p.amax(-1), atol=1e-4, rtol=0)


# --- stopping -----------------------------------------------------------------------------

CHAIN = {10: 11, 11: 12, 12: EOS, 20: 21, 21: 22, 22: 23, 23: 24, 30: 31, 31: EOS}


def force_chain(model: torch.nn.Module) -> None:
    """Make the next token a deterministic function of the last one (CHAIN), others -> 40."""
    table = torch.full((64,), 40)
    for last, nxt in CHAIN.items():
        table[last] = nxt

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        logits = output.logits  # type: ignore[attr-defined]  # (B, 1, V) during generate
        target = table[kwargs["input_ids"][:, -1]]  # (B,)
        logits[:, -1] = -100.0
        logits[torch.arange(len(target)), -1, target] = 100.0

    model.register_forward_hook(hook, with_kwargs=True)


def test_eos_stops_each_sequence_and_truncation_is_flagged() -> None:
    model = tiny_model()
    force_chain(model)
    out = engine(model).generate(PROMPTS, n=2, max_new_tokens=3, temperature=1.0, top_p=1.0)
    first, second, third = (g[0] for g in out)
    # prompt ends in 13 -> 40 40 40: hits max_new_tokens
    assert first.response_ids == (40, 40, 40) and not first.stopped
    # 20 -> 21 22 23: also truncated, exactly max_new_tokens long
    assert second.response_ids == (21, 22, 23) and not second.stopped
    # 31 -> EOS after one token: stops there, no padding kept after it
    assert third.response_ids == (EOS,) and third.stopped and len(third.logprobs) == 1
    # forced tokens have probability ~1: log μ ~ 0
    assert all(abs(lp) < 1e-4 for c in flat(out) for lp in c.logprobs)


def test_eos_mid_response_in_a_mixed_batch() -> None:
    model = tiny_model()
    force_chain(model)
    prompts = [[BOS, 10], [BOS, 20]]
    a, b = (
        g[0] for g in engine(model).generate(prompts, n=1, max_new_tokens=6, temperature=1, top_p=1)
    )
    assert (
        a.response_ids == (11, 12, EOS) and a.stopped
    )  # the batch ran on; its padding is stripped
    assert b.response_ids == (21, 22, 23, 24, 40, 40) and not b.stopped


def test_stop_tokens_end_a_row_like_eos_and_stay_in_the_response() -> None:
    model = tiny_model()
    force_chain(model)
    prompts = [[BOS, 10], [BOS, 20]]
    a, b = (
        g[0]
        for g in engine(model).generate(
            prompts, n=1, max_new_tokens=6, temperature=1, top_p=1, stop_token_ids=(22,)
        )
    )
    # 10 -> 11 12 EOS never meets 22; 20 -> 21 22 stops at the stop token, which it keeps
    assert a.response_ids == (11, 12, EOS) and a.stopped
    assert b.response_ids == (21, 22) and b.stopped and len(b.logprobs) == 2
    # without the stop token the same row runs to the limit
    (c,) = engine(model).generate([[BOS, 20]], n=1, max_new_tokens=6, temperature=1, top_p=1)[0:1]
    assert c[0].response_ids == (21, 22, 23, 24, 40, 40) and not c[0].stopped


# --- seeding and layout -------------------------------------------------------------------


def test_same_seed_same_completions_and_layout() -> None:
    eng = engine(tiny_model())
    a, b, c = sample(eng, seed=5), sample(eng, seed=5), sample(eng, seed=6)
    assert a == b
    assert a != c
    assert [len(g) for g in a] == [3, 3, 3]
    assert [[x.prompt_ids for x in g] for g in a] == [[tuple(p)] * 3 for p in PROMPTS]
    assert len({x.response_ids for x in a[0]}) > 1  # the n samples differ


@OWN
def test_samples_follow_the_tempered_distribution(own: bool) -> None:
    # 4,000 one-token samples of one prompt at T = 0.3: their frequencies are softmax(z/T)'s,
    # up to sampling noise (total variation about 0.04 here); the untempered softmax(z) lies
    # 0.23 away, so a draw that skipped the temperature would fail.
    model, eng = tiny_model(), engine(tiny_model())
    eng.reseed(11 if own else None)
    torch.manual_seed(12)
    (group,) = eng.generate([PROMPTS[0]], n=4000, max_new_tokens=1, temperature=0.3, top_p=1.0)
    with torch.no_grad():
        probs = model(torch.tensor([PROMPTS[0]])).logits[0, -1].float().div(0.3).softmax(-1)
    first = torch.tensor([c.response_ids[0] for c in group])
    counts = torch.bincount(first, minlength=len(probs))
    assert 0.5 * (counts / 4000 - probs).abs().sum() < 0.1


def test_an_engine_with_its_own_generator_repeats_and_leaves_torchs_alone() -> None:
    eng = engine(tiny_model())
    state = torch.get_rng_state()
    eng.reseed(5)
    a = eng.generate(PROMPTS, n=2, max_new_tokens=5, temperature=1.0, top_p=0.9)
    assert torch.equal(torch.get_rng_state(), state)  # torch's default generator untouched
    torch.manual_seed(123)  # whatever the default generator holds, the seed decides
    eng.reseed(5)
    assert eng.generate(PROMPTS, n=2, max_new_tokens=5, temperature=1.0, top_p=0.9) == a
    eng.reseed(6)
    assert eng.generate(PROMPTS, n=2, max_new_tokens=5, temperature=1.0, top_p=0.9) != a


def test_restoring_rng_state_reproduces_rollouts() -> None:
    eng = engine(tiny_model())
    state = torch.get_rng_state()
    a = eng.generate(PROMPTS, n=2, max_new_tokens=5, temperature=1.0, top_p=0.9)
    torch.set_rng_state(state)
    assert eng.generate(PROMPTS, n=2, max_new_tokens=5, temperature=1.0, top_p=0.9) == a


def test_invalid_arguments_name_the_argument() -> None:
    eng = engine(tiny_model())
    with pytest.raises(ValueError, match="top_p"):
        eng.generate(PROMPTS, n=1, max_new_tokens=4, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="prompts"):
        eng.generate([[]], n=1, max_new_tokens=4, temperature=1.0, top_p=1.0)


# --- precision and weight updates ---------------------------------------------------------


def test_float32_engine_shares_the_policy_and_restores_its_mode() -> None:
    policy = tiny_model().train()
    eng = engine(policy)
    assert isinstance(eng, RolloutEngine) and eng.shares_policy and eng.model is policy
    sample(eng, seed=0)
    assert policy.training  # eval() during generation only
    policy(torch.tensor([PROMPTS[0]])).logits.sum().backward()  # no inference tensors leaked
    eng.update_weights(policy, version=7)
    assert eng.version == 7 and all(c.version == 7 for c in flat(sample(eng, seed=0)))


def test_bf16_engine_owns_a_copy_until_update_weights() -> None:
    policy = tiny_model(seed=0)
    eng = engine(policy, dtype=torch.bfloat16)
    assert not eng.shares_policy and eng.model is not policy
    assert {p.dtype for p in eng.model.parameters()} == {torch.bfloat16}
    # only parameters are cast, buffers stay as in from_pretrained(dtype=torch.bfloat16)
    assert eng.model.model.rotary_emb.inv_freq.dtype == torch.float32
    before = sample(eng, seed=0)

    policy.load_state_dict(tiny_model(seed=1).state_dict())  # the learner moves on
    assert sample(eng, seed=0) == before  # the copy is untouched until update_weights

    eng.update_weights(policy, version=3)
    after = sample(eng, seed=0)
    assert eng.version == 3 and all(c.version == 3 for c in flat(after))
    assert [c.response_ids for c in flat(after)] != [c.response_ids for c in flat(before)]
    for name, p in eng.model.named_parameters():
        assert torch.equal(p, policy.get_parameter(name).to(torch.bfloat16)), name


# --- the model's shipped generation config is ignored -------------------------------------


def test_shipped_generation_config_does_not_change_sampling() -> None:
    clean = tiny_model()
    shipped = copy.deepcopy(clean)
    g = shipped.generation_config
    g.do_sample, g.top_k, g.temperature, g.repetition_penalty = False, 1, 0.1, 5.0
    g.min_p, g.suppress_tokens, g.min_new_tokens = 0.5, [EOS, 40], 4
    samples = sample(engine(shipped), seed=9, n=6)
    assert samples == sample(engine(clean), seed=9, n=6)
    assert len({c.response_ids[0] for c in samples[0]}) > 1  # top_k=1 would make them all equal
    assert shipped.generation_config.top_k == 1  # restored after the call


def test_a_seeded_engine_never_keeps_every_steps_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    # (T, B, V) scores at a real vocabulary (B = 256, T = 256, V = 151,936) are 39.8 GB; the
    # engine's own draw keeps log μ of each drawn token, (B,) a step, so generate must not
    # return them, with a generator of its own or without one.
    eng = HFEngine(tiny_model(), pad_token_id=PAD, eos_token_id=EOS)
    asked: list[bool] = []
    real = type(eng.model).generate

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(self, *args, **kwargs)
        asked.append(bool(kwargs["generation_config"].output_scores))
        assert (out.scores is not None) == asked[-1]
        return out

    monkeypatch.setattr(type(eng.model), "generate", spy)
    eng.reseed(0)
    (group,) = eng.generate([[1, 5, 6]], n=2, max_new_tokens=4, temperature=1.0, top_p=1.0)
    eng.reseed(None)
    eng.generate([[1, 5, 6]], n=2, max_new_tokens=4, temperature=1.0, top_p=1.0)
    assert asked == [False, False]
    assert all(len(c.logprobs) == len(c.response_ids) for c in group)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.6), (1.5, 0.9)])
def test_without_a_generator_of_its_own_the_draws_are_generates_own(
    temperature: float, top_p: float
) -> None:
    # Reference: transformers' own sampling (do_sample, its warpers, multinomial on torch's
    # default generator) from the same RNG state gives the same tokens, row by row — the
    # engine's draw replaced it without changing a number of any run.
    from transformers import GenerationConfig

    from rlmap.engines.hf import rollout_mode
    from rlmap.engines.hf_sampling import FiniteScores

    model = tiny_model(1)
    eng = HFEngine(model, pad_token_id=PAD, eos_token_id=EOS)
    prompts = [[1, 5, 6], [1, 7]]
    torch.manual_seed(3)
    ours = [
        c
        for g in eng.generate(prompts, n=3, max_new_tokens=6, temperature=temperature, top_p=top_p)
        for c in g
    ]
    config = GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        max_new_tokens=6,
        min_new_tokens=0,
        pad_token_id=PAD,
        eos_token_id=[EOS],
        output_scores=True,
        return_dict_in_generate=True,
    )
    ids, mask = left_pad([p for p in prompts for _ in range(3)], PAD, torch.device("cpu"))
    torch.manual_seed(3)
    with rollout_mode(model):
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            logits_processor=[FiniteScores()],
        )
    theirs = out.sequences[:, ids.shape[1] :]
    scores = torch.stack(out.scores, dim=1).float()  # (B, T, V): what generate drew from
    mu = scores.gather(-1, theirs.unsqueeze(-1)).squeeze(-1) - scores.logsumexp(-1)
    assert len({c.response_ids for c in ours}) > 1  # the draws do differ between rows
    for i, c in enumerate(ours):
        n = len(c.response_ids)
        assert list(c.response_ids) == theirs[i, :n].tolist()
        assert torch.equal(torch.tensor(c.logprobs), mu[i, :n])  # log μ, bit for bit
