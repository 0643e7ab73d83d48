"""Config sections that are not an axis: model, data, generation, optimiser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rlmap.tasks.answers import AnswerFormat
from rlmap.tasks.registry import kind_of


@dataclass(frozen=True)
class ModelConfig:
    """The policy (and, when a critic is on, the value model's backbone)."""

    path: str = "embedded:tiny"
    """A local directory of any Hugging Face causal LM, or ``embedded:tiny`` for the built-in
    character-level model (built and warm-started on first use, cached by content hash), or
    ``embedded:tiny-moe`` for its mixture-of-experts twin (Qwen3-MoE, 4 experts, top-2), or
    ``embedded:tiny-chat`` for a chat model (byte-level BPE, ChatML template; the calculator
    task's tool calls are JSON in ``<tool_call>`` tags, ~25 tokens: give it
    ``generation.max_new_tokens=32``)."""
    reward_path: str | None = None
    """A trained reward model (``feedback.source=reward_model``): a local Hugging Face
    sequence-classification directory, e.g. from ``rlmap reward-model train``. None on the
    embedded default trains one from the task's preference pairs first (cached)."""
    critic_path: str | None = None
    """Where the value critic starts: a local Hugging Face directory (a causal LM, whose trunk
    gets a new value head, or a saved critic); None starts from the policy's checkpoint."""
    lora_rank: int = 0
    """LoRA rank r of the policy's adapters (peft); 0 trains every weight (full fine-tuning).
    With r > 0 only the adapters train, the reference policy is the base with the adapters
    off (no second model), rollout engines sample from the merged weights W + (α/r)·BA and
    checkpoints hold the adapter (:mod:`rlmap.models.lora`). The critic, when on, still
    trains its own full model."""
    lora_alpha: float | None = None
    """LoRA scale numerator α (the update is (α/r)·BA); None is 2·``lora_rank``, a scale of 2
    whatever the rank."""
    lora_targets: tuple[str, ...] | str = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    """Module names (or dotted suffixes) that get adapters, as a list or one comma-separated
    string; the default is every attention and MLP projection of Llama/Qwen-style models."""

    @property
    def resolved_lora_alpha(self) -> float:
        """α actually used: ``lora_alpha``, or 2·``lora_rank`` when unset."""
        return 2.0 * self.lora_rank if self.lora_alpha is None else self.lora_alpha

    @property
    def lora_modules(self) -> tuple[str, ...]:
        """``lora_targets`` as a tuple of names (a comma string split, blanks stripped)."""
        if isinstance(self.lora_targets, str):
            return tuple(name.strip() for name in self.lora_targets.split(","))
        return tuple(self.lora_targets)


@dataclass(frozen=True)
class DataConfig:
    """Prompts and their reference answers."""

    task: str = "arithmetic"
    """``arithmetic`` (built in, one answer per prompt), ``calculator`` (built in, multi-turn:
    the model may call a calculator tool before answering; :mod:`rlmap.tasks.calculator`),
    ``reasoning_gym:NAME`` (one of reasoning-gym's procedural tasks, or a mixture
    ``NAME*W+NAME2``; :mod:`rlmap.tasks.reasoning_gym`; ``rlmap tasks`` lists them), or a
    ``gym:ENV_ID`` (a gymnasium environment, one action per turn; :mod:`rlmap.tasks.gym_text`),
    ``verifiers:ENV_ID`` or ``verifiers:MODULE:FACTORY`` (a verifiers environment, its
    rollout and rubric; :mod:`rlmap.tasks.verifiers_env`),
    or a data file — ``.jsonl``, ``.json`` or ``.parquet`` — of ``prompt``/``answer`` rows or
    chat-format ``messages`` rows (:mod:`rlmap.tasks.datafiles`; then ``eval_path`` may name
    the held-out file), or ``hf:PATH_OR_NAME[:CONFIG][@SPLIT]``, a Hugging Face ``datasets``
    dataset whose rows are read as a file's (:mod:`rlmap.tasks.hf_datasets`)."""
    prompt_field: str = "prompt"
    """Data files (and ``hf:`` datasets): the field that holds a row's prompt."""
    answer_field: str = "answer"
    """Data files (and ``hf:`` datasets): the field that holds a row's reference answer (a
    chat row's final assistant message takes its place)."""
    answer_format: AnswerFormat = "plain"
    """Data files (and ``hf:`` datasets): how the answer field stores the reference —
    ``plain`` (as it is), ``gsm8k`` (a solution ending ``#### 72``: the text after the last
    ``####``, commas dropped) or ``math`` (the content of the last ``\\boxed{...}``); the
    prompt is left as it is (:mod:`rlmap.tasks.answers`). ``gsm8k`` and ``math`` score with
    ``math_equiv`` unless ``feedback.verifier`` is given."""
    task_args: dict[str, Any] | None = None
    """reasoning-gym tasks: the generator's settings, e.g. ``{"min_terms": 2}``; for a
    mixture, keyed by task name. gym tasks: ``gymnasium.make``'s keyword arguments. None:
    the task's defaults."""
    eval_path: str | None = None
    """Held-out data file (or ``hf:`` dataset split) when ``task`` is one; None holds out
    ``eval_size`` of it."""
    train_size: int = 6000
    """Number of training prompts generated for a built-in task."""
    eval_size: int = 256
    """Number of held-out prompts (disjoint from training and from the warm start's data)."""
    split_seed: int = 0
    """Seed of the train/held-out split; shared by all runs so that their scores compare."""
    max_digits: int = 2
    """Arithmetic: operands have 1..max_digits digits."""
    ops: str | None = None
    """Built-in tasks: operators to draw from (any of ``+-*``); None is the task's default
    (``+`` for arithmetic, ``*`` for calculator, where the tool pays off)."""
    max_turns: int = 3
    """Multi-turn tasks (calculator, gym, verifiers): the turn budget — policy turns per
    episode; an episode that spends it without ending ends truncated (bootstrapped, not
    terminal). A verifiers environment's own ``max_turns`` must fit in it."""
    context_policy: Literal["fail", "truncate_oldest", "compact"] = "fail"
    """Multi-turn tasks: what happens when the next turn would not fit in the model's context
    (``engine.max_len``). ``fail``: the episode ends truncated. ``truncate_oldest``: it goes
    on in a new *segment*, a training row of its own whose context is the prompt plus the
    newest whole (turn + observation) pairs that fit — the environment not reset; credit
    crosses the boundary as a truncation with a final observation (docs/formulas.md §2.5,
    :mod:`rlmap.rollout.segments`). ``compact``: the policy writes the next segment's
    context — asked at the boundary for a summary (its turn starts with the task's lead,
    ``summary: ``), it goes on from the prompt, the summary and the newest observation; the
    summary's tokens are actions of the closing segment, trained with the credit of what
    follows."""
    summary_tokens: int = 16
    """``data.context_policy=compact``: the most tokens a summary may take (fewer when the
    context has less room left). Sized for the embedded chat model's 128 positions; a real
    model's summary wants hundreds."""

    env_latency: str | None = None
    """Calculator: seconds each environment step waits, as a distribution —
    ``lognormal:MU,SIGMA``, ``pareto:ALPHA,SCALE``, ``exponential:MEAN`` or ``fixed:S``
    (:func:`rlmap.simulator.inputs.parse_duration`); makes a tool's heavy tail real on one
    machine. Training rollouts only; evaluation does not wait."""

    @property
    def multi_turn(self) -> bool:
        """Episodes may have several policy turns (the tool task, gymnasium and verifiers
        environments)."""
        return kind_of(self.task).multi_turn

    @property
    def turn_budget(self) -> int:
        """Policy turns an episode may take: ``max_turns`` for the tool task, else 1."""
        return self.max_turns if self.multi_turn else 1

    @property
    def resolved_ops(self) -> str:
        """The operators actually drawn from."""
        if self.ops is not None:
            return self.ops
        return kind_of(self.task).default_ops


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling settings of the rollout engine (they define μ, the behaviour policy)."""

    max_new_tokens: int = 16
    """Response length limit; a response that hits it ends TRUNCATED."""
    temperature: float = 1.0
    """Sampling temperature; the reported behaviour log-probs include it."""
    top_p: float = 1.0
    """Nucleus sampling mass; the reported behaviour log-probs include it."""
    eval_samples: int = 8
    """Samples per held-out prompt for pass@k (k up to this)."""


@dataclass(frozen=True)
class RunConfig:
    """Schedule of evaluation, logging and checkpoints."""

    eval_every: int = 10
    """Evaluate on the held-out set every this many steps (and before the first, after the last)."""
    checkpoint_every: int = 10
    """Write a checkpoint every this many steps (and after the last)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept on disk."""
    tensorboard: bool = False
    """Also write metrics as TensorBoard events under ``<run>/tensorboard``; the same as
    naming ``tensorboard`` in ``loggers`` (kept: older runs' config.yaml carry it)."""
    loggers: tuple[str, ...] | str = ()
    """Experiment trackers that also get the config, every step's metrics and the summary,
    as a list or one comma-separated string: any of tensorboard, wandb, mlflow, trackio
    (each its extra, ``pip install 'rlmap[wandb]'``; :mod:`rlmap.runs.trackers`).
    ``metrics.jsonl`` is always written."""
    project: str = "rlmap"
    """The trackers' project (wandb, trackio) or experiment (mlflow); a run is named after
    its directory."""
    progress: bool = True
    """Show a progress bar on the console."""
    samples: int = 16
    """Held-out generations written per evaluation to ``samples/step_N.jsonl``: the first
    sample of each of the first this many prompts, as text with its error class (``rlmap
    samples``); 0 writes none."""
    save_merged: bool = False
    """LoRA runs (``model.lora_rank`` > 0): also write each checkpoint's merged model,
    W + (α/r)·BA, into its ``merged/`` directory, which loads with plain
    ``AutoModelForCausalLM.from_pretrained`` (the checkpoint itself holds the adapter)."""

    @property
    def logger_names(self) -> tuple[str, ...]:
        """``loggers`` as a tuple of names (a comma string split, blanks dropped), as
        given: duplicates kept, for validation to name."""
        given = self.loggers.split(",") if isinstance(self.loggers, str) else self.loggers
        return tuple(name.strip() for name in given if name.strip())

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers the run writes to: ``loggers``, with ``tensorboard`` first when
        ``tensorboard`` is true and the list does not name it."""
        names = self.logger_names
        alias = ("tensorboard",) if self.tensorboard and "tensorboard" not in names else ()
        return alias + names


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser and update schedule of the learner."""

    steps: int = 100
    """Rollout-and-update steps of the run."""
    lr: float = 1e-5
    """AdamW learning rate of the policy."""
    critic_lr: float = 1e-5
    """AdamW learning rate of the value critic."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after warm-up, over all optimiser steps of the run (steps ×
    epochs × mini-batches): constant; cosine to 0; linear to 0 (transformers' and TRL's
    default, ``get_linear_schedule_with_warmup``)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, in optimiser steps."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (β1, β2): the decay rates of the gradient's first and second moments (PyTorch's
    and transformers' default; OpenRLHF uses (0.9, 0.95)). Each in [0, 1)."""
    epochs_per_batch: int = 1
    """Passes over each rollout batch (PPO epochs)."""
    minibatches_per_epoch: int = 1
    """Optimiser steps per pass; each mini-batch pins its own reduction denominator."""
    micro_batch_size: int = 16
    """Rows per forward/backward; never changes the loss (denominators are pinned)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (the
    Hugging Face model's own checkpointing, policy and critic): less memory, more compute;
    the same loss and gradients."""
