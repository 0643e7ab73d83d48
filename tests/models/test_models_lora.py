"""LoRA policies: π_ref is the base with the adapters off, engines sample from the merged
weights, only the adapters train, checkpoints load with peft (and merged, without), resume
is exact, bad settings are one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.assembly.models import check_model_dir, load_causal_lm
from rlmap.assembly.parts import Parts, build
from rlmap.cli import main
from rlmap.core.batch import Batch, RewardStatus
from rlmap.core.errors import ConfigError, InputError
from rlmap.experiments.checkpoint import latest_checkpoint
from rlmap.experiments.checkpoint_load import checkpoint_problem
from rlmap.experiments.evaluation import evaluate_checkpoint
from rlmap.experiments.train import run_training
from rlmap.learner.logprobs import token_logprobs
from rlmap.learner.policy import prepare_batch, update_policy
from rlmap.models import lora
from rlmap.recipes import build_config
from rlmap.rollout.episodes import single_turn
from rlmap.rollout.packing import Scored, to_batch
from rlmap.system.board import Board
from rlmap.system.ray_workers import rollout_config
from rlmap.tasks.prompts import encode_prompt

Toy = Callable[..., list[str]]
LORA = ["model.lora_rank=4", "optim.lr=1e-3"]
SHAPED = ["feedback.length_target=2", "feedback.length_weight=1"]
"""A reward that varies within a group on an untrained model (its answers are all wrong):
non-zero advantages, so a toy run really moves the adapters."""


def _parts(model_dir: Path, toy: Toy, *extra: str) -> Parts:
    cfg = build_config("grpo", None, [*toy(model_dir), *LORA, *extra])  # grpo: KL in the loss
    return build(cfg, model_dir)


def _perturb(policy: torch.nn.Module, seed: int = 0) -> None:
    """Non-zero adapters (B starts at 0, where the merged model is the base whatever the
    merge does): every LoRA weight redrawn, large enough to move the log-probs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def _base_params(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}


def _batch(parts: Parts, n: int = 3) -> Batch:
    prompts = [encode_prompt(parts.tokenizer, p) for p in ("1+2=", "37+85=", "9+9=")]
    torch.manual_seed(0)
    groups = parts.engine.generate(prompts, n=n, max_new_tokens=6, temperature=1.0, top_p=1.0)
    scored = [
        Scored(single_turn(c), g, float(k % 2), float(k % 2), RewardStatus.OK)
        for g, group in enumerate(groups)
        for k, c in enumerate(group)
    ]
    return to_batch(scored, pad_token_id=int(parts.tokenizer.pad_token_id))


def test_the_reference_is_the_base_with_adapters_off_and_no_second_model(
    tiny_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: list[Path] = []
    real = load_causal_lm

    def loading(path: Path, dtype: torch.dtype | None = None, device: object = None) -> object:
        loaded.append(path)
        return real(path, dtype, device)  # type: ignore[arg-type]

    monkeypatch.setattr("rlmap.assembly.parts.load_causal_lm", loading)
    parts = _parts(tiny_model_dir, toy)
    assert len(loaded) == 1  # the policy's base only: no reference copy
    assert parts.reference is parts.policy and lora.is_lora(parts.policy)
    _perturb(parts.policy)
    batch = _batch(parts)
    prepared, _ = prepare_batch(batch, parts.policy, parts.reference, parts.settings)
    assert prepared.ref_logprobs is not None
    assert parts.policy.training  # the π_ref pass left the policy's mode as it was
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        expected, _ = token_logprobs(base.eval(), batch.tokens, batch.attention_mask)
        adapted, _ = token_logprobs(parts.policy.eval(), batch.tokens, batch.attention_mask)
    mask = batch.action_mask
    assert torch.equal(prepared.ref_logprobs[mask], expected[mask])  # the base, exactly
    assert (adapted - expected)[mask].abs().max() > 1e-2  # the adapters do move π_θ


def test_training_moves_the_adapters_and_never_the_base(tiny_model_dir: Path, toy: Toy) -> None:
    parts = _parts(tiny_model_dir, toy)
    trained = {id(p) for group in parts.optimizer.param_groups for p in group["params"]}
    adapters = {id(p) for n, p in parts.policy.named_parameters() if "lora_" in n}
    assert trained == adapters and adapters  # only the adapters are in the optimiser
    base = _base_params(parts.policy)
    lora_before = {
        n: p.detach().clone() for n, p in parts.policy.named_parameters() if "lora_B" in n
    }
    batch = _batch(parts)
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(1))
    prepared, _ = prepare_batch(batch, parts.policy, parts.reference, parts.settings)
    for _ in range(2):
        update_policy(
            parts.policy,
            parts.optimizer,
            parts.scheduler,
            prepared,
            advantages * batch.action_mask,
            parts.settings,
            learner_version=0,
            generator=torch.Generator().manual_seed(0),
        )
    after = _base_params(parts.policy)
    assert all(torch.equal(base[n], after[n]) for n in base)
    moved = [
        n
        for n, p in parts.policy.named_parameters()
        if "lora_B" in n and not torch.equal(p, lora_before[n])
    ]
    assert len(moved) == len(lora_before)


