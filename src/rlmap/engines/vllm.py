"""A rollout engine on vLLM (``system.engine=vllm``), running in the calling process.

Token ids in, token ids out: prompts go to vLLM as ``prompt_token_ids`` with the
tokenizer never loaded (``skip_tokenizer_init``), and the sampled ids come back
undecoded (``detokenize=False``), so nothing on the rollout path re-tokenises.

Behaviour log-probs. The engine is built with ``logprobs_mode="processed_logprobs"``:
vLLM's sampler then reports, for the sampled token, the log-softmax of the float32
logits after temperature and top-p (tokens outside the nucleus at −inf) — the
distribution the token was drawn from, as :class:`rlmap.engines.hf.HFEngine`
reports it. At temperature 0 (greedy) no warper runs and it is the log-softmax of the
raw logits, also as in the HF engine. Every other sampling knob is set to its off value
and the model's shipped ``generation_config.json`` gives no defaults
(``generation_config="vllm"``). EOS is never implied: ``ignore_eos=True`` keeps vLLM from
adding the EOS ids it would read from that file, and the engine's own EOS goes in with the
call's ``stop_token_ids``; the stop token is part of the response. A NaN or infinite
log-prob stops the run as the HF engine's does (``TrainingError``).

Randomness. Every sample is its own request with its own seed, drawn from torch's default
generator at the call; the run seeds and checkpoints that generator, so a synchronous
run is repeatable for a seed and resumes exactly. (vLLM's CPU sampler also draws from that
generator at every decoding step, deterministically.) vLLM does not promise bit-identical
logits across batch compositions or hardware (its kernels are not batch-invariant), so
equal seeds give equal samples only for the same requests in the same call on the same
machine and build. The prefix cache is part of that state: it is cleared at every weight
update and after every evaluation (:meth:`VLLMEngine.clear_cache`), so a resumed run
starts each step with the cache an uninterrupted run has.

Context. ``max_model_len`` is the model's context, at most ``MAX_LEN`` (vLLM must hold one
full sequence in its KV cache); a response that reaches it ends unstopped, as one that
reaches ``max_new_tokens`` does, and a context (prompt and earlier turns) that already
fills it stops the run in one line.

Weights. The engine is built from the checkpoint's config with dummy weights and is then
given the policy's tensors through the worker's ``reload_weights`` (in place, no disk);
every later :meth:`update_weights` does the same and clears the prefix cache, whose KV
entries belong to the old weights. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps vLLM's
engine core in this process, so the tensors are handed over, not serialised.

Side effects of building a vLLM engine that this module undoes: vLLM seeds Python's,
NumPy's and torch's global generators, and its CPU worker replaces ``torch.set_num_threads``
with a stub. Those it leaves: a one-rank ``torch.distributed`` group (gloo), the process's
memory bound to NUMA node 0 on a CPU. One engine per process: vLLM keeps process-wide
state (its distributed groups, its config context). So several learner ranks have one engine
each, on the rank's own device, built with vLLM's ``external_launcher`` executor: it joins the
ranks' ``torch.distributed`` world instead of making one, and each rank's engine samples its
share of the prompts on its own, as TRL's colocated mode runs (:func:`sharing_settings`;
vLLM's CPU build runs it too).

Sleep (``system.engine_sleep``, vLLM's CUDA build only). On the learner's GPU in the
synchronous loop the engine is built with ``enable_sleep_mode`` and, while the learner steps,
gives its memory back (:meth:`VLLMEngine.sleep`): at level 1 its weights go to CPU memory,
at level 2 they are dropped, and at both its KV cache is. It then wakes in two halves around
the weight reload, as TRL and verl do: the weights' pool first, the reload, and only then
the KV cache's (:meth:`VLLMEngine.wake`), so that the reload has the room; the prefix cache
is reset as the KV cache wakes. Level 2 leaves the woken weights' memory uninitialised, and
the reload that comes before any ``generate`` is what refills it (vLLM issue #29341); rlmap
reloads every weight at every step anyway, which is why 2 is the default: level 1 would copy
back weights about to be replaced. vLLM 0.32 turns PyTorch's ``expandable_segments`` off
around its memory pool itself.
"""

