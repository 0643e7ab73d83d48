"""Combination checks of the data a run trains on: the task and its turns, the context
policy, curricula and rebalancing, LoRA adapters (:func:`rlmap.recipes.validate.validate`
runs them with the rest)."""

from __future__ import annotations

from collections.abc import Iterator

from rlmap import feedback
from rlmap.core.errors import ConfigError
from rlmap.models.lora import TARGET_NAME
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.sections import ModelConfig
from rlmap.simulator.inputs import parse_duration
from rlmap.tasks.registry import kind_of


def curriculum(cfg: RecipeConfig) -> Iterator[str]:
    s, d = cfg.sampling, cfg.data
    if not s.curriculum:
        return
    curriculum = kind_of(d.task).curriculum
    if curriculum is None:
        yield (
            f"sampling.curriculum: drives one reasoning-gym task's own curriculum, not {d.task!r}"
        )
        return
    yield from curriculum.check(d, s, cfg.system.mode)


def rebalance(cfg: RecipeConfig) -> Iterator[str]:
    s = cfg.sampling
    if not s.rebalance:
        return
    if s.group_size < 2:
        yield (
            f"sampling.rebalance: tells a uniform group (all correct or all wrong) from "
            f"a mixed one, which needs G >= 2, got sampling.group_size={s.group_size}"
        )
    if cfg.system.mode == "async":
        yield (
            "sampling.rebalance: it draws the prompts from what the learner has seen, "
            "which the asynchronous workers run ahead of; use system.mode=sync"
        )
    if s.rebalance_after < 1:
        yield f"sampling.rebalance_after: must be >= 1, got {s.rebalance_after}"
    if not 0 < s.rebalance_keep <= 1:
        yield f"sampling.rebalance_keep: must be in (0, 1], got {s.rebalance_keep}"
    if not 0 < s.rebalance_rare < 1:
        yield f"sampling.rebalance_rare: must be in (0, 1), got {s.rebalance_rare}"


def data(cfg: RecipeConfig) -> Iterator[str]:
    d = cfg.data
    kind = kind_of(d.task)
    yield from kind.check_settings(d, cfg.model.path)  # or a ConfigError naming the field
    if kind.own_reward and cfg.feedback.eval_verifier is not None:
        yield (
            f"feedback.eval_verifier: {d.task!r} is scored by its environment's own reward, "
            "held-out episodes too; no verifier applies"
        )
    built_in = not kind.data_files
    for name, value, default in (
        ("prompt_field", d.prompt_field, "prompt"),
        ("answer_field", d.answer_field, "answer"),
    ):
        if built_in and value != default:
            yield f"data.{name}: only data files have fields to name, not {d.task!r}"
    if built_in and d.answer_format != "plain":
        yield (
            f"data.answer_format: only data files and hf: datasets have solutions to read "
            f"answers from, not {d.task!r}"
        )
    if built_in and d.eval_path is not None:
        yield (
            f"data.eval_path: only a data-file task takes a held-out file; {d.task!r} holds "
            "out data.eval_size of its own prompts"
        )
    named = (
        ("feedback.verifier", cfg.feedback.verifier),
        ("feedback.eval_verifier", cfg.feedback.eval_verifier),
    )
    for name, verifier in named:
        if verifier is None or verifier not in feedback.registry:
            continue
        if feedback.registry.get(verifier).items and not kind.items:
            yield (
                f"{name}: {verifier} scores reasoning-gym items; it needs "
                "data.task=reasoning_gym:NAME"
            )
    if d.max_turns < 1:
        yield f"data.max_turns: must be >= 1, got {d.max_turns}"
    if d.max_digits < 1:
        yield f"data.max_digits: must be >= 1, got {d.max_digits}"
    if d.env_latency is not None:
        try:
            parse_duration(d.env_latency, flag="data.env_latency")
        except ConfigError as exc:
            yield str(exc)


def context_policy(cfg: RecipeConfig) -> Iterator[str]:
    """``data.context_policy`` (docs/formulas.md §2.5): segments need turns to drop, and
    what reads a whole episode at once must not see one longer than the model's context."""
    policy, tokens = cfg.data.context_policy, cfg.data.summary_tokens
    if policy == "compact" and tokens < 1:
        yield f"data.summary_tokens: a summary takes at least 1, got {tokens}"
    if policy != "compact" and tokens != type(cfg.data).summary_tokens:
        yield (
            f"data.summary_tokens: only data.context_policy=compact writes summaries; "
            f"under {policy} it would change nothing"
        )
    if policy == "fail":
        return
    if cfg.data.turn_budget < 2:
        yield (
            f"data.context_policy: {policy} drops earlier turns of multi-turn episodes, but "
            f"data.task {cfg.data.task!r} with data.max_turns={cfg.data.max_turns} has one "
            "turn per episode (use fail)"
        )
    if cfg.sampling.group_scope != "prompt":
        yield (
            f"sampling.group_scope: {cfg.sampling.group_scope} keys states on the whole "
            f"observation history, which data.context_policy={policy} cuts; use prompt"
        )
    if cfg.feedback.source == "reward_model":
        yield (
            "feedback.source: a reward model scores the whole episode's tokens, which "
            f"data.context_policy={policy} lets outgrow the model's context"
        )


def lora(cfg: RecipeConfig) -> Iterator[str]:
    m = cfg.model
    names = m.lora_modules
    if not names or any(not TARGET_NAME.fullmatch(name) for name in names):
        yield (
            f"model.lora_targets: needs one or more module names (a list, or a comma-"
            f"separated string such as q_proj,v_proj), got {m.lora_targets!r}"
        )
    if m.lora_rank == 0 and m.lora_alpha is not None:  # None: unset, 2·r once r > 0
        yield (
            f"model.lora_alpha: scales LoRA's update, and model.lora_rank=0 trains no "
            f"adapters (full fine-tuning); got lora_alpha={m.lora_alpha}"
        )
    if m.lora_rank == 0 and names != ModelConfig().lora_modules:
        yield (
            "model.lora_targets: names the layers that get adapters, and model.lora_rank=0 "
            f"trains none (full fine-tuning); got {m.lora_targets!r}"
        )
    if cfg.run.save_merged and m.lora_rank == 0:
        yield (
            "run.save_merged: needs model.lora_rank > 0 (a full fine-tuning checkpoint is "
            "already a plain model)"
        )
