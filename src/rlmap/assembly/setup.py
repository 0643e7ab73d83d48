"""Building a run's live objects from its config: model, engine, optimiser, data.

Everything here is start-up; the loops (:mod:`rlmap.system.sync`) only use what
:func:`build` returns.
"""

from __future__ import annotations

import json
import math
import random
import threading
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rlmap import feedback
from rlmap.assembly.available import refuse_unavailable
from rlmap.core.device import place, resolve, use_deterministic_kernels
from rlmap.core.errors import ConfigError, InputError, first_line
from rlmap.core.hf import context_length, loading_onto
from rlmap.embedded.tiny import TinySpec, build_tiny_model
from rlmap.embedded.tokenizer import restore_bos
from rlmap.embedded.warmstart import TOOL_DEMOS, WarmStartSpec, task_tokenizer, warm_start
from rlmap.engines.engine import RolloutEngine
from rlmap.engines.hf import HFEngine
from rlmap.feedback import judge, judge_client, judge_text
from rlmap.feedback.isolation import IsolatedVerifier, Verify
from rlmap.feedback.reward import Reward
from rlmap.learned.preferences import PreferenceSpec, embedded_reward_model
from rlmap.learned.reward_model import load_reward_model
from rlmap.learner.critic import CRITIC_DIR, CriticSettings, load_critic
from rlmap.learner.distributed import SINGLE, World, parallel, wrap
from rlmap.learner.memory import (
    MASTER_DTYPE,
    check_engine_room,
    checkpoint_activations,
    resident_bytes,
)
from rlmap.learner.policy import UpdateSettings
from rlmap.models import lora
from rlmap.models.routing import check_replayable
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.sections import DataConfig
from rlmap.rollout.scoring import EpisodeReturn, base_reward, shaping_reward
from rlmap.simulator.inputs import parse_duration
from rlmap.tasks import gym_text, reasoning_gym, tool_calls, verifiers_env
from rlmap.tasks.arithmetic import Example, make_splits
from rlmap.tasks.calculator import (
    TOOLS,
    CalculatorEnv,
    calls_in_json,
    marker_ids,
    prompt_tools,
    tool_call_text,
)
from rlmap.tasks.datafiles import load_file_examples, load_labelled_examples
from rlmap.tasks.env import AnswerEnv, EnvFactory, reference_for
from rlmap.tasks.prompts import Messages, PromptEncoder, ToolSchemas, encode_prompt
from rlmap.tasks.tool_calls import ToolEnv

EMBEDDED = "embedded:tiny"
EMBEDDED_CHAT = "embedded:tiny-chat"
EMBEDDED_MODELS = {EMBEDDED: TinySpec(), "embedded:tiny-moe": TinySpec(experts=4),
                   EMBEDDED_CHAT: TinySpec(max_position_embeddings=128)}  # fmt: skip
"""The built-in models: the dense default; a Qwen3-MoE of 4 experts, top-2, per layer (for
routing replay); a chat model — the dense one on a byte-level BPE tokenizer with the ChatML
template, whose tool calls are JSON in multi-token ``<tool_call>`` tags (128 positions: a
calculator episode takes ~60). All built from config and warm-started on first use, then
cached."""
BUILT_IN_TASKS = ("arithmetic", "calculator")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""``system.train_dtype`` / ``rollout_dtype`` by name. The learner's weights are float32
whatever ``train_dtype`` says: it is the autocast dtype of its forward passes
(:mod:`rlmap.learner.memory`)."""


@dataclass(frozen=True)
class Parts:
    """The live objects of a run (built once; their *state* is what checkpoints hold)."""

    cfg: RecipeConfig
    tokenizer: PreTrainedTokenizerBase
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    """π_ref: a frozen copy of the start model; with LoRA the policy itself, which the
    learner scores with its adapters off (:func:`rlmap.learner.policy.prepare_batch`)."""
    engine: RolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train: list[Example]
    heldout: list[Example]
    environment: EnvFactory
    """Makes the environment of one episode (:mod:`rlmap.tasks.env`) for a prompt."""
    settings: UpdateSettings
    critic: torch.nn.Module | None = None
    """The value model (its own Hugging Face model), None when ``critic.enabled`` is false."""
    critic_optimizer: torch.optim.Optimizer | None = None
    """The critic's own AdamW (``optim.critic_lr``); None without a critic."""
    critic_scheduler: Any = None
    """The critic's learning-rate schedule; None without a critic."""
    eval_environment: EnvFactory | None = None
    """Environments of the held-out evaluation (``feedback.eval_verifier``); None: as training."""
    eval_rescore: Verify | None = None
    """The training verifier, to rescore held-out samples when evaluation uses another one."""
    eval_rescore_items: bool = False
    """``eval_rescore`` reads the examples' item keys (a reasoning-gym verifier)."""
    reward_model: torch.nn.Module | None = None
    """The learned reward model scoring rollouts (``feedback.source=reward_model``)."""
    base_reward: Reward = field(default_factory=EpisodeReturn)
    """The base term of the reward (:func:`rlmap.rollout.scoring.base_reward`)."""
    shaping: Reward | None = None
    """The shaping terms added to it, or None (:func:`rlmap.rollout.scoring.shaping_reward`)."""
    world: World = SINGLE
    """This process's learner rank (:mod:`rlmap.learner.distributed`)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where the learner's models live (:func:`rlmap.core.device.resolve`); the batch
    record stays on the host and each micro-batch crosses to it."""
    learner: torch.nn.Module | None = None
    """The policy as the data-parallel learner trains it (DDP / FSDP2 around a
    :class:`~rlmap.learner.logprobs.Scorer`); None in one process: ``policy`` itself."""

    critic_learner: torch.nn.Module | None = None
    """The critic as the data-parallel learner trains it (DDP / FSDP2); None in one process."""
    levels: reasoning_gym.LevelPools | None = None
    """The training prompts of each curriculum level (``sampling.curriculum``); None: ``train``."""

    @property
    def trained(self) -> torch.nn.Module:
        """What the learner's passes run on: ``learner``, else ``policy``."""
        return self.policy if self.learner is None else self.learner

    @property
    def trained_critic(self) -> torch.nn.Module | None:
        """What the critic's passes run on: ``critic_learner``, else ``critic``."""
        return self.critic if self.critic_learner is None else self.critic_learner