from __future__ import annotations

import gc
import math
import os
import random
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlmap.core.errors import ConfigError, TrainingError
from rlmap.engines.engine import Completion, StopStrings, cut_at_stop_strings, kept_rows
from rlmap.engines.hf import PARTIAL, Weights, check_sampling_args, checked, refuse_mismatch
from rlmap.engines.vllm_settings import (
    MAX_LEN,
    engine_context,
    llm_settings,
    require_vllm,
    sharing_settings,
)
from rlmap.models.lora import rollout_stream

SLEEP_TAGS = ("weights", "kv_cache")
"""vLLM's memory pools that sleep and wake, in the order they wake."""
SEED_BOUND = 2**31
"""Request seeds are drawn from [0, SEED_BOUND)."""


class VLLMEngine:
    """Batched sampling with ``vllm.LLM.generate``: every sample a request, continuously batched.

    ``model_dir`` gives the architecture (its ``config.json``); the weights come from
    ``model``, the learner's policy (a LoRA policy's merged), right away and at every
    :meth:`update_weights`. ``memory`` is the fraction of GPU memory vLLM may take (weights,
    activations, KV cache), as its ``gpu_memory_utilization``; on a CPU the KV cache is
    sized for ``max_batch`` sequences of the full context, at most ``CPU_KV_CACHE_MAX``.
    ``sleep`` > 0 builds it with sleep mode, to sleep at that level while the learner steps
    (:meth:`sleep`, :meth:`wake`); ``rank``: this process's learner rank among several (None:
    the only one), which the engine joins (:func:`sharing_settings`).
    """

    def __init__(
        self,
        model_dir: Path,
        model: torch.nn.Module,
        *,
        eos_token_id: int | Sequence[int],
        dtype: torch.dtype = torch.float32,
        max_batch: int = 256,
        memory: float = 0.5,
        sampling_masks: bool = False,
        sleep: int = 0,
        rank: int | None = None,
    ) -> None:
        vllm = require_vllm()
        self.sleep_level = sleep
        """vLLM's sleep level while the learner steps (:meth:`sleep`); 0: it never sleeps."""
        self.rank = rank
        """This process's learner rank when several share the ranks' world, else None."""
        self.asleep: frozenset[str] = frozenset()
        """Those of ``SLEEP_TAGS`` whose memory is given back now."""
        self.sampling_masks = sampling_masks
        """Built with vLLM's ``return_sampling_mask``: ``generate`` can return kept sets."""
        self.eos_token_ids = (
            (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)
        )
        self._vllm = vllm
        self._version = 0
        self.generator: torch.Generator | None = None
        """Where the requests' seeds come from (:meth:`reseed`); None: torch's default one."""
        self.lock = threading.RLock()
        """Held for every call into vLLM: it is not safe to call from two threads at once."""
        self.names = frozenset(name for name, _ in rollout_stream(model))
        """The weights every update must name, no more and no fewer (vLLM only logs a miss)."""
        self.dtype = dtype
        """The engine's weights' dtype: floating weights are cast to it before an FSDP2 shard
        is gathered, so a bfloat16 engine gathers half the bytes."""
        self.max_len = engine_context(model)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        settings = llm_settings(
            model_dir,
            model,
            dtype=dtype,
            max_batch=max_batch,
            max_len=self.max_len,
            memory=memory,
            sampling_masks=sampling_masks,
        )
        settings |= sharing_settings(sleep, rank)
        with _contained_side_effects():
            self.llm = vllm.LLM(**settings)
        if rank is not None:
            _leave_the_world(self.llm)
        self.update_weights(model, 0)

    @property
    def version(self) -> int:
        """The weight version the next ``generate`` samples from."""
        return self._version

    def reseed(self, seed: int | None) -> None:
        """Draw the requests' seeds from a generator of the engine's own seeded with ``seed``
        (None: torch's default generator again)."""
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        """Sample from ``model``'s weights (merged, for a LoRA policy) from now on, streamed
        in one tensor at a time (:func:`~rlmap.models.lora.rollout_stream`)."""
        self.set_weights(rollout_stream(model, dtype=self.dtype), version)

    def set_weights(self, state: Weights, version: int) -> None:
        """Load weights (Hugging Face names: a state dict, or a stream of (name, tensor)
        pairs) in place, and label them ``version``. vLLM's ``reload_weights`` pulls them
        one at a time from a generator, each cast to the engine's dtype as it is copied.
        A missing or unexpected name is refused in one line (vLLM would only log it): a
        dict's before anything loads, a stream's as it passes — one refused halfway leaves
        the engine at version -1 (no version's weights whole: any view reloads its own).

        The prefix cache is cleared: its KV entries were computed with the old weights.
        """
        refuse_mismatch(state, self.names)
        pairs = ((name, tensor.detach()) for name, tensor in checked(state, self.names))

        def reload(worker: Any) -> None:  # the worker's: its model runner in vLLM's config
            worker.reload_weights(weights_iterator=pairs)

        with self.lock, torch.no_grad():
            self._version = PARTIAL
            self.llm.collective_rpc(reload)
            self.clear_cache()
            self._version = version

    def clear_cache(self) -> None:
        """Forget the prefix cache (after a weight update its KV is stale; after an evaluation
        it holds what a resumed run's cache would not)."""
        with self.lock:
            if not self.llm.reset_prefix_cache(reset_running_requests=True):
                raise TrainingError("vLLM engine: its prefix cache could not be cleared")

    def sleep(self) -> None:
        """Give the GPU to the learner: vLLM at ``sleep_level`` (1: its weights copied to CPU
        memory; 2: dropped; both: its KV cache dropped), then PyTorch's cached free blocks
        back to the device, as verl does."""
        if not self.sleep_level or self.asleep:
            raise RuntimeError(
                f"vLLM engine: built to sleep at level {self.sleep_level} (0: "
                f"never), with {sorted(self.asleep)} asleep already"
            )
        with self.lock:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = frozenset(SLEEP_TAGS)
        torch.cuda.empty_cache()

    def wake(self, tag: str) -> None:
        """Map one of vLLM's pools back, in the order of ``SLEEP_TAGS``: ``weights`` before the
        weight reload, ``kv_cache`` after it. PyTorch's cache first gives the learner's freed
        blocks back to the device (vLLM maps its pools with the CUDA driver, outside that
        cache, and would find no room). The KV cache wakes empty: the prefix cache is reset."""
        if tag not in self.asleep or tag != next(t for t in SLEEP_TAGS if t in self.asleep):
            raise RuntimeError(f"vLLM engine: wake {tag!r} while {sorted(self.asleep)} sleep")
        torch.cuda.empty_cache()
        with self.lock:
            self.llm.wake_up(tags=[tag])
            self.asleep = self.asleep - {tag}
            if tag == "kv_cache":
                self.clear_cache()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: Sequence[int] = (),
        stop_strings: StopStrings | None = None,
        kept_sets: int = 0,
    ) -> list[list[Completion]]:
        """``n`` samples per prompt (outer list per prompt, in order); see the module docstring.

        Stop strings: this engine holds no tokenizer, so a row runs on to a stop token or
        ``max_new_tokens`` and is then cut after the token that completed its first stop
        string (:func:`~rlmap.engines.engine.cut_at_stop_strings`), as the HF engine's are.

        ``kept_sets`` > 0 needs an engine built with ``sampling_masks``: each token's kept set
        is vLLM's ``CompletionOutput.sampling_mask`` (the ids left finite by its top-p, top-k
        and min-p filters). Untested on a GPU: vLLM 0.32's CPU build cannot return them."""
        check_sampling_args(
            prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
        )
        self._check_request(prompts, kept_sets)
        stops = list(dict.fromkeys((*self.eos_token_ids, *stop_token_ids)))
        flat = [tuple(p) for p in prompts for _ in range(n)]
        seeds = torch.randint(0, SEED_BOUND, (len(flat),), generator=self.generator).tolist()
        params = [
            self._sampling_params(seed, max_new_tokens, temperature, top_p, stops) for seed in seeds
        ]
        requests = [{"prompt_token_ids": list(p)} for p in flat]
        with self.lock:
            if self.asleep:  # vLLM would sample from dropped weights, or wait for ever
                raise RuntimeError(f"vLLM engine: generate while {sorted(self.asleep)} sleep")
            outputs = self.llm.generate(requests, params, use_tqdm=False)
            completions = [
                cut_at_stop_strings(self._completion(p, out, stops, kept_sets), stop_strings)
                for p, out in zip(flat, outputs, strict=True)
            ]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _check_request(self, prompts: Sequence[Sequence[int]], kept_sets: int) -> None:
        """What vLLM cannot answer, refused in one line before it is asked: kept sets from an
        engine built without sampling masks, a context as long as the engine's."""
        if kept_sets and not self.sampling_masks:
            raise ConfigError(
                "behaviour.replay_sampling_set: this vLLM engine was built "
                "without return_sampling_mask, so it has no kept sets"
            )
        longest = max(len(p) for p in prompts)
        if longest >= self.max_len:  # vLLM would refuse the whole call in a traceback
            raise TrainingError(
                f"rollout: a context of {longest} tokens reaches the vLLM "
                f"engine's context of {self.max_len} (the model's, at "
                f"most {MAX_LEN}); shorten the prompts or the turns"
            )

    def _sampling_params(
        self, seed: int, max_new_tokens: int, temperature: float, top_p: float, stops: list[int]
    ) -> Any:
        """One row's ``SamplingParams``: plain sampling (no top-k, min-p or penalties) from
        its own seed, greedy at temperature 0; stopped by rlmap's stop tokens, not vLLM's EOS."""
        greedy = temperature == 0
        return self._vllm.SamplingParams(
            n=1,
            temperature=temperature,
            top_p=1.0 if greedy else top_p,
            top_k=0,
            min_p=0.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            max_tokens=max_new_tokens,
            min_tokens=0,
            stop_token_ids=stops,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            skip_special_tokens=False,
            seed=None if greedy else seed,
        )

    def _completion(
        self, prompt: tuple[int, ...], output: Any, stops: list[int], kept_sets: int = 0
    ) -> Completion:
        if tuple(output.prompt_token_ids) != prompt:
            raise RuntimeError("vLLM engine: an output came back for another prompt")
        (sample,) = output.outputs
        ids = tuple(sample.token_ids)
        logprobs = tuple(
            float(step[token].logprob) for step, token in zip(sample.logprobs, ids, strict=True)
        )
        if not all(math.isfinite(x) for x in logprobs):
            raise TrainingError(
                "rollout: the policy's log-probs are NaN or infinite (the "
                "weights overflow in the forward pass); stopped"
            )
        stopped = sample.finish_reason == "stop" and bool(ids) and ids[-1] in stops
        kept = sampled_sets(sample, kept_sets) if kept_sets else None
        return Completion(
            prompt_ids=prompt,
            response_ids=ids,
            logprobs=logprobs,
            stopped=stopped,
            version=self._version,
            kept=kept,
        )

    def close(self) -> None:
        """Shut vLLM's engine core down (the engine is unusable afterwards); nothing for a
        learner rank's engine, which lives as long as its process (:func:`_leave_the_world`)."""
        if self.rank is not None:  # its shutdown would tear down the ranks' world
            return
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if shutdown is not None:
            shutdown()