@pytest.fixture(scope="module")
def untied_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_model_dir`` with its output layer untied from the input embeddings (its own
    copy of the weight), so ``lm_head`` and ``embed_tokens`` can be adapted."""
    path = tmp_path_factory.mktemp("untied")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    return path


TARGET_KINDS = {
    "attention": "q_proj,k_proj,v_proj,o_proj",
    "mlp": "gate_proj,up_proj,down_proj",
    "output": "lm_head",
    "embedding": "embed_tokens",
}
"""Every kind of layer LoRA may adapt: attention and MLP linears, the output layer and the
input embeddings (the last two on the untied model; tied, they are refused)."""


@pytest.mark.parametrize("kind", TARGET_KINDS)
def test_the_engine_samples_from_the_merged_weights(
    kind: str, tiny_model_dir: Path, untied_model_dir: Path, toy: Toy
) -> None:
    # μ reported by the engine (a plain model holding W + (α/r)·BA) must be π_θ of the LoRA
    # policy itself: κ = 1 up to float32 noise, after every update, whatever layer is adapted.
    # Before: an adapted embedding had no lora_A module and the merge failed outright.
    model_dir = untied_model_dir if kind in ("output", "embedding") else tiny_model_dir
    parts = _parts(model_dir, toy, f"model.lora_targets={TARGET_KINDS[kind]}")
    assert not lora.is_lora(parts.engine.model)  # a plain copy of the base architecture
    for seed in (0, 1):
        _perturb(parts.policy, seed)
        base = _base_params(parts.policy)
        parts.engine.update_weights(parts.policy, seed + 1)
        assert all(torch.equal(base[n], p) for n, p in _base_params(parts.policy).items())
        batch = _batch(parts)
        with torch.no_grad():
            logprobs, _ = token_logprobs(parts.policy.eval(), batch.tokens, batch.attention_mask)
        gap = (logprobs - batch.behavior_logprobs)[batch.action_mask].abs().max()
        assert float(gap) < 1e-5
    plain = AutoModelForCausalLM.from_pretrained(model_dir)  # the unmerged base is not it
    with torch.no_grad():
        unmerged, _ = token_logprobs(plain.eval(), batch.tokens, batch.attention_mask)
    assert float((unmerged - batch.behavior_logprobs)[batch.action_mask].abs().max()) > 1e-2


def test_published_weights_are_a_plain_models(tiny_model_dir: Path, toy: Toy) -> None:
    # Async workers and Ray actors load the board's snapshot into a plain model (a Ray
    # actor builds its side without adapters): it must be the merged state dict.
    parts = _parts(tiny_model_dir, toy)
    _perturb(parts.policy)
    board = Board(0, {})
    board.publish(parts.policy, 1)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain.load_state_dict(board.latest()[1])  # strict: every key, no adapter keys
    batch = _batch(parts)
    with torch.no_grad():
        ours, _ = token_logprobs(plain.eval(), batch.tokens, batch.attention_mask)
        policy, _ = token_logprobs(parts.policy.eval(), batch.tokens, batch.attention_mask)
    assert float((ours - policy)[batch.action_mask].abs().max()) < 1e-5
    assert rollout_config(parts.cfg).model.lora_rank == 0


def test_checkpoint_loads_with_peft_and_merged_with_plain_transformers(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    cfg = build_config("grpo", None, [*toy(tiny_model_dir), *LORA, *SHAPED, "run.save_merged=true"])
    run_training(cfg, tmp_path / "run")
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.name == "step_2"
    assert (ckpt / lora.ADAPTER_WEIGHTS).is_file() and not (ckpt / "model.safetensors").exists()
    assert checkpoint_problem(ckpt) is None
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ckpt)
    merged = AutoModelForCausalLM.from_pretrained(ckpt / lora.MERGED_DIR)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    ids = torch.tensor([[*encode_prompt(tokenizer, "12+34="), 5, 6, 7]])
    with torch.no_grad():
        a, m, b = (model.eval()(input_ids=ids).logits for model in (adapted, merged, base))
    assert torch.allclose(a, m, atol=1e-5, rtol=0)
    assert (a - b).abs().max() > 1e-4  # two steps at lr 1e-3 moved the adapters
    evaluated = evaluate_checkpoint(ckpt, samples=1)  # rlmap eval: the base + the adapter
    assert 0 <= evaluated["eval/pass@1"] <= 1
    (ckpt / lora.ADAPTER_WEIGHTS).write_bytes(b"\x00" * 8)  # damaged: named, one line
    problem = checkpoint_problem(ckpt)
    assert problem is not None and lora.ADAPTER_WEIGHTS in problem


@pytest.mark.parametrize(
    ("recipe", "extra"),
    [
        ("grpo", ["system.mode=async", "system.workers=1"]),  # a worker's engine, the board
        ("ppo", []),  # the critic beside a LoRA policy: its own full model
    ],
)
def test_lora_runs_asynchronously_and_beside_a_full_critic(
    recipe: str, extra: list[str], tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    cfg = build_config(recipe, None, [*toy(tiny_model_dir), *LORA, *SHAPED, *extra])
    summary = run_training(cfg, tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    assert (ckpt / lora.ADAPTER_WEIGHTS).is_file() and summary["after"]["eval/pass@1"] is not None
    if cfg.critic.enabled:
        assert (ckpt / "critic" / "model.safetensors").is_file()
        assert checkpoint_problem(ckpt, ["critic"]) is None
    adapter = _adapter(ckpt)
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in adapter.items())


def test_resume_of_a_lora_run_is_exact(
    tiny_model_dir: Path, tmp_path: Path, crash_in_step: Callable[..., None], toy: Toy
) -> None:
    cfg = build_config(
        "grpo",
        None,
        [
            *toy(tiny_model_dir, steps=4),
            *LORA,
            *SHAPED,
            "run.checkpoint_every=2",
            "run.eval_every=2",
        ],
    )
    run_training(cfg, tmp_path / "straight")
    crash_in_step(cfg, tmp_path / "crashed", 3)
    run_training(cfg, tmp_path / "crashed", resume=True)
    assert _records(tmp_path / "crashed") == _records(tmp_path / "straight")
    weights = [
        _adapter(tmp_path / run / "checkpoints" / "step_4") for run in ("straight", "crashed")
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in weights[0].items())


def _is_timing(key: str) -> bool:
    """Seconds differ between any two runs: every ``system/*`` and every ``budget/*_s``."""
    return key.startswith("system/") or (key.startswith("budget/") and key.endswith("_s"))


def _records(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not _is_timing(k)} for r in rows]


def _adapter(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(ckpt / lora.ADAPTER_WEIGHTS)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("model.lora_rank=-1", "model.lora_rank: must be >= 0"),
        ("model.lora_alpha=0", "model.lora_alpha: must be > 0"),
        ("model.lora_targets=[]", "model.lora_targets: needs one or more module names"),
        ("model.lora_targets=q_proj,,v_proj", "model.lora_targets: needs one or more"),
        ("run.save_merged=true", "run.save_merged: needs model.lora_rank > 0"),
    ],
)
def test_bad_lora_settings_are_one_line_naming_the_field(override: str, field: str) -> None:
    extra = [] if override.startswith(("model.lora_rank", "run.")) else ["model.lora_rank=8"]
    with pytest.raises(ConfigError) as caught:
        build_config("grpo", None, [*extra, override])
    assert str(caught.value).startswith(field) and "\n" not in str(caught.value)


def test_targets_take_a_list_or_a_comma_string_and_must_exist(
    tiny_model_dir: Path, toy: Toy
) -> None:
    listed = build_config(
        "grpo", None, ["model.lora_rank=2", "model.lora_targets=[q_proj, v_proj]"]
    )
    comma = build_config("grpo", None, ["model.lora_rank=2", "model.lora_targets=q_proj, v_proj"])
    assert listed.model.lora_modules == comma.model.lora_modules == ("q_proj", "v_proj")
    assert listed.model.resolved_lora_alpha == 4  # unset: 2·r
    parts = _parts(tiny_model_dir, toy, "model.lora_targets=q_proj")
    adapted = {name for name, _ in lora._lora_layers(parts.policy)}
    assert adapted and all(name.endswith(".q_proj") for name in adapted)
    with pytest.raises(ConfigError, match=r"^model.lora_targets: no module named 'c_attn'"):
        _parts(tiny_model_dir, toy, "model.lora_targets=q_proj,c_attn")


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens", "q_proj,lm_head"])
def test_a_tied_target_is_refused_naming_the_field(
    target: str, tiny_model_dir: Path, toy: Toy
) -> None:
    # The embedded model ties lm_head to embed_tokens. Before: the run trained with κ
    # drifting (ratio/kappa/max_abs_log 0.04 at step 2, 0.30 at step 3 with lr 1e-2): the
    # engine's merged copy put W + ΔW on both sides of the tie, the learner only on one.
    with pytest.raises(ConfigError) as caught:
        _parts(tiny_model_dir, toy, f"model.lora_targets={target}")
    message = str(caught.value)
    assert message.startswith("model.lora_targets: ") and "\n" not in message
    assert "tied" in message and ("lm_head" in message and "embed_tokens" in message)


def test_an_adapter_directory_is_no_start_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    parts_dir = tmp_path / "adapter"
    policy = lora.attach(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        rank=2,
        alpha=4,
        targets=("q_proj",),
        seed=0,
    )
    policy.save_pretrained(parts_dir)
    check_model_dir(parts_dir, adapter=True)
    with pytest.raises(ConfigError, match=r"^model.path: .* holds a LoRA adapter"):
        check_model_dir(parts_dir, "model.path")
    (parts_dir / lora.ADAPTER_CONFIG).write_text('{"peft_type": "IA3"}')
    with pytest.raises(InputError, match="not a LoRA adapter config"):
        check_model_dir(parts_dir, adapter=True)


def test_cli_trains_a_lora_policy(tiny_model_dir: Path, tmp_path: Path, toy: Toy) -> None:
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--recipe",
                "grpo",
                "--out",
                str(run),
                *toy(tiny_model_dir),
                "model.lora_rank=8",
            ]
        )
        == 0
    )
    assert (run / "checkpoints" / "step_2" / lora.ADAPTER_CONFIG).is_file()
    config = json.loads((run / "checkpoints" / "step_2" / lora.ADAPTER_CONFIG).read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16


def test_targets_are_checked_on_the_architecture_alone() -> None:
    # issue 27: a norm or a container reached peft, whose error printed the module's
    # structure (600+ characters). On the meta device: no storage, only names and types.
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # untied: attention q/k/v/o_proj and MLP gate/up/down_proj (Linear), lm_head (Linear),
    # embed_tokens (Embedding); by last name, sorted
    valid = "down_proj,embed_tokens,gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj"
    lora.check_targets(model, ("q_proj", "self_attn.v_proj", "lm_head", "embed_tokens"))
    refusals = (
        ("input_layernorm", "a Qwen2RMSNorm"),
        ("mlp", "a Qwen2MLP"),
        ("layers", "a ModuleList"),
        ("c_attn", "no module named 'c_attn'"),
    )
    for target, why in refusals:
        with pytest.raises(ConfigError) as caught:
            lora.check_targets(model, ("q_proj", target))
        message = str(caught.value)
        assert message.startswith("model.lora_targets: ") and why in message, message
        assert message.endswith(f"valid targets of Qwen2ForCausalLM: {valid}"), message
