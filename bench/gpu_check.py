"""The GPU check's figures (issue 28): run by ``bench/gpu_check.sh``, one JSON file out.

Four parts, each a dict in the output file, each printed as a line:

1. ``tiny``: ``grpo`` on the embedded default on the learner's device (``system.device``
   auto: cuda:0 on a GPU), fp32. The ledger's device, κ's largest |log| per step (< 1e-3
   asked: the HF engine shares the policy, so κ is float noise) and held-out pass@1
   before and after.
2. ``audit``: the same run's parts built again and stepped once; every parameter, buffer
   and AdamW state on the one device (:func:`rlmap.core.device.audit`).
3. ``large``: a random Qwen2 of Qwen2.5-0.5B's shape (24 layers × 896, V = 151,936; ~0.5 B
   parameters), bf16 autocast over fp32 master weights, ``grpo`` with 32 prompts × 8 samples
   and up to 256 new tokens: seconds per step split into rollout / π_old + π_ref / update,
   generated tokens/s, update tokens/s, learner peak memory against the 16 B/param floor of
   ``bench/scaling.py``, the rollout's peak memory, ``system/mfu``. Its answers are random
   (pass@1 ≈ 0): it times.
4. ``resume``: a run killed with SIGKILL after its second checkpoint and resumed, against
   one that was not: the largest relative difference of the later steps' losses.
5. ``data_parallel`` (issue 29): a one-rank world on the learner's device forced through the
   data-parallel wrappers — the process group rlmap would build (``cpu:gloo,cuda:nccl`` on
   a GPU: NCCL carries the gradients; gloo on a CPU), DDP and FSDP2 in float32 (gradient
   equal to the plain module's) and FSDP2 with the bfloat16 ``MixedPrecisionPolicy`` (its
   distance from float32, reported).
6. ``weight_sync``: the 0.5B model of ``large`` streamed into a bfloat16 engine copy on the
   device (:func:`rlmap.models.lora.rollout_stream`, one tensor at a time): seconds per
   update, and the copy equal to the policy cast to bfloat16.
7. ``vllm_sleep``: only where vLLM's CUDA build imports (it does not on the machine this
   project is lent): an engine built to sleep at level 2, three cycles of sleep → wake
   weights → reload → wake KV cache, the GiB each sleep frees and greedy tokens identical
   before and after. Elsewhere it says why it was skipped.

``--small`` runs every part at toy size (a CPU dry run: ``CHECK_SMALL=1``).

    python bench/gpu_check.py --out gpu_check.json [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rlmap.assembly.models import model_path
from rlmap.assembly.parts import build
from rlmap.core.device import audit, describe, resolve
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.system.loop_state import LoopState
from rlmap.system.sync import sync_step

QUIET = ["run.progress=false"]


def rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def tiny(out: Path, small: bool) -> dict[str, Any]:
    steps = 2 if small else 20
    overrides = [f"optim.steps={steps}", f"run.eval_every={steps}", *QUIET]
    run = out / "tiny"
    summary = run_training(build_config("grpo", None, overrides), run)
    ledger = json.loads((run / "ledger.json").read_text())
    kappa = [r["ratio/kappa/max_abs_log"] for r in rows(run) if "ratio/kappa/max_abs_log" in r]
    before, after = summary["before"]["eval/pass@1"], summary["after"]["eval/pass@1"]
    return {
        "device": ledger["device"],
        "device_name": ledger["device_name"],
        "steps": steps,
        "kappa_max_abs_log": max(kappa),
        "pass@1_before": before,
        "pass@1_after": after,
        "pass@1_up": after > before,
    }


def audited(small: bool) -> dict[str, Any]:
    cfg = build_config("ppo", None, QUIET)  # policy, reference, critic and their optimisers
    parts = build(cfg, model_path(cfg))
    sync_step(parts, LoopState())
    models = {"policy": parts.policy, "reference": parts.reference, "critic": parts.critic}
    found = audit(models, {"optimizer": parts.optimizer, "critic": parts.critic_optimizer})
    return {
        "devices": sorted(found),
        "tensors": sum(len(v) for v in found.values()),
        "one_device": set(found) == {str(parts.device)},
    }


def large_model(directory: Path, small: bool) -> int:
    """A random Qwen2 of Qwen2.5-0.5B's shape (toy size with ``small``) with the embedded
    tokenizer (ids past its vocabulary decode to nothing), saved to ``directory``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlmap.embedded.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    shape = (
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=4096,
        )
        if small
        else dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151_936,
        )
    )
    config = Qwen2Config(
        **shape,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def large(out: Path, small: bool) -> dict[str, Any]:
    directory = out / "large-model"
    parameters = large_model(directory, small)
    steps = 2 if small else 4
    shape = (
        [
            "sampling.prompts_per_step=4",
            "sampling.group_size=2",
            "generation.max_new_tokens=8",
            "optim.micro_batch_size=4",
        ]
        if small
        else [
            "sampling.prompts_per_step=32",
            "sampling.group_size=8",
            "generation.max_new_tokens=256",
            "optim.micro_batch_size=16",
        ]
    )
    overrides = [
        f"model.path={directory}",
        f"optim.steps={steps}",
        *shape,
        *QUIET,
        "system.train_dtype=bfloat16",
        "system.rollout_dtype=bfloat16",
        "data.eval_size=8",
        "generation.eval_samples=1",
        f"run.eval_every={steps}",
        f"run.checkpoint_every={steps}",
    ]
    run = out / "large"
    run_training(build_config("grpo", None, overrides), run)
    steps_run = [r for r in rows(run) if "loss/total" in r]
    timed = steps_run[1:] or steps_run  # the first step pays for warm-up
    clock = [r["budget/wall_clock_s"] for r in steps_run]
    walls = [
        b - a
        for a, b, r in zip(clock, clock[1:], steps_run[1:], strict=False)
        if "eval/pass@1" not in r
    ] or [clock[0]]  # steps without an evaluation

    def median(key: str, values: list[float] | None = None) -> float:
        ordered = sorted(values if values is not None else [r.get(key, 0.0) for r in timed])
        return ordered[len(ordered) // 2]

    rollout, update = median("system/rollout_s"), median("system/policy_update_s")
    scoring = median("system/old_logprobs_s") + median("system/reference_s")
    generated = median("sampling/generated_tokens")
    ledger = json.loads((run / "ledger.json").read_text())
    peak = ledger.get("peak_gpu_memory_bytes")
    rollout_peak = ledger.get("peak_rollout_gpu_memory_bytes")
    return {
        "parameters": parameters,
        "steps": steps,
        "s_per_step": median("", walls),
        "rollout_s": rollout,
        "pi_old_and_ref_s": scoring,
        "update_s": update,
        "generated_tokens_per_s": generated / rollout if rollout else None,
        "update_tokens_per_s": median("system/update_tokens_per_s"),
        "mfu": median("system/mfu") if "system/mfu" in timed[0] else None,
        "learner_peak_gib": None if peak is None else peak / 2**30,
        "rollout_peak_gib": None if rollout_peak is None else rollout_peak / 2**30,
        "floor_16_bytes_per_param_gib": 16 * parameters / 2**30,
        "device": ledger["device"],
    }


def killed_and_resumed(out: Path, small: bool) -> dict[str, Any]:
    """A run killed (SIGKILL) once its step-2 checkpoint exists, resumed to step 4, against
    an uninterrupted one: the largest relative difference of steps 3-4's ``loss/total``."""
    common = ["optim.steps=4", "run.checkpoint_every=1", "run.eval_every=100", *QUIET]
    cli = [sys.executable, "-m", "rlmap.cli", "train"]
    whole, cut = out / "whole", out / "cut"
    subprocess.run([*cli, "--out", str(whole), *common], check=True, capture_output=True)
    process = subprocess.Popen(
        [*cli, "--out", str(cut), *common], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while not (cut / "checkpoints" / "step_2").is_dir() and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    subprocess.run([*cli, "--resume", str(cut)], check=True, capture_output=True)
    a, b = (
        {r["step"]: r["loss/total"] for r in rows(run) if "loss/total" in r} for run in (whole, cut)
    )
    gaps = [abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in (3, 4)]
    return {"killed_after_step": 2, "resumed_to": max(b), "max_rel_loss_gap": max(gaps)}


def _toy_qwen2() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=512,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _gradient(
    model: torch.nn.Module, wrapped: torch.nn.Module, ids: torch.Tensor, bf16: bool = False
) -> dict[str, torch.Tensor]:
    """Every parameter's gradient of one fixed loss through ``wrapped`` (a wrapper of
    ``model``, or ``model`` itself), as full float32 tensors keyed by ``model``'s names."""
    from rlmap.learner.distributed import local

    with torch.autocast(ids.device.type, torch.bfloat16, enabled=bf16):
        logits = wrapped(input_ids=ids).logits.float()
    logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).mean().backward()
    out = {}
    for name, param in model.named_parameters():
        grad = param.grad
        full = getattr(grad, "full_tensor", None)
        out[name] = (full() if full is not None else local(grad)).float().cpu()
    return out


def data_parallel(out: Path, small: bool) -> dict[str, Any]:
    """Issue 29's one-rank check: rlmap's process group and wrappers at world size 1."""
    import torch.distributed as dist

    from rlmap.learner.distributed import World, backend, parallel
    from rlmap.learner.launch import free_port

    device = resolve("auto")
    gpu = device if device.type == "cuda" else None
    if gpu is not None:
        torch.cuda.set_device(gpu)
    dist.init_process_group(
        backend(device),
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        device_id=gpu,
    )
    try:
        ids = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(1))
        ids = ids.to(device)
        reference = _toy_qwen2().to(device)
        plain = _gradient(reference, reference, ids)
        figures: dict[str, Any] = {"backend": backend(device)}
        for sharding, dtype in (("ddp", "float32"), ("fsdp2", "float32"), ("fsdp2", "bfloat16")):
            model = _toy_qwen2().to(device)
            world = World(rank=0, size=1, sharding=sharding, device=device, train_dtype=dtype)
            wrapped = parallel(model, world)
            grads = _gradient(model, wrapped, ids, bf16=dtype == "bfloat16")
            scale = max(float(g.abs().max()) for g in plain.values())
            gap = max(float((grads[k] - plain[k]).abs().max()) for k in plain) / scale
            figures[f"{sharding}_{dtype}_grad_gap"] = gap
    finally:
        dist.destroy_process_group()
    figures["gradients_equal"] = (
        max(figures["ddp_float32_grad_gap"], figures["fsdp2_float32_grad_gap"]) < 1e-6
    )
    return figures


def weight_sync(out: Path, small: bool) -> dict[str, Any]:
    """The ``large`` model streamed into a bfloat16 engine copy, three times, timed."""
    from transformers import AutoModelForCausalLM

    from rlmap.core.device import elapsed
    from rlmap.engines.hf import HFEngine

    directory = out / "large-model"
    if not directory.is_dir():
        large_model(directory, small)
    device = resolve("auto")
    policy = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(device)
    engine = HFEngine(policy, pad_token_id=0, eos_token_id=1, dtype=torch.bfloat16, own_copy=True)
    seconds = []
    for version in (1, 2, 3):
        with torch.no_grad():
            for param in policy.parameters():  # new weights each time
                param.add_(1e-3)
        started = time.perf_counter()
        engine.update_weights(policy, version)
        seconds.append(elapsed(started, device))
    copy = engine.model.state_dict()
    equal = all(torch.equal(copy[k], v.to(copy[k].dtype)) for k, v in policy.state_dict().items())
    return {
        "parameters": sum(p.numel() for p in policy.parameters()),
        "seconds_per_update": sorted(seconds)[1],
        "copy_equals_policy_in_bf16": equal,
    }


def vllm_sleep(out: Path, small: bool) -> dict[str, Any]:
    """Three sleep cycles of a level-2 vLLM engine (its CUDA build only): GiB freed by each
    sleep, greedy tokens before and after. Untried: no machine this ran on had the build."""
    import importlib.util

    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        return {"skipped": "needs vLLM's CUDA build and a GPU"}
    from transformers import AutoModelForCausalLM

    from rlmap.engines.vllm import VLLMEngine

    directory = out / "large-model"
    if not directory.is_dir():
        large_model(directory, small)
    policy = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to("cuda")
    engine = VLLMEngine(
        directory, policy, eos_token_id=1, dtype=torch.bfloat16, memory=0.3, sleep=2
    )

    def greedy() -> list[tuple[int, ...]]:
        rows = engine.generate(
            [[5, 6, 7], [8, 9]], n=1, max_new_tokens=16, temperature=0.0, top_p=1.0
        )
        return [c.response_ids for group in rows for c in group]

    before, freed, same = greedy(), [], []
    for version in (1, 2, 3):
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        freed.append((torch.cuda.mem_get_info()[0] - free_awake) / 2**30)
        engine.wake("weights")
        engine.update_weights(policy, version)
        engine.wake("kv_cache")
        same.append(greedy() == before)
    engine.close()
    return {"gib_freed_by_sleep": freed, "greedy_tokens_identical": all(same)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file of figures")
    parser.add_argument("--small", action="store_true", help="toy sizes (a CPU dry run)")
    args = parser.parse_args(argv)
    device = resolve("auto")
    versions = {"torch": torch.__version__, "python": sys.version.split()[0]}
    figures: dict[str, Any] = {"environment": describe(device) | versions}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, part in (
            ("tiny", tiny),
            ("audit", lambda o, s: audited(s)),
            ("large", large),
            ("resume", killed_and_resumed),
            ("data_parallel", data_parallel),
            ("weight_sync", weight_sync),
            ("vllm_sleep", vllm_sleep),
        ):
            started = time.perf_counter()
            try:
                figures[name] = part(Path(tmp), args.small)
            except Exception as exc:  # one part failing still writes the others' figures
                figures[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                failed.append(name)
            figures[name]["seconds"] = round(time.perf_counter() - started, 1)
            print(f"{name}: {json.dumps(figures[name])}", flush=True)
    checks = {
        "the ledger names the device": figures["tiny"].get("device") == str(device),
        "every tensor on it": figures["audit"].get("one_device") is True,
        "fp32 kappa below 1e-3": figures["tiny"].get("kappa_max_abs_log", 1) < 1e-3,
        "one-rank DDP and FSDP2 gradients equal one process's": figures["data_parallel"].get(
            "gradients_equal"
        )
        is True,
        "the streamed engine copy equals the policy": figures["weight_sync"].get(
            "copy_equals_policy_in_bf16"
        )
        is True,
    }
    if "skipped" not in figures["vllm_sleep"]:
        checks["greedy tokens identical across vLLM sleeps"] = (
            figures["vllm_sleep"].get("greedy_tokens_identical") is True
        )
    if not args.small:  # a 2-step toy run need not learn
        checks["held-out pass@1 up"] = figures["tiny"].get("pass@1_up") is True
    figures["checks"] = checks
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    for check, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {check}")
    return 1 if failed or not all(checks.values()) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