Pinned = dict[str, torch.Tensor] | torch.nn.Module
"""What a view is pinned to: a snapshot of the weights, or a module read when needed."""


class PinnedView:
    """One user's view of a shared :class:`VLLMEngine`, with a weight version of its own.

    The asynchronous loop's in-process workers and its learner share one vLLM engine (two
    in one process must not run at once, and each would hold its own KV cache). Each holds a
    view pinned to some weights: a snapshot and its version (a worker: the board's), or a
    model (the learner: its live policy, read when the view samples — only the learner's
    thread does, between its steps, so that is the published version). A ``generate``
    loads the pinned weights first when the engine holds another version, all under the
    engine's lock. So a worker samples from exactly the weights it took, as with an engine
    of its own (a multi-turn episode keeps them across its turns unless partial rollout
    pins newer ones between turns); weight versions label weights uniquely.
    """

    def __init__(self, engine: VLLMEngine, version: int, weights: Pinned) -> None:
        self.engine = engine
        self._version, self._weights = version, weights
        self.generator: torch.Generator | None = None
        """This view's own seed generator (:meth:`reseed`), lent to the engine per call."""

    def reseed(self, seed: int | None) -> None:
        """As :meth:`VLLMEngine.reseed`, for this view's calls only."""
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    @property
    def version(self) -> int:
        """The weight version this view's next ``generate`` samples from."""
        return self._version

    @property
    def max_len(self) -> int:
        """The engine's context (:attr:`VLLMEngine.max_len`)."""
        return self.engine.max_len

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        """Pin ``model`` itself (no copy), read when this view next has to load it."""
        self._version, self._weights = version, model

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Pin ``state`` (not copied: the caller's snapshot) as version ``version``."""
        self._version, self._weights = version, state

    def clear_cache(self) -> None:
        self.engine.clear_cache()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: Sequence[int] = (),
        stop_strings: StopStrings | None = None,
        kept_sets: int = 0,
    ) -> list[list[Completion]]:
        """The engine's ``generate`` on this view's weights."""
        with self.engine.lock:
            if self.engine.version != self._version:
                w = self._weights
                if isinstance(w, dict):
                    self.engine.set_weights(w, self._version)
                else:
                    self.engine.update_weights(w, self._version)
            shared, self.engine.generator = self.engine.generator, self.generator
            try:
                return self.engine.generate(
                    prompts,
                    n=n,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    stop_token_ids=stop_token_ids,
                    stop_strings=stop_strings,
                    kept_sets=kept_sets,
                )
            finally:
                self.engine.generator = shared


