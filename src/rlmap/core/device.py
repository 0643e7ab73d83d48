"""Where the learner's models and micro-batches live: one device, resolved once.

``system.device`` is ``auto`` (``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``),
``cpu``, ``cuda`` or ``cuda:N``, as accelerate's ``Accelerator.device`` picks it. The run's
models are placed there through :func:`place` before adapters and optimisers exist (so
LoRA's A and B and AdamW's moments are created on it); the batch record stays on the host
and each micro-batch crosses to the model's device (:func:`model_device`), its per-row
outputs coming back once per pass. :func:`audit` lists where every parameter, buffer and
optimiser state of a run lives.

The embedded warm start is not placed: it runs on the CPU, where its cached result is
bit-reproducible, and the run then loads it onto the device like any checkpoint.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from rlmap.core.errors import ConfigError

SETTING = re.compile(r"auto|cpu|cuda(:\d+)?")
"""What ``system.device`` may say."""


def resolve(
    setting: str, environ: Mapping[str, str] = os.environ, field: str = "system.device"
) -> torch.device:
    """The learner's device for ``system.device`` (``LOCAL_RANK``, a launcher's, picks the
    GPU of ``auto`` and ``cuda``); a one-line ConfigError naming ``field`` (a command's
    ``--device``) for a device this machine lacks."""
    if not SETTING.fullmatch(setting):
        raise ConfigError(f"{field}: one of auto, cpu, cuda, cuda:N, got {setting!r}")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{field}: {setting} asks for CUDA, and this torch sees "
            f"none (torch {torch.__version__}); use cpu or auto"
        )
    count = torch.cuda.device_count()
    index = int(setting.partition(":")[2] or environ.get("LOCAL_RANK", "0") or 0)
    if not 0 <= index < count:
        raise ConfigError(
            f"{field}: cuda:{index} is not among this machine's {count} "
            f"GPU(s) (cuda:0..cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def place(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` on ``device`` (in place; the same object back)."""
    return module.to(device)


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a model without any)."""
    first = next(model.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def cuda_indices(device: torch.device) -> list[int]:
    """The CUDA devices whose generators a ``fork_rng`` on ``device`` must save: its own, or
    none (a CPU run never initialises CUDA)."""
    if device.type != "cuda":
        return []
    return [torch.cuda.current_device() if device.index is None else device.index]


def audit(
    models: Mapping[str, nn.Module | None],
    optimizers: Mapping[str, torch.optim.Optimizer | None] = {},
) -> dict[str, list[str]]:
    """{device: names} of every parameter, buffer and optimiser state tensor of ``models``
    and ``optimizers`` (None entries skipped): a run whose parts all share one device
    gives one key."""
    found: defaultdict[str, list[str]] = defaultdict(list)
    for name, model in models.items():
        if model is None:
            continue
        for key, tensor in _tensors(model):
            found[str(tensor.device)].append(f"{name}.{key}")
    for name, optimizer in optimizers.items():
        if optimizer is None:
            continue
        for i, state in enumerate(optimizer.state.values()):
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:  # step counts: CPU
                    found[str(value.device)].append(f"{name}.state[{i}].{key}")
    return dict(found)


def _tensors(model: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def describe(device: torch.device) -> dict[str, Any]:
    """What the ledger and ``summary.json`` record of the learner's device: its name, the
    CUDA version torch was built with, and the float32 matmul precision (``highest``: no
    TF32, so κ and the exactness checks mean what they say). Nothing CUDA is touched on a
    CPU device."""
    cpu = device.type != "cuda"
    return {
        "device": str(device),
        "device_name": "cpu" if cpu else torch.cuda.get_device_name(device),
        "cuda": None if cpu else torch.version.cuda,
        "fp32_matmul": torch.get_float32_matmul_precision(),
        "deterministic_kernels": torch.are_deterministic_algorithms_enabled(),
    }


CUBLAS_WORKSPACE = ":4096:8"
"""``CUBLAS_WORKSPACE_CONFIG`` for deterministic cuBLAS (CUDA ≥ 10.2; PyTorch's
reproducibility notes): a fixed workspace per stream, so a matmul's reduction order repeats."""


def use_deterministic_kernels(device: torch.device) -> None:
    """PyTorch's deterministic algorithms on a CUDA ``device`` (``system.deterministic_kernels``):
    an op without a deterministic kernel then raises instead of varying between runs, and
    cuBLAS gets a fixed workspace (set before its first call; a value the user set is kept).
    Process-wide, like the matmul precision. A CPU run is deterministic already: nothing."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued kernels (a GPU's), so that a phase timer read next
    measures the phase and not its launch; nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def elapsed(started: float, device: torch.device) -> float:
    """Seconds since ``started`` (a ``time.perf_counter()`` reading), read once ``device``'s
    queue has drained: a phase timer's reading. CUDA kernels run after their launch returns,
    so without the sync a phase is charged its launches and the next phase its work."""
    synchronize(device)
    return time.perf_counter() - started


def take_peak(device: torch.device) -> int | None:
    """Bytes allocated at most on the learner's CUDA ``device`` since its peak was last reset,
    and a new peak started (so the next phase is measured alone); None on the CPU, whose
    peak resident set cannot be split by phase (and no CUDA context is started)."""
    if device.type != "cuda":
        return None
    peak = int(torch.cuda.max_memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    return peak


PEAK_FLOPS: dict[str, dict[str, float]] = {
    "NVIDIA H200": {"bfloat16": 989.4e12, "float32": 66.9e12},
    "NVIDIA H100 80GB HBM3": {"bfloat16": 989.4e12, "float32": 66.9e12},
    "NVIDIA A100-SXM4-80GB": {"bfloat16": 312e12, "float32": 19.5e12},
    "NVIDIA A100-SXM4-40GB": {"bfloat16": 312e12, "float32": 19.5e12},
}
"""Dense peak FLOP/s by device name (``torch.cuda.get_device_name``) and precision, from
NVIDIA's data sheets (H100/H200 SXM: 989.4 TFLOP/s BF16 dense, 66.9 FP32; A100 SXM: 312
and 19.5), the denominators of ``system/mfu``; docs/scaling.md cites them."""


def update_flops_per_token(model: nn.Module) -> int:
    """FLOPs an update spends per token: 6 per trained parameter (forward 2, backward 4: the
    gradients of the activations and of the weight), 4 per frozen one (no weight gradient:
    LoRA's base)."""
    return sum((6 if w.requires_grad else 4) * w.numel() for w in model.parameters())


def mfu(
    flops_per_token: int, tokens: int, seconds: float, device: torch.device, dtype: str
) -> float | None:
    """Model FLOPs utilisation of an update: ``flops_per_token`` (6·N for full fine-tuning,
    :func:`update_flops_per_token`) × tokens ÷ seconds ÷ the device's peak FLOP/s at
    ``dtype`` (``bfloat16`` | ``float32``); None when the device's peak is not in
    :data:`PEAK_FLOPS` (every CPU)."""
    if device.type != "cuda" or seconds <= 0:
        return None
    peak = PEAK_FLOPS.get(torch.cuda.get_device_name(device), {}).get(dtype)
    return None if peak is None else flops_per_token * tokens / seconds / peak
