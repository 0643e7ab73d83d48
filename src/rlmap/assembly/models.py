"""The run's models: where the policy and the reward model start from, model directories
checked cheaply (headers, never weights) with errors that name them, and the loaders."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlmap.assembly.embedded import EMBEDDED_MODELS, embedded_tokenizer, warm_start_spec
from rlmap.core.device import place, resolve, use_deterministic_kernels
from rlmap.core.errors import ConfigError, InputError, first_line
from rlmap.core.hf import loading_onto
from rlmap.embedded.tiny import build_tiny_model
from rlmap.embedded.tokenizer import restore_bos
from rlmap.embedded.warmstart import warm_start
from rlmap.learned.preferences import PreferenceSpec, embedded_reward_model
from rlmap.models import lora
from rlmap.recipes.config import RecipeConfig
from rlmap.tasks.registry import kind_of


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
    if cfg.model.path not in EMBEDDED_MODELS or not kind_of(cfg.data.task).preference_pairs:
        raise ConfigError(
            "model.reward_path: feedback.source=reward_model needs a trained reward model "
            "(rlmap reward-model train --pairs FILE.jsonl); only the embedded default has one"
        )
    return embedded_reward_model(warm_start_spec(cfg), PreferenceSpec(), progress=progress)


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
                AutoConfig.from_pretrained(path)
            )
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
        raise ConfigError(
            f"{field}: {path} holds a LoRA adapter, not a whole model; give its "
            "base model, or the merged model of a LoRA run (run.save_merged="
            f"true writes it to {lora.MERGED_DIR}/)"
        )
    if not config.is_file():
        raise ConfigError(f"{field}: {path} is not a local Hugging Face model directory")
    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"{config}: cannot read the model config ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(
            f"{config}: not valid JSON (truncated?); {field} needs a whole model directory"
        ) from None
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