def warm_start_spec(cfg: RecipeConfig) -> WarmStartSpec:
    """The warm start of the embedded default, on the run's own train split. On a
    reasoning-gym task the model's context is built to fit the task (:func:`fitted_context`)."""
    d = cfg.data
    model = EMBEDDED_MODELS.get(cfg.model.path, TinySpec())
    if reasoning_gym.is_reasoning_gym(d.task) or gym_text.is_gym(d.task):
        model = replace(model, max_position_embeddings=fitted_context(cfg))
    chat = cfg.model.path == EMBEDDED_CHAT
    if verifiers_env.is_verifiers(d.task):  # no demonstrations of its own: the calculator's
        calculator = replace(
            d,
            task="calculator",
            task_args=None,
            train_size=DataConfig.train_size,
            eval_size=DataConfig.eval_size,
        )
        own = warm_start_spec(cfg.model_copy(update={"data": calculator}))
        return replace(own, model=replace(own.model, max_position_embeddings=fitted_context(cfg)))
    schedule: dict[str, int] = {}
    if gym_text.is_gym(d.task):
        schedule = {"steps": 0, "blur_steps": 0}  # nothing to imitate: the initialisation
    elif reasoning_gym.is_reasoning_gym(d.task) and not chat:  # prose a character a token
        schedule = {"batch_size": REASONING_GYM_SFT_BATCH}
    return WarmStartSpec(**schedule,task=d.task, split_seed=d.split_seed, eval_size=d.eval_size,
                         train_size=d.train_size, max_digits=d.max_digits, ops=d.resolved_ops,
                         tool_demos=TOOL_DEMOS if d.task == "calculator" else 0.0,
                         task_args=json.dumps(d.task_args or {}, sort_keys=True),
                         model=model, chat=chat)  # fmt: skip


def embedded_tokenizer(cfg: RecipeConfig) -> PreTrainedTokenizerFast:
    """The tokenizer of the embedded model ``model.path`` names, on the run's task."""
    d = cfg.data
    args, split = json.dumps(d.task_args or {}, sort_keys=True), (d.split_seed, d.eval_size)
    chat = cfg.model.path == EMBEDDED_CHAT
    return task_tokenizer(d.task, chat=chat, task_args=args, split=split)


REASONING_GYM_SFT_BATCH = 32
"""The character-level model's warm-start batch on a reasoning-gym task (the chat model's is
the default 128). Its prompts are prose, a character a token, ~7 times an arithmetic
prompt's tokens, so a batch of 128 would take about 15 minutes here; 32 is affordable but
learns too little for RL to build on (docs/tasks.md: 0.08 held-out after 400 steps, where
128 reaches 0.57)."""

CONTEXT_BLOCK = 64
"""The embedded model's context is a multiple of this (so that a few characters more in a
task's prompts seldom changes the model, and with it the cached warm start)."""


