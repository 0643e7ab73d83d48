"""The board: the newest published weights, a snapshot the rollout workers load.

Weights travel as a snapshot taken by the learner after its step, never read from the live
model while it trains: the rollout weights streamed one tensor at a time into buffers of
the board's own, in the rollout dtype — on the learner's device for in-process workers
(:mod:`rlmap.system.async_loop`), in host memory for Ray actors
(:mod:`rlmap.system.ray_workers`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from rlmap.models.lora import rollout_stream


@dataclass
class Board:
    """The newest published weights: a version and a snapshot of the rollout weights (of a
    LoRA policy, the merged ones: engines and Ray actors load them into a plain model)."""

    version: int
    state: dict[str, torch.Tensor]
    dtype: torch.dtype | None = None
    """The snapshot's floating tensors are in this dtype (the rollout's, which the workers'
    engines sample in: a bfloat16 rollout keeps half the bytes); None: the model's own."""
    host: bool = False
    """The snapshot is in host memory (Ray actors: the object store takes it from there), else
    on the model's device (in-process workers copy it device to device)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Snapshot ``model``'s rollout weights as ``version``, never its live tensors (the
        learner goes on training them): each tensor of the stream is copied into a buffer of
        the board's own as it comes (:func:`snapshot_copy`), so besides the snapshot at most
        one merged LoRA layer exists, and no full-precision copy of the model."""
        stream = rollout_stream(model, dtype=self.dtype)  # floating parameters cast, not buffers
        snapshot = {name: snapshot_copy(t, None, self.host) for name, t in stream}
        with self.lock:
            self.version, self.state = version, snapshot

    def latest(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self.lock:
            return self.version, self.state


def snapshot_copy(t: torch.Tensor, dtype: torch.dtype | None, host: bool) -> torch.Tensor:
    """A copy of ``t`` of the board's own: cast to ``dtype`` (a floating tensor) inside the
    ``copy_``; in host memory with ``host``, page-locked when ``t`` is on a GPU (a copy off a
    GPU runs at full speed only into pinned memory; on a machine without CUDA, pinning
    raises), else on ``t``'s device."""
    target = dtype if dtype is not None and t.is_floating_point() else t.dtype
    device = torch.device("cpu") if host else t.device
    pin = host and t.is_cuda
    return torch.empty(t.shape, dtype=target, device=device, pin_memory=pin).copy_(t)