def sampled_sets(sample: Any, cap: int) -> torch.Tensor:
    """(len(token_ids), K) int32 kept sets of one vLLM sample (``CompletionOutput``), from its
    ``sampling_mask.token_ids`` (one list of ids per generated token), those over ``cap`` ids
    left out (:func:`~rlmap.engines.engine.kept_rows`)."""
    mask = getattr(sample, "sampling_mask", None)
    sets = None if mask is None else mask.token_ids
    if sets is None or len(sets) != len(sample.token_ids):
        raise TrainingError(
            "rollout: vLLM returned no kept set for some sampled tokens "
            "(behaviour.replay_sampling_set needs one per token)"
        )
    return kept_rows(sets, cap)


def _leave_the_world(llm: Any) -> None:
    """Keep vLLM from tearing down the learner ranks' world. Its engine's shutdown (when it is
    garbage-collected, or at exit) destroys torch.distributed's default group, which under
    ``external_launcher`` is the ranks' own: before their last barrier (which then fails), or
    after they destroyed it themselves (then it raises on its subgroups, gone with it). So its
    finalizer is dropped: the engine lives as long as the process, its groups die with the
    world, and the ``gc.freeze`` of its start-up is undone as its shutdown would have."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is not None:
        finalizer.detach()
    gc.unfreeze()


@contextmanager
def _contained_side_effects() -> Iterator[None]:
    """Restore the global generators and ``torch.set_num_threads`` that building vLLM touches."""
    states = random.getstate(), np.random.get_state()
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