def fitted_context(cfg: RecipeConfig) -> int:
    """Positions the embedded model needs for the task: its longest prompt (as the embedded
    tokenizer encodes it) plus the response budget (``generation.max_new_tokens``, at least
    32), rounded up to a multiple of ``CONTEXT_BLOCK``; the default 64 at least. A gym
    task's episode is its first prompt, then ``data.max_turns`` responses, each followed by
    an observation (taken as long as the first one, plus a line; the one after the last
    turn stays in the final state)."""
    chat = cfg.model.path == EMBEDDED_CHAT
    tokenizer = embedded_tokenizer(cfg)
    prompts = [prompt for _, prompt in labelled_prompts(cfg)]
    texts = [prompt if isinstance(prompt, str) else "" for prompt in prompts]
    longest = max(len(ids) for ids in tokenizer(texts)["input_ids"])
    if chat and not gym_text.is_gym(cfg.data.task):  # the template's turns around each prompt
        shown = task_tools(cfg, tokenizer)
        longest += len(encode_prompt(tokenizer, "", shown)) - len(tokenizer("")["input_ids"])
        chats = [len(encode_prompt(tokenizer, p, shown)) for p in prompts if not isinstance(p, str)]
        longest = max([longest, *chats])  # chat rows (a verifiers environment's) as they are
    per_turn = max(cfg.generation.max_new_tokens, 32)
    need = longest + per_turn
    if gym_text.is_gym(cfg.data.task):
        d = cfg.data
        _, first = gym_text.opening(gym_text.make(d.task, d.task_args), load_data(cfg)[0][0])
        observation = len(tokenizer(first, add_special_tokens=False)["input_ids"]) + 16
        need = longest + d.max_turns * (per_turn + observation)  # the last one is kept too
    least = EMBEDDED_MODELS.get(cfg.model.path, TinySpec()).max_position_embeddings
    return max(least, -(-need // CONTEXT_BLOCK) * CONTEXT_BLOCK)


def model_path(
    cfg: RecipeConfig, progress: Callable[[int, int, float], None] | None = None
) -> Path:
    """The checkpoint the policy starts from (the cached warm start for the embedded default).

    A given directory is checked first (:func:`check_model_dir`): a damaged one is a
    one-line error naming its file, not a traceback from deep inside ``transformers``.
    """
    if cfg.model.path in EMBEDDED_MODELS:
        return warm_start(warm_start_spec(cfg), progress=progress)
    path = Path(cfg.model.path)
    check_model_dir(path, "model.path")
    return path


def reward_model_path(
    cfg: RecipeConfig, progress: Callable[[int, int, float], None] | None = None
) -> Path | None:
    """The reward model of a ``feedback.source=reward_model`` run, or of comparisons by it
    (``feedback.comparison_model=reward_model``); None for other sources.

    ``model.reward_path`` when given; on the embedded default without one, the cached
    model trained on the task's preference pairs (:mod:`rlmap.learned.preferences`).
    """
    if not cfg.feedback.uses_reward_model:
        return None
    if cfg.model.reward_path is not None:
        path = Path(cfg.model.reward_path)
        check_model_dir(path, "model.reward_path")
        return path
    if cfg.model.path not in EMBEDDED_MODELS or cfg.data.task not in BUILT_IN_TASKS:
        raise ConfigError(
            "model.reward_path: feedback.source=reward_model needs a trained reward model "
            "(rlmap reward-model train --pairs FILE.jsonl); only the embedded default has one"
        )
    return embedded_reward_model(warm_start_spec(cfg), PreferenceSpec(), progress=progress)


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
    if cfg.data.task == "calculator":
        check_calculator(cfg, tokenizer, context)
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


def architecture(cfg: RecipeConfig) -> torch.nn.Module:
    """The policy's modules on the meta device (shapes without storage: nothing allocated,
    no weight read), to check its structure before the run directory exists."""
    if cfg.model.path in EMBEDDED_MODELS:
        tokenizer, spec = embedded_tokenizer(cfg), warm_start_spec(cfg).model
        with torch.device("meta"):
            return build_tiny_model(tokenizer, spec, seed=0)
    path = model_path(cfg)
    try:
        with torch.device("meta"):
            model: torch.nn.Module = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(path))  # fmt: skip
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{path}: cannot load the model ({first_line(exc)})") from None
    return model


# --- model directories: checked cheaply, loaded with errors that name them ----------------

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""Single-file weights; sharded ones have ``<name>.index.json`` beside the shards."""


def check_model_dir(path: Path, field: str = "model.path", *, adapter: bool = False) -> None:
    """A Hugging Face model directory that ``from_pretrained`` will load, or a one-line error.

    ConfigError naming ``field`` when ``path`` is not a model directory at all (no
    ``config.json``); InputError naming the file when ``config.json`` does not parse or is
    not a model config, when there are no weights, or when a safetensors file's header
    does not cover the file (truncated). Reads ``config.json`` and headers only.
    A LoRA adapter directory (a LoRA run's checkpoint) passes with ``adapter`` (its
    :func:`check_adapter_dir`), and is a ConfigError naming ``field`` without.
    """
    config = path / "config.json"
    if not config.is_file() and (path / lora.ADAPTER_CONFIG).is_file():
        if adapter:
            return check_adapter_dir(path)
        raise ConfigError(f"{field}: {path} holds a LoRA adapter, not a whole model; give its "
                          "base model, or the merged model of a LoRA run (run.save_merged="
                          f"true writes it to {lora.MERGED_DIR}/)")  # fmt: skip
    if not config.is_file():
        raise ConfigError(f"{field}: {path} is not a local Hugging Face model directory")
    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"{config}: cannot read the model config ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{config}: not valid JSON (truncated?); {field} needs a whole "
                         "model directory") from None  # fmt: skip
    try:
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{config}: not a model config ({first_line(exc)})") from None
    for file in _weight_files(path):
        _check_weights(file)


def check_adapter_dir(path: Path) -> None:
    """InputError naming the file when a LoRA adapter directory's ``adapter_config.json`` is
    not a LoRA config or its ``adapter_model.safetensors`` is missing or damaged."""
    config, weights = path / lora.ADAPTER_CONFIG, path / lora.ADAPTER_WEIGHTS
    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"{config}: cannot read the adapter config ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{config}: not valid JSON (truncated?)") from None
    if not isinstance(data, dict) or data.get("peft_type") != "LORA":
        raise InputError(f"{config}: not a LoRA adapter config (no peft_type LORA)")
    if not weights.is_file():
        raise InputError(f"{weights}: missing (the adapter's weights)")
    _check_weights(weights)


def _weight_files(path: Path) -> list[Path]:
    """The weight files ``from_pretrained`` will read; InputError when there are none."""
    for name in WEIGHTS:
        if (path / name).is_file():
            return [path / name]
        index = path / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                raise InputError(f"{index}: not a weight index (truncated?)") from None
            missing = [shard for shard in shards if not (path / shard).is_file()]
            if missing:
                raise InputError(f"{path / missing[0]}: missing (listed in {index.name})")
            return [path / shard for shard in shards]
    raise InputError(f"{path}: no weights ({' or '.join(WEIGHTS)}, or a sharded index)")


def _check_weights(file: Path) -> None:
    """InputError naming ``file`` when its header or directory shows it is damaged."""
    if file.suffix == ".safetensors":
        try:
            with safe_open(str(file), "pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as exc:
            raise InputError(f"{file}: damaged weights ({first_line(exc)})") from None
        return
    with open(file, "rb") as f:
        zipped = f.read(2) == b"PK"  # torch.save's zip format; the legacy pickle is not checked
    if zipped and not zipfile.is_zipfile(file):  # a zip's directory is at its end
        raise InputError(f"{file}: damaged weights (truncated zip archive)")


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(path)``, or an InputError naming ``path``.

    A directory without tokenizer files does not fail in ``transformers``: it yields a
    tokenizer that encodes every text to nothing (and the run then failed much later,
    with "need at least one prompt"). That is refused here.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # tokenizers raises bare Exception for a damaged tokenizer.json
        raise InputError(f"{path}: cannot load the tokenizer ({first_line(exc)})") from None
    if len(tokenizer) < 2 or not tokenizer.encode("0 a", add_special_tokens=False):
        raise InputError(
            f"{path}: no tokenizer (no tokenizer.json, tokenizer.model or vocabulary files); "
            "save the tokenizer beside the weights"
        )
    return restore_bos(tokenizer)  # an embedded tokenizer from before it added <bos> itself


def load_causal_lm(
    path: Path, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path)`` on ``device`` (None: the CPU), or an
    InputError naming ``path``. On a GPU the weights load straight onto it (``device_map``),
    never through a whole host copy."""
    try:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, **loading_onto(device)
        )
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        raise InputError(f"{path}: cannot load the model ({first_line(exc)})") from None
    return model if device is None else place(model, device)


