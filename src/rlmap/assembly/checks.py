"""The checks a run makes before any work: what rlmap cannot run, bad data, an unreachable
judge, a missing or damaged model, a model that cannot serve the task, prompts too long."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoConfig, PreTrainedTokenizerBase

from rlmap.assembly.available import refuse_unavailable
from rlmap.assembly.data import check_prompt_lengths, labelled_prompts, load_data, task_tools
from rlmap.assembly.embedded import EMBEDDED_MODELS, embedded_tokenizer, warm_start_spec
from rlmap.assembly.models import (
    architecture,
    check_model_dir,
    learner_device,
    load_tokenizer,
    model_path,
    reward_model_path,
)
from rlmap.core.hf import context_length
from rlmap.feedback import judge, judge_client, judge_text
from rlmap.models import lora
from rlmap.recipes.config import RecipeConfig
from rlmap.tasks.registry import kind_of


def check_inputs(cfg: RecipeConfig) -> None:
    """Fail on what rlmap cannot run yet, bad data files, a judge that does not answer or a
    bad judge template, a missing or damaged model, and on a prompt that does not fit the
    model's context, before any work.

    Everything here reads headers and text, never weights: it runs before the run
    directory is created, so bad input leaves nothing behind.
    """
    refuse_unavailable(cfg)
    learner_device(cfg)
    load_data(cfg)
    f = cfg.feedback
    if f.uses_judge and f.judge_url is not None:
        judge_client.probe(f.judge_url, api_key=judge.api_key(f))  # not against a dead judge
        judge_text.load_template(
            f.judge_template, "pointwise" if f.source == "judge" else "pairwise"
        )
    config: Any
    if cfg.model.path in EMBEDDED_MODELS:
        tokenizer: PreTrainedTokenizerBase = embedded_tokenizer(cfg)
        config = warm_start_spec(cfg).model
        context: int | None = config.max_position_embeddings
        source = "the embedded model"
    else:
        path = model_path(cfg)
        tokenizer = load_tokenizer(path)
        config = AutoConfig.from_pretrained(path)
        context = context_length(config)
        source = f"model.path={path}"
    if cfg.system.engine == "vllm":
        from rlmap.engines.vllm_settings import check_model

        check_model(config, source)
    kind_of(cfg.data.task).check_model(cfg.data, cfg.generation.max_new_tokens, tokenizer, context)
    if context is not None:
        tools = task_tools(cfg, tokenizer)
        check_prompt_lengths(labelled_prompts(cfg), tokenizer, context, source, tools)
    if cfg.feedback.uses_reward_model and (
        cfg.model.reward_path is not None or cfg.model.path not in EMBEDDED_MODELS
    ):
        reward_model_path(cfg)  # a given path must exist; a real model must have one
    critic = cfg.model.critic_path
    if cfg.critic.enabled and critic is not None:
        check_model_dir(Path(critic), "model.critic_path")
    if cfg.model.lora_rank:  # peft would refuse a norm or a container only once weights load
        skeleton = architecture(cfg)
        lora.check_targets(skeleton, cfg.model.lora_modules)
