"""End-to-end runs at toy scale: every trainable preset, the run directory, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from rlmap.assembly.checks import check_inputs
from rlmap.assembly.data import load_data
from rlmap.assembly.parts import build
from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.engines.hf import HFEngine
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.tasks.prompts import encode_prompt

Toy = Callable[..., list[str]]
CRITIC_FREE = [
    "grpo",
    "dr-grpo",
    "rloo",
    "reinforce",
    "dapo",
    "gspo",
    "cispo",
    "sapo",
    "dppo",
    "dro",
    "gmpo",
]


@pytest.mark.parametrize("recipe", CRITIC_FREE)
def test_each_critic_free_preset_runs(
    recipe: str, tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    overrides = toy(tiny_model_dir)
    if recipe == "dapo":
        overrides.append("feedback.overlong_cache=2")
    if recipe == "dr-grpo":
        overrides.append("reduction.max_len=4")
    cfg = build_config(recipe, None, overrides)
    summary = run_training(cfg, tmp_path / "run")
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    learned = any("loss/policy" in r for r in records)
    # no critic, so no critic compute; π_ref runs whenever the KL is on and a batch was learned
    assert summary["compute_share"]["critic"] == 0
    assert (summary["compute_share"]["reference"] > 0) == (cfg.kl.placement != "none" and learned)
    assert records[-1]["budget/generated_tokens"] > 0
    assert "loss/policy" in records[-1] or records[-1]["sampling/kept_frac"] == 0
    assert not any(k.startswith(("env/", "eval/tool")) for r in records for k in r)  # one turn
    assert summary["before"]["eval/pass@1"] is not None
    assert (run / "config.yaml").read_text().startswith("# ")
    for name in ("ledger.json", "summary.json"):
        assert json.loads((run / name).read_text())
    assert (run / "checkpoints" / "step_2" / "config.json").exists()
    _check_compute_share(run, records)


def _check_compute_share(run: Path, records: list[dict[str, Any]]) -> None:
    """ledger.json's seconds are the sums of the logged timings; summary.json shares them out."""
    ledger = json.loads((run / "ledger.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    logged = {
        "rollout_s": ("system/rollout_s",),
        "actor_s": ("system/old_logprobs_s", "system/policy_update_s"),
        "critic_s": ("system/critic_values_s", "system/critic_update_s"),
        "reference_s": ("system/reference_s",),
    }
    for field, names in logged.items():
        total = sum(r.get(name, 0.0) for r in records for name in names)
        assert ledger[field] == pytest.approx(total), field
    share = summary["compute_share"]
    assert share["seconds"]["reference"] == ledger["reference_s"]
    if ledger["actor_s"] + ledger["critic_s"] + ledger["reference_s"] > 0:
        assert share["actor"] + share["critic"] + share["reference"] == pytest.approx(1.0)


CRITIC_METRICS = (
    "critic/value_loss",
    "critic/explained_variance",
    "critic/value_error_first",
    "critic/value_error_last",
    "critic/grad_norm",
    "critic/pretraining",
    "system/critic_update_s",
    "system/critic_values_s",
)


def _records(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ppo_trains_policy_and_critic_every_step(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    cfg = build_config("ppo", None, toy(tiny_model_dir))
    summary = run_training(cfg, tmp_path / "run")
    records = _records(tmp_path / "run")
    for record in records[1:]:
        for key in (*CRITIC_METRICS, "loss/policy", "system/policy_update_s"):
            assert key in record, key
        assert record["critic/pretraining"] == 0
    assert records[-1]["budget/learner_steps"] == 2 and records[-1]["budget/critic_steps"] == 2
    assert summary["critic_steps"] == 2
    share = summary["compute_share"]  # PPO: critic, no KL (so no reference)
    assert share["actor"] > 0 and share["critic"] > 0 and share["reference"] == 0
    _check_compute_share(tmp_path / "run", records)
    assert (
        summary["critic_explained_variance_before_policy"]
        == records[1]["critic/explained_variance"]
    )
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    critic = AutoModelForTokenClassification.from_pretrained(ckpt / "critic")  # plain transformers
    assert critic.config.num_labels == 1
    assert json.loads((tmp_path / "run" / "ledger.json").read_text())["critic_steps"] == 2


def test_vapo_pretrains_the_critic_before_any_policy_update(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    # Two value pre-training steps (Monte-Carlo targets, no policy step), then PPO steps.
    cfg = build_config("vapo", None, [*toy(tiny_model_dir, steps=3), "critic.warmup_steps=2"])
    summary = run_training(cfg, tmp_path / "run")
    records = _records(tmp_path / "run")
    pretraining, policy = records[1:3], records[3:]
    for record in pretraining:
        assert record["critic/pretraining"] == 1
        assert "loss/policy" not in record and "critic/value_loss" in record
    assert [r["budget/learner_steps"] for r in records] == [0, 0, 0, 1]
    assert [r["budget/critic_steps"] for r in records] == [0, 1, 2, 3]
    assert policy[0]["critic/pretraining"] == 0 and "loss/policy" in policy[0]
    assert "critic/explained_variance" in pretraining[-1]
    assert summary["critic_explained_variance_before_policy"] == pretraining[-1].get(
        "critic/explained_variance"
    )
    assert (tmp_path / "run" / "plots" / "critic.png").exists()


def test_run_directory_and_plain_transformers_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    cfg = build_config("grpo", None, toy(tiny_model_dir, steps=3))
    run_training(cfg, tmp_path / "run")
    run = tmp_path / "run"
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    for key in (
        "reward/mean",
        "eval/pass@1",
        "eval/pass@k",
        "length/mean",
        "entropy",
        "ratio/d/max_abs_log",
        "ratio/rho/p99_abs_log",
        "ratio/kappa/mean_abs_log",
        "group/all_correct_frac",
        "group/all_wrong_frac",
        "system/tokens_per_s",
        "budget/generated_tokens",
        "kl/mean",
    ):
        assert key in record, key
    assert {p.name for p in (run / "plots").glob("*.png")} >= {"reward.png", "heldout.png"}
    ckpt = run / "checkpoints" / "step_3"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    # Plain transformers encodes a prompt exactly as training did: <bos> first (before, the
    # saved tokenizer did not add it and a trained checkpoint answered "4" to "12+34=").
    trained_on = AutoTokenizer.from_pretrained(tiny_model_dir)  # what the run's envs encode with
    for example in load_data(cfg)[0][:8]:
        expected = encode_prompt(trained_on, example.prompt)
        assert tokenizer(example.prompt)["input_ids"] == expected
        assert expected[0] == tokenizer.bos_token_id
    ids = tokenizer("1+2=", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    engine = HFEngine(
        model, pad_token_id=int(tokenizer.pad_token_id), eos_token_id=int(tokenizer.eos_token_id)
    )
    ours = engine.generate([ids[0].tolist()], n=1, max_new_tokens=3, temperature=0, top_p=1.0)
    assert out[0, ids.shape[1] :].tolist()[: len(ours[0][0].response_ids)] == list(
        ours[0][0].response_ids
    )  # the same greedy answer as rlmap's own engine gives on the same ids


def test_bad_input_is_one_line_and_damages_nothing(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], toy: Toy
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("precious")
    assert main(["train", "--out", str(run), *toy(tiny_model_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err
    assert (run / "keep.txt").read_text() == "precious"
    assert main(["train", "--recipe", "grpoo"]) == 2
    assert "unknown recipe 'grpoo'" in capsys.readouterr().err
    assert main(["train", "optim.lr=fast"]) == 2
    assert capsys.readouterr().err.startswith("rlmap: error: optim.lr:")
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    out = tmp_path / "run2"
    assert main(["train", "--out", str(out), f"data.task={data}", *toy(tiny_model_dir)]) == 2
    assert f"{data}:2:" in capsys.readouterr().err


def test_tensorboard_without_the_package_is_a_clear_error(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    # refused as the config is built, before a run directory exists
    with pytest.raises(
        ConfigError,
        match=r"^run\.tensorboard: tensorboard needs the "
        r"tensorboard package \(pip install 'rlmap\[tensorboard\]'\)$",
    ):
        build_config("grpo", None, [*toy(tiny_model_dir), "run.tensorboard=true"])


def test_eval_command_prints_the_held_out_figures(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], toy: Toy
) -> None:
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *toy(tiny_model_dir)]) == 0
    assert "learner compute: actor " in capsys.readouterr().out
    assert main(["eval", str(run / "checkpoints" / "step_2"), "--samples", "3"]) == 0
    out = capsys.readouterr().out
    for key in ("eval/pass@1", "eval/pass@k", "eval/k", "eval/length", "eval/diversity"):
        assert key in out
    assert "3.0000" in out  # k = --samples
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a Hugging Face checkpoint" in capsys.readouterr().err


def test_bf16_rollout_engine_makes_the_mismatch_measurable(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    # fp32 learner, bf16 rollout: κ = π_old/μ_old is no longer 1, and the κ tails show it.
    cfg = build_config("grpo", None, [*toy(tiny_model_dir), "system.rollout_dtype=bfloat16"])
    run_training(cfg, tmp_path / "run")
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])
    assert record["ratio/kappa/max_abs_log"] > 1e-4  # fp32 rollout: ~1e-7 (float32 noise)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        (["system.backend=ray"], "system.backend:"),
        (["system.partial_rollout=true"], "system.partial_rollout:"),
        (["system.deterministic=true"], "system.deterministic:"),  # the sync loop repeats anyway
        (
            ["system.mode=async", "system.deterministic=true", "system.partial_rollout=true"],
            "system.deterministic:",
        ),
        (
            ["system.mode=async", "system.publish_every=3", "behaviour.max_staleness=1"],
            "system.publish_every:",
        ),  # before each publication all would be stale: no step ends
        (["system.engine_sleep=2"], "system.engine_sleep:"),  # only vLLM sleeps
        (
            [
                "system.engine=vllm",
                "model.path=embedded:tiny-moe",
                "behaviour.routing_replay=true",
                "behaviour.corrections=[tis]",
            ],
            "behaviour.routing_replay:",
        ),
        (["system.engine=vllm", "system.engine_memory=0"], "system.engine_memory:"),
        (["system.engine_memory=0.3"], "system.engine_memory:"),  # the HF engine takes none
        (["system.engine=vllm", "generation.temperature=0.005"], "generation.temperature:"),
        (["system.engine=vllm", "generation.temperature=2.5"], "generation.temperature:"),
    ],
)
def test_system_parts_not_built_yet_are_refused_not_ignored(
    override: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--recipe", "grpo", *override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlmap: error: {field}"), err


def _per_turn(batch: Any, advantages: Any) -> list[list[list[float]]]:
    """Each row's advantages on its action tokens, one list per assistant turn."""
    out = []
    for b in range(batch.tokens.shape[0]):
        action, turns = batch.action_mask[b], batch.turns[b]
        ids = sorted(set(turns[action].tolist()))
        out.append([advantages[b][action & (turns == k)].tolist() for k in ids])
    return out


@pytest.mark.parametrize(
    ("recipe", "extra"),
    [
        ("grpo", []),  # a group estimator: the episode is the unit
        ("ppo", ["credit.time_unit=turn"]),  # critic + GAE over turns
        ("ppo", ["credit.time_unit=token"]),  # critic + GAE over action tokens (obs skipped)
    ],
)
def test_the_calculator_tool_task_trains_and_records_tool_use(
    recipe: str,
    extra: list[str],
    tiny_calc_model_dir: Path,
    tmp_path: Path,
    toy: Toy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.system import learner_step

    seen: list[tuple[Any, Any]] = []  # (batch, advantages) of each policy update
    real = learner_step.update_policy

    def spy(
        policy: Any, optimizer: Any, scheduler: Any, batch: Any, adv: Any, *rest: Any, **kw: Any
    ) -> Any:
        seen.append((batch, adv.detach().clone()))
        return real(policy, optimizer, scheduler, batch, adv, *rest, **kw)

    monkeypatch.setattr(learner_step, "update_policy", spy)
    overrides = [
        *toy(tiny_calc_model_dir),
        "data.task=calculator",
        "data.max_turns=2",
        "generation.max_new_tokens=6",
        *extra,
    ]
    summary = run_training(build_config(recipe, None, overrides), tmp_path / "run")
    records = _records(tmp_path / "run")
    for key in ("env/turns", "env/tool_call_rate", "env/tool_error_frac", "env/turn_budget_frac"):
        assert all(key in r for r in records[1:]), key
    assert all("eval/tool_call_rate" in r and "eval/turns" in r for r in (records[0], records[-1]))
    assert summary["after"]["eval/pass@1"] == records[-1]["eval/pass@1"]
    assert all("loss/policy" in r for r in records[1:]) and len(seen) == 2  # a step, an update
    assert (tmp_path / "run" / "plots" / "tools.png").exists()
    rows = [row for batch, adv in seen for row in _per_turn(batch, adv)]
    for record, (batch, adv) in zip(records[1:], seen, strict=True):
        # env/turns, the mean number of assistant turns an episode took, counted again
        # from the batch's turn ids (every episode of the step trains: nothing filtered)
        assert record["sampling/kept_frac"] == 1.0
        step_rows = _per_turn(batch, adv)
        assert record["env/turns"] == pytest.approx(sum(map(len, step_rows)) / len(step_rows))
    assert any(len(row) == 2 for row in rows)  # the tool was called: a second turn followed
    distinct = [[len(set(turn)) for turn in row] for row in rows]  # values within each turn
    if recipe == "grpo":  # the outcome's advantage on every action token, across turns
        assert all(len({x for turn in row for x in turn}) == 1 for row in rows)
    elif "credit.time_unit=turn" in extra:  # one GAE step per turn: one value per turn ...
        assert all(n == 1 for row in distinct for n in row)
        # ... and not one per episode: a two-turn row's turns get their own
        assert any(len(row) == 2 and row[0][0] != row[1][0] for row in rows)
    else:  # one GAE step per action token: values vary within a turn
        assert any(n > 1 for row in distinct for n in row)


def test_the_calculator_task_trains_a_chat_model_calling_the_tool_in_json(
    tmp_path: Path, toy: Toy
) -> None:
    # the scripted chat model (tests/chat_model.py), which answers any product with its
    # one call, <tool_call>{"name": "calculator", ...}</tool_call>, read back from disk
    from chat_model import chat_tokenizer, scripted_model

    model_dir = tmp_path / "chat-model"
    overrides = [
        *toy(model_dir),
        "data.task=calculator",
        "data.max_turns=2",
        "generation.max_new_tokens=40",
        "generation.temperature=0.2",
    ]
    cfg = build_config("ppo", None, overrides)
    scripted_model().save_pretrained(model_dir)
    chat_tokenizer().save_pretrained(model_dir)
    run_training(cfg, tmp_path / "run")
    records = _records(tmp_path / "run")
    assert records[0]["eval/tool_call_rate"] > 0  # before any update
    assert sum(r["env/tool_calls"] for r in records[1:]) > 0
    assert "loss/policy" in records[-1] and "critic/value_loss" in records[-1]


def test_the_calculator_task_refuses_a_tokenizer_without_the_markers(
    tiny_model_dir: Path, toy: Toy
) -> None:
    cfg = build_config("grpo", None, [*toy(tiny_model_dir), "data.task=calculator"])
    with pytest.raises(ConfigError, match=r"data\.task: calculator needs '<calc>'"):
        check_inputs(cfg)


def _reward_model_dir(model_dir: Path, out: Path) -> Path:
    """A (randomly initialised) reward model on the tiny model's trunk, saved."""
    from rlmap.learned.reward_model import new_reward_model, save_reward_model

    save_reward_model(
        out, new_reward_model(model_dir), AutoTokenizer.from_pretrained(model_dir), {"test": True}
    )
    return out


def test_classic_rlhf_trains_on_a_learned_reward_with_the_kl_in_the_reward(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    rm = _reward_model_dir(tiny_model_dir, tmp_path / "rm")
    cfg = build_config("classic-rlhf", None, [*toy(tiny_model_dir), f"model.reward_path={rm}"])
    check_inputs(cfg)
    run_training(cfg, tmp_path / "run")
    records = _records(tmp_path / "run")[1:]
    for key in ("reward/verifier_mean", "kl/mean", "critic/value_loss", "loss/policy"):
        assert all(key in r for r in records), key
    # the learned reward is what trains: a real-valued score, not the verifier's 0/1
    assert any(r["reward/mean"] not in (0.0, 1.0) for r in records)


def test_comparisons_by_the_learned_reward_model_train(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    rm = _reward_model_dir(tiny_model_dir, tmp_path / "rm")
    cfg = build_config(
        "grpo",
        None,
        [
            *toy(tiny_model_dir),
            f"model.reward_path={rm}",
            "feedback.source=comparison",
            "feedback.comparison_model=reward_model",
        ],
    )
    check_inputs(cfg)
    run_training(cfg, tmp_path / "run")
    records = _records(tmp_path / "run")[1:]
    for r in records:  # 2 groups of 4: all 6 pairs each; win rates average ½ per group
        assert r["judge/pairs"] == 12 and r["judge/calls"] == 0 and "reward/verifier_mean" in r
        assert r["reward/mean"] == pytest.approx(0.5) and r["sampling/rejected"] == 0
    with pytest.raises(ConfigError, match=r"^feedback\.judge_url: only an AI judge uses it"):
        build_config(
            "grpo",
            None,
            [
                *toy(tiny_model_dir),
                f"model.reward_path={rm}",
                "feedback.source=comparison",
                "feedback.judge_url=http://x/v1",
                "feedback.comparison_model=reward_model",
            ],
        )


def test_a_learned_reward_needs_a_model_with_the_policys_tokenizer(
    tiny_model_dir: Path, tiny_calc_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    other = _reward_model_dir(tiny_calc_model_dir, tmp_path / "rm")  # vocabulary + markers
    cfg = build_config("classic-rlhf", None, [*toy(tiny_model_dir), f"model.reward_path={other}"])
    with pytest.raises(ConfigError, match=r"^model\.reward_path: .* different tokenizer"):
        build(cfg, tiny_model_dir, reward_path=other)
    nowhere = f"model.reward_path={tmp_path / 'none'}"
    missing = build_config("classic-rlhf", None, [*toy(tiny_model_dir), nowhere])
    with pytest.raises(ConfigError, match=r"^model\.reward_path: .* not a local"):
        check_inputs(missing)
    real = build_config("classic-rlhf", None, toy(tiny_model_dir))  # a real model, no RM given
    with pytest.raises(ConfigError, match=r"^model\.reward_path: .*needs a trained reward"):
        check_inputs(real)


def test_barrier_idle_by_hand() -> None:
    from rlmap.system.sync import barrier_idle

    # lengths 2, 4, 6: mean 4, max 6 -> 1 − 4/6 = 1/3 of the slots wait for the longest
    assert barrier_idle([2, 4, 6]) == pytest.approx(1 / 3)
    assert barrier_idle([5, 5]) == 0.0 and barrier_idle([]) == 0.0


def test_an_engine_cache_is_forgotten_after_every_step_and_every_evaluation(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a resumed run's engine starts empty (vLLM's prefix cache), a straight run's must
    be emptied too, or the two runs sample from different cache states."""
    from rlmap.engines import engine
    from rlmap.experiments import train_step
    from rlmap.system import sync

    calls: list[str] = []
    monkeypatch.setattr(sync, "forget_cache", lambda e: calls.append("step"))
    monkeypatch.setattr(train_step, "forget_cache", lambda e: calls.append("evaluation"))
    run_training(build_config("grpo", None, toy(tiny_model_dir, steps=2)), tmp_path / "run")
    # the start's evaluation, then each step followed by its evaluation (run.eval_every=1)
    assert calls == ["evaluation", "step", "evaluation", "step", "evaluation"]

    class Cached:
        cleared = 0

        def clear_cache(self) -> None:
            self.cleared += 1

    cached = Cached()
    engine.forget_cache(cached)  # type: ignore[arg-type]
    assert cached.cleared == 1
    engine.forget_cache(object())  # type: ignore[arg-type]  # no cache: nothing to do


def test_publishing_every_eta_plus_one_steps_is_allowed() -> None:
    # P − 1 ≤ η: the newest trajectories before a publication are P − 1 versions old
    cfg = build_config("sao", None, ["system.publish_every=2", "behaviour.max_staleness=1"])
    assert cfg.system.publish_every == 2