def labelled_prompts(cfg: RecipeConfig) -> list[tuple[str, str | Messages]]:
    """Every prompt the run will see (a text, or a chat row's messages), each labelled by
    where it comes from: ``file:line`` for a JSONL task (and ``data.eval_path``), ``file row
    N`` for another data file, ``data.task=<name> example <i>`` otherwise."""
    d = cfg.data
    if gym_text.is_gym(d.task):  # all episodes begin alike: the first one's text stands for all
        train, _ = load_data(cfg)
        env = gym_text.make(d.task, d.task_args)
        return [(f"data.task={d.task} episode {train[0].reference}",
                 gym_text.first_text(env, train[0]))]  # fmt: skip
    if verifiers_env.is_verifiers(d.task):
        train, heldout = load_data(cfg)
        return [(f"data.task={d.task} {e.reference}", e.chat) for e in [*train, *heldout]]
    if d.task in BUILT_IN_TASKS or reasoning_gym.is_reasoning_gym(d.task):
        train, heldout = load_data(cfg)
        out: list[tuple[str, str | Messages]] = [
            (f"data.task={d.task} example {i}", e.prompt) for i, e in enumerate([*train, *heldout])
        ]
        levels = curriculum_levels(cfg)  # the curriculum's lower levels: their own prompts
        for level in range(levels.top if levels is not None else 0):
            assert levels is not None
            out += [(f"data.task={d.task} level {level} example {i}", e.prompt)
                    for i, e in enumerate(levels.pool(level))]  # fmt: skip
        return out
    sources = [d.task, *([d.eval_path] if d.eval_path is not None else [])]  # files or hf:
    return [(label, e.chat) for f in sources for label, e in
            load_labelled_examples(f, d.prompt_field, d.answer_field, d.answer_format)]  # fmt: skip


def check_prompt_lengths(
    prompts: list[tuple[str, str | Messages]],
    tokenizer: PreTrainedTokenizerBase,
    context: int,
    source: str = "the model",
    tools: ToolSchemas = (),
) -> None:
    """InputError naming the first prompt whose tokens (as :func:`encode_prompt` makes
    them, ``tools`` shown) leave no room for a response in ``context`` positions.

    The whole list is tokenised in one batch without the chat template, plus the
    template's own tokens; only prompts near the limit, and chat messages, are encoded
    exactly, one by one.
    """
    if not prompts:
        return
    try:
        overhead = len(encode_prompt(tokenizer, "", tools))
    except Exception as exc:  # the template refuses a prompt at all, or the tools
        raise InputError(f"{source}: its chat template refuses a prompt "
                         f"({first_line(exc)})") from None  # fmt: skip
    texts = [text if isinstance(text, str) else "" for _, text in prompts]
    raw = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for (label, text), ids in zip(prompts, raw, strict=True):
        near = len(ids) + overhead >= context - 8  # 8: slack for merges at the template's seams
        if isinstance(text, str) and not near:
            continue
        try:
            n = len(encode_prompt(tokenizer, text, tools))
        except Exception as exc:  # the chat template refuses the row (a role it does not know)
            raise InputError(f"{label}: the tokenizer's chat template refuses this prompt "
                             f"({first_line(exc)})") from None  # fmt: skip
        if n >= context:
            raise InputError(
                f"{label}: prompt of {n} tokens leaves no room for a response in the "
                f"{context}-position context of {source}"
            )


def learner_device(cfg: RecipeConfig) -> torch.device:
    """``system.device`` resolved (:func:`rlmap.core.device.resolve`), or a one-line
    ConfigError for what this machine lacks or rlmap cannot run there yet. On CUDA the
    float32 matmul precision is pinned to full float32 (no TF32), so a float32 run's κ and
    exactness checks mean on a GPU what they mean on a CPU."""
    device = resolve(cfg.system.device)
    if device.type != "cuda":
        return device
    torch.set_float32_matmul_precision("highest")
    if cfg.system.deterministic_kernels:
        use_deterministic_kernels(device)
    return device


def make_engine(
    cfg: RecipeConfig,
    model_dir: Path,
    policy: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    own_copy: bool = False,
    world: World = SINGLE,
    learner: Sequence[torch.nn.Module | None] = (),
    trains: bool = True,
) -> RolloutEngine:
    """The run's rollout engine (``system.engine``) holding ``policy``'s weights.

    vLLM builds the architecture of ``model_dir`` and takes the weights from ``policy``. In
    the asynchronous loop it is shared by the learner and every in-process worker, each
    through its own :class:`rlmap.engines.vllm.PinnedView` (its own weight version).
    On the policy's GPU it is built only once its share is known to fit beside the
    ``learner``'s models (:func:`check_gpu_room`), with sleep mode at ``system.engine_sleep``'s
    level (:func:`rlmap.engines.vllm_settings.sleep_level`); with several learner ranks each
    rank builds its own, which joins the ranks' world.
    """
    s = cfg.system
    if s.engine == "vllm":
        from rlmap.engines.vllm import PinnedView, VLLMEngine
        from rlmap.engines.vllm_settings import sleep_level

        device = next(policy.parameters()).device
        check_gpu_room(cfg, device, [m for m in learner if m is not None], world, trains=trains)
        sleep = sleep_level(s.engine_sleep, engine=s.engine, mode=s.mode, device=device)
        engine = VLLMEngine(model_dir, policy, eos_token_id=int(tokenizer.eos_token_id),
                            dtype=DTYPES[s.rollout_dtype], memory=s.engine_memory,
                            sampling_masks=cfg.behaviour.replay_sampling_set, sleep=sleep,
                            rank=world.rank if world.parallel else None)  # fmt: skip
        return PinnedView(engine, 0, policy) if s.mode == "async" else engine
    return HFEngine(policy, pad_token_id=int(tokenizer.pad_token_id),
                    eos_token_id=int(tokenizer.eos_token_id), dtype=DTYPES[s.rollout_dtype],
                    own_copy=own_copy)  # fmt: skip


def check_gpu_room(
    cfg: RecipeConfig,
    device: torch.device,
    learner: Sequence[torch.nn.Module],
    world: World,
    *,
    trains: bool = True,
) -> None:
    """Before vLLM is built on the learner's GPU (``device``): its share and the ``learner``'s
    models, with their gradients and AdamW state (FSDP2: this rank's shard), must fit in what
    the GPU had free before the learner came — free now, plus what this process's PyTorch
    cache holds, the models placed so far (:func:`rlmap.learner.memory.check_engine_room`). A
    learner elsewhere shares nothing with vLLM, which checks its own share."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device)
    shards = world.size if world.parallel and world.sharding == "fsdp2" else 1
    resident = resident_bytes(learner, shards, trains=trains)
    check_engine_room(resident, cfg.system.engine_memory, free, total)


def load_data(cfg: RecipeConfig) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples: the built-in task's split, or JSONL files."""
    d = cfg.data
    if d.task in BUILT_IN_TASKS:
        return make_splits(d.split_seed, d.train_size, d.eval_size, max_digits=d.max_digits,
                           ops=d.resolved_ops)  # fmt: skip
    if reasoning_gym.is_reasoning_gym(d.task):
        return reasoning_gym.make_splits(d.task, d.task_args, d.split_seed, d.train_size,
                                         d.eval_size)  # fmt: skip
    if gym_text.is_gym(d.task):
        return gym_text.splits(d.task, d.split_seed, d.train_size, d.eval_size)
    if verifiers_env.is_verifiers(d.task):
        return verifiers_env.splits(d.task, d.task_args, d.train_size, d.eval_size)
    fields = (d.prompt_field, d.answer_field, d.answer_format)
    train = load_file_examples(d.task, *fields)  # a data file or an hf: dataset's split
    if d.eval_path is not None:
        return train, load_file_examples(d.eval_path, *fields)
    if len(train) <= d.eval_size:
        raise ConfigError(f"data.eval_size: {d.eval_size} held out leaves no training prompts")
    return train[d.eval_size :], train[: d.eval_size]


def make_verifier(cfg: RecipeConfig, name: str) -> Verify:
    """The named verifier, in its own process when ``feedback.timeout_s`` is set or the
    verifier is always isolated (then with ``ISOLATION_TIMEOUT_S`` by default)."""
    entry = feedback.registry.get(name)
    timeout = cfg.feedback.timeout_s
    if timeout is None and entry.isolated:
        timeout = feedback.ISOLATION_TIMEOUT_S
    return entry.fn if timeout is None else IsolatedVerifier(entry.fn, timeout)


def environment_factory(
    cfg: RecipeConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    verifier: str | None = None,
    latency: bool = False,
) -> EnvFactory:
    """The task's environment maker: the calculator tool task, or one answer per prompt.

    ``verifier`` names the verifier (default ``feedback.verifier``; evaluation passes
    ``feedback.eval_verifier``). Raises ConfigError when the tokenizer cannot serve the
    task (checked once, here).
    """
    name = verifier or cfg.feedback.verifier
    verify, entry = make_verifier(cfg, name), feedback.registry.get(name)
    # in its own process when isolated (feedback.timeout_s): a call then waits on it
    waits = entry.waits or entry.isolated or cfg.feedback.timeout_s is not None
    encode = PromptEncoder(tokenizer)  # shared: the G episodes of a prompt encode it once
    if gym_text.is_gym(cfg.data.task):  # the environment's own reward: no verifier
        return gym_text.factory(tokenizer, cfg.data.task, cfg.data.task_args, cfg.data.max_turns)
    if verifiers_env.is_verifiers(cfg.data.task):  # its rubric's reward, its stop conditions
        return verifiers_env.factory(
            tokenizer, cfg.data.task, cfg.data.task_args, cfg.data.max_turns
        )
    if cfg.data.task == "calculator":
        turns, wait = cfg.data.max_turns, latency_source(cfg) if latency else None
        if calls_in_json(tokenizer):  # the chat model's own tool-call format
            encode = PromptEncoder(tokenizer, tools=prompt_tools(tokenizer))
            return lambda e: ToolEnv(tokenizer, e, verify, TOOLS, max_turns=turns, latency=wait,
                                     encode=encode, verify_waits=waits)  # fmt: skip
        marker_ids(tokenizer)
        return lambda e: CalculatorEnv(tokenizer, e, verify, max_turns=turns, latency=wait,
                                       encode=encode, verify_waits=waits)  # fmt: skip
    if entry.items:  # the environment checks against the item's key, not the answer text
        return lambda e: AnswerEnv(tokenizer, replace(e, answer=reference_for(e, True)), verify,
                                   encode=encode, verify_waits=waits)  # fmt: skip
    return lambda e: AnswerEnv(tokenizer, e, verify, encode=encode, verify_waits=waits)


def task_tools(cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase) -> ToolSchemas:
    """The tool schemas the task's prompts show the model (the calculator's on a chat model,
    a verifiers environment's own)."""
    if verifiers_env.is_verifiers(cfg.data.task):
        return verifiers_env.environment_tools(cfg.data.task, cfg.data.task_args)
    return prompt_tools(tokenizer) if cfg.data.task == "calculator" else ()


def check_calculator(
    cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase, context: int | None = None
) -> None:
    """ConfigError unless the model can serve the calculator task: the markers as single
    tokens, or a chat template that renders a tool message, a turn budget
    (``generation.max_new_tokens``) that holds a whole call of the longest expression, and
    a ``context`` (when known) that holds an episode of ``data.max_turns`` turns — calls,
    then a last turn of the whole budget."""
    if not calls_in_json(tokenizer):
        marker_ids(tokenizer)
        return
    try:
        shown = tool_calls.observation_ids(tokenizer, "-" + "9" * (2 * cfg.data.max_digits))
    except Exception as exc:  # the template's own error (jinja raises what it likes)
        raise ConfigError(f"model.path: its chat template cannot show a tool message for the "
                          f"calculator task ({type(exc).__name__}: {exc})") from None  # fmt: skip
    digits = "9" * cfg.data.max_digits
    expression = f"{digits}{cfg.data.resolved_ops[-1]}{digits}"
    call = len(tokenizer.encode(tool_call_text(expression), add_special_tokens=False))
    g, turns = cfg.generation, cfg.data.max_turns
    if g.max_new_tokens < call + CALL_MARGIN:
        raise ConfigError(
            f"generation.max_new_tokens: {g.max_new_tokens} tokens cannot hold "
            f"a calculator call in the model's format ({call} tokens for "
            f"{tool_call_text(expression)!r}); give it at least {call + CALL_MARGIN}"
        )
    try:
        prompt = len(encode_prompt(tokenizer, f"{expression}=", prompt_tools(tokenizer)))
    except Exception as exc:  # a template that refuses tools= (jinja raises what it likes)
        raise ConfigError(f"model.path: its chat template cannot show the calculator tool "
                          f"({type(exc).__name__}: {exc})") from None  # fmt: skip
    episode = prompt + (turns - 1) * (call + len(shown)) + g.max_new_tokens
    if context is not None and episode > context:
        raise ConfigError(
            f"data.max_turns: {turns} turns of the calculator task take up to {episode} "
            f"positions ({turns - 1} calls of {call} tokens, their results, then a turn of "
            f"generation.max_new_tokens={g.max_new_tokens}); the model has {context}: "
            "fewer turns or a smaller budget"
        )


CALL_MARGIN = 2
"""Tokens beyond the encoded call that the turn budget must leave (another spelling of the
numbers may take more)."""


def evaluation_scoring(
    cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[EnvFactory, Verify | None, bool]:
    """(held-out environments, the training verifier to rescore them with — only when
    ``feedback.eval_verifier`` names another one —, whether that verifier reads item keys).
    Evaluation never waits on latency."""
    f = cfg.feedback
    other = f.eval_verifier is not None and f.eval_verifier != f.verifier
    environment = environment_factory(cfg, tokenizer, verifier=f.eval_verifier)
    rescore = make_verifier(cfg, f.verifier) if other else None
    return environment, rescore, feedback.registry.get(f.verifier).items


def latency_source(cfg: RecipeConfig) -> Callable[[], float] | None:
    """Draws of ``data.env_latency`` (seeded by the run's seed, shared by all environments
    of the run under a lock), or None."""
    spec = cfg.data.env_latency
    if spec is None:
        return None
    stream = parse_duration(spec, flag="data.env_latency").stream(random.Random(cfg.seed))
    lock = threading.Lock()

    def draw() -> float:
        with lock:
            return next(stream)

    return draw


def update_settings(cfg: RecipeConfig) -> UpdateSettings:
    return UpdateSettings(
        behaviour=cfg.behaviour,
        kl=cfg.kl,
        reduction=cfg.reduction,
        epochs=cfg.optim.epochs_per_batch,
        minibatches=cfg.optim.minibatches_per_epoch,
        micro_batch_size=cfg.optim.micro_batch_size,
        max_grad_norm=cfg.optim.max_grad_norm,
        temperature=cfg.generation.temperature,
        train_dtype=DTYPES[cfg.system.train_dtype],
    )


def critic_settings(cfg: RecipeConfig) -> CriticSettings:
    """The critic's update schedule: the policy's mini-batching, ``critic.*`` on top."""
    return CriticSettings(
        value_clip=cfg.critic.value_clip,
        updates=cfg.critic.updates_per_step,
        epochs=cfg.optim.epochs_per_batch,
        minibatches=cfg.optim.minibatches_per_epoch,
        micro_batch_size=cfg.optim.micro_batch_size,
        max_grad_norm=cfg.optim.max_grad_norm,
        train_dtype=DTYPES[cfg.system.train_dtype],
    )


def build_critic(
    cfg: RecipeConfig,
    start: Path,
    resume_from: Path | None,
    world: World = SINGLE,
    device: torch.device | None = None,
) -> tuple[torch.nn.Module | None, torch.optim.Optimizer | None, Any, torch.nn.Module | None]:
    """(critic, its optimiser, its scheduler, its data-parallel wrapper or None), or Nones
    when ``critic.enabled`` is false.

    The critic starts from ``model.critic_path`` or the policy's start checkpoint, and
    loads ``<resume_from>/critic`` on resume. With several learner ranks it is wrapped as
    the policy is (:func:`rlmap.learner.distributed.parallel`) and the optimiser holds the
    wrapper's parameters.
    """
    if not cfg.critic.enabled:
        return None, None, None, None
    path = start if cfg.model.critic_path is None else Path(cfg.model.critic_path)
    if resume_from is not None:
        path = resume_from / CRITIC_DIR
    critic: torch.nn.Module = load_critic(path, dtype=MASTER_DTYPE, seed=cfg.seed, device=device)
    if cfg.optim.gradient_checkpointing:
        checkpoint_activations(critic)
    per_batch = critic_settings(cfg).optimizer_steps
    wrapped = parallel(critic, world) if world.parallel else None
    optimizer, scheduler = make_optimizer(critic if wrapped is None else wrapped, cfg,
                                          lr=cfg.optim.critic_lr,
                                          steps_per_batch=per_batch)  # fmt: skip
    return critic, optimizer, scheduler, wrapped


def build(
    cfg: RecipeConfig,
    start: Path,
    resume_from: Path | None = None,
    reward_path: Path | None = None,
    world: World = SINGLE,
    *,
    trains: bool = True,
) -> Parts:
    """All live objects of a run that started from checkpoint ``start``.

    The policy (and critic) load ``resume_from`` when given (a checkpoint of this run);
    the reference policy is always ``start``, the weights the run began with. With LoRA
    the policy is ``start`` with adapters on top (``resume_from``'s on resume), and the
    reference is that same model with its adapters off. With several learner ranks the
    policy is wrapped for them (:func:`rlmap.learner.distributed.wrap`) and the optimiser
    holds the wrapped (FSDP2: sharded) parameters; the rollout engine shares the plain
    policy (DDP) or keeps its own full copy (FSDP2). ``trains`` False: a process that only
    rolls out (a Ray actor), whose policy keeps no gradients or optimiser state on its GPU.
    """
    refuse_unavailable(cfg)
    device = learner_device(cfg)
    tokenizer = load_tokenizer(start)
    m, reference = cfg.model, None
    # on the device before LoRA and the optimiser exist: adapters and AdamW state follow it
    policy = load_causal_lm(start if m.lora_rank else resume_from or start, dtype=MASTER_DTYPE,
                            device=device)  # fmt: skip
    if cfg.optim.gradient_checkpointing:
        checkpoint_activations(policy)
    if cfg.behaviour.routing_replay and (problem := check_replayable(policy)) is not None:
        raise ConfigError(f"behaviour.routing_replay: {problem}")
    if m.lora_rank:
        policy = lora.attach(policy, rank=m.lora_rank, alpha=m.resolved_lora_alpha,
                             targets=m.lora_modules, seed=cfg.seed,
                             adapter=resume_from)  # fmt: skip
        reference = policy if cfg.kl.placement != "none" else None  # the base: adapters off
    elif cfg.kl.placement != "none":
        reference = load_causal_lm(start, dtype=MASTER_DTYPE, device=device)
        reference.eval().requires_grad_(False)
    policy.train()
    # every model the learner keeps on its device, before the engine that must fit beside them
    critic, critic_optimizer, critic_scheduler, critic_learner = build_critic(
        cfg, start, resume_from, world, device)  # fmt: skip
    reward_model = _reward_model(cfg, tokenizer, reward_path, device)
    sharded = world.parallel and world.sharding == "fsdp2"
    engine = make_engine(cfg, start, policy, tokenizer, own_copy=sharded, world=world,
                         learner=(policy, reference, critic, reward_model),
                         trains=trains)  # fmt: skip
    learner = wrap(policy, world) if world.parallel else None
    optimizer, scheduler = make_optimizer(policy if learner is None else learner, cfg)
    train, heldout = load_data(cfg)
    eval_environment, eval_rescore, rescore_items = evaluation_scoring(cfg, tokenizer)
    return Parts(cfg, tokenizer, policy, reference, engine, optimizer, scheduler, train, heldout,
                 environment_factory(cfg, tokenizer, latency=True), update_settings(cfg),
                 critic, critic_optimizer, critic_scheduler,
                 eval_environment=eval_environment, eval_rescore=eval_rescore,
                 eval_rescore_items=rescore_items,
                 reward_model=reward_model, base_reward=base_reward(cfg),
                 shaping=shaping_reward(cfg),
                 world=world, learner=learner, critic_learner=critic_learner,
                 levels=curriculum_levels(cfg), device=device)  # fmt: skip


def curriculum_levels(cfg: RecipeConfig) -> reasoning_gym.LevelPools | None:
    """The training prompts of each level of ``sampling.curriculum``; None without one."""
    s, d = cfg.sampling, cfg.data
    if not s.curriculum:
        return None
    assert s.curriculum_top is not None  # set when the config was built
    name = reasoning_gym.parse(d.task, {})[0].name
    return reasoning_gym.LevelPools(d.task, name, json.dumps(d.task_args or {}, sort_keys=True),
                                    d.split_seed, d.train_size, d.eval_size,
                                    s.curriculum_top)  # fmt: skip


def _reward_model(
    cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase, path: Path | None,
    device: torch.device,
) -> torch.nn.Module | None:  # fmt: skip
    """The frozen reward model at ``path``; its tokenizer must be the policy's."""
    if path is None:
        if cfg.feedback.uses_reward_model:
            raise ConfigError(f"model.reward_path: no reward model for feedback.source="
                              f"{cfg.feedback.source}")  # fmt: skip
        return None
    if load_tokenizer(path).get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"model.reward_path: {path} has a different tokenizer from the policy's; the reward "
            "model must read the policy's tokens"
        )
    return load_reward_model(path, dtype=MASTER_DTYPE, device=device)


def make_optimizer(
    model: torch.nn.Module,
    cfg: RecipeConfig,
    *,
    lr: float | None = None,
    steps_per_batch: int | None = None,
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (``optim.adam_betas``) and a warm-up + constant/cosine/linear schedule over all
    optimiser steps of the run (:func:`lr_factor`).

    ``lr`` defaults to the policy's ``optim.lr`` and ``steps_per_batch`` (optimiser steps
    per rollout batch) to the policy's epochs × mini-batches; the critic passes its own.
    """
    o = cfg.optim
    lr = o.lr if lr is None else lr
    per_batch = o.epochs_per_batch * o.minibatches_per_epoch
    per_batch = per_batch if steps_per_batch is None else steps_per_batch
    trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    beta1, beta2 = o.adam_betas
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=o.weight_decay, betas=(beta1, beta2))
    total = max(1, o.steps * per_batch)

    def factor(step: int) -> float:
        return lr_factor(step, schedule=o.schedule, warmup_steps=o.warmup_steps, total=total)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total: int) -> float:
    """The learning rate's multiplier before optimiser step ``step`` (0-based) of ``total``.

    Warm-up W: (s + 1)/W for s < W. After it, with d = (s − W)/max(1, total − W) clipped to
    [0, 1]: constant 1; cosine ½(1 + cos πd); linear 1 − d, transformers'
    ``get_linear_schedule_with_warmup`` (TRL's default), which reaches 0 at s = total.
    Differs from transformers during warm-up only: it starts at s/W (0 at the first step).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    done = min(max((step - warmup_steps) / max(1, total - warmup_steps), 0.0), 1.0)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done))
    if schedule == "linear":
        return 1.0 - done
    return 1.0
