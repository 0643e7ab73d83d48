"""``rlmap train --preflight``: every part of a run built and checked, nothing written.

A dry run before a long one. Each check returns one row of a go / no-go table:

- **inputs**: :func:`rlmap.assembly.checks.check_inputs`, the checks a run makes before its
  directory exists — every prompt against the model's context (the first too long is named
  ``file:line``), the model, the judge;
- **verifier**: every row's reference, as the run's verifier scores it through the run's own
  calling path (:func:`rlmap.assembly.environments.make_verifier`, isolated when the run
  isolates it, and :func:`rlmap.feedback.reward.verify_score`): the reference answer must
  score 1, and none of ``GARBAGE`` (nor the reference with one digit changed) may — a
  garbage answer that scores 1 is a gap in the specification, a reference that scores 0 a
  parser's error; a verifier that raises is named with its row, as a run would count it
  (``infra_error``).
  A reference that is a specification (unit tests, a schema, a pattern:
  ``Verifier.answers`` False) is only checked against garbage. Environments, judges and
  reward models have no reference: "n/a";
- **build**: :func:`rlmap.assembly.parts.build`, every live part of the run (the embedded
  warm start is built or read under ``$RLMAP_CACHE``, never the run directory);
- **memory**: what the learner keeps on its device through a step, activations aside
  (:func:`rlmap.learner.memory.resident_bytes`, ``bench/scaling.py``'s arithmetic), plus
  vLLM's share when it samples on the learner's GPU, against what was free before the
  learner came: on a GPU ``torch.cuda.mem_get_info``'s free plus this process's reserve; on
  a CPU the host's available memory (``MemAvailable``) plus the weights already loaded;
- **step**: one micro-batch of training rows with their reference answers as responses,
  forward and backward through the learner's scorer (:func:`rlmap.learner.logprobs.scored`,
  its autocast) — no optimiser step: the gradients are dropped and the weights unchanged.

Differs from a run: the verifier sees the reference, not sampled text, and the step's loss
is the responses' mean negative log-likelihood, not the recipe's objective (which needs a
rollout's advantages); both exercise the same code a run's first step does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlmap import feedback
from rlmap.assembly import checks
from rlmap.assembly.data import labelled_prompts, load_data
from rlmap.assembly.environments import make_verifier
from rlmap.assembly.models import model_path, reward_model_path
from rlmap.assembly.parts import Parts, build
from rlmap.core.errors import ConfigError, InputError, TrainingError, first_line
from rlmap.core.hf import context_length
from rlmap.feedback.isolation import Verify
from rlmap.feedback.reward import RewardStatus, verify_score
from rlmap.learner.logprobs import scored
from rlmap.learner.memory import GIB, autocast_to, resident_bytes
from rlmap.recipes.config import RecipeConfig
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.datafiles import load_labelled_examples
from rlmap.tasks.env import reference_for
from rlmap.tasks.prompts import encode_prompt, encode_response
from rlmap.tasks.registry import kind_of

GO, NO_GO, NA, SKIPPED = "go", "no-go", "n/a", "skipped"

GARBAGE = ("", "I don't know", "3.14159265358979")
"""Answers no reference should accept: nothing, a refusal, a number out of nowhere (with the
reference's first digit changed, :func:`garbage_for`)."""

SHOWN_ROWS = 10
"""Failing rows named in the verifier's figure (its problem is the first one's, in full)."""


@dataclass(frozen=True)
class Check:
    """One row of the table."""

    name: str
    verdict: str
    """``go``, ``no-go``, ``n/a`` (with why in ``figure``) or ``skipped`` (a check before
    it failed)."""
    figure: str = ""
    """What was measured, for a go; why, for an n/a."""
    problem: str = ""
    """The first problem, named (``file:line`` of a row); empty for a go."""
    seconds: float = 0.0


def preflight(cfg: RecipeConfig) -> list[Check]:
    """Every check of the module docstring, in order; a check that cannot run for want of
    the parts (their build failed) is ``skipped``."""
    if cfg.system.learners > 1:
        raise ConfigError("--preflight: not with system.learners > 1 yet; check with 1")
    rows = [
        timed("inputs", lambda: check_inputs(cfg)),
        timed("verifier", lambda: check_verifier(cfg)),
    ]
    built: list[Parts] = []
    rows.append(timed("build", lambda: check_build(cfg, built)))
    if not built:
        return [*rows, Check("memory", SKIPPED), Check("step", SKIPPED)]
    parts = built[0]
    rows.append(timed("memory", lambda: check_memory(parts)))
    rows.append(timed("step", lambda: check_step(parts)))
    return rows


def timed(name: str, check: Callable[[], Check]) -> Check:
    """``check()`` timed; a ConfigError or InputError (or a TrainingError) it raises is a
    no-go naming it."""
    started = time.perf_counter()
    try:
        row = check()
    except (ConfigError, InputError, TrainingError) as exc:
        row = Check(name, NO_GO, problem=first_line(exc))
    return Check(name, row.verdict, row.figure, row.problem, time.perf_counter() - started)


def check_inputs(cfg: RecipeConfig) -> Check:
    """The run's own input checks (every prompt against the context, the model, the judge)."""
    checks.check_inputs(cfg)
    return Check("inputs", GO, f"{len(labelled_prompts(cfg)):,} prompts fit the context")


def check_verifier(cfg: RecipeConfig) -> Check:
    """Every row's reference and ``GARBAGE`` through the run's verifier (module docstring)."""
    why = no_reference(cfg)
    if why is not None:
        return Check("verifier", NA, why)
    name = cfg.feedback.verifier
    entry, verify = feedback.registry.get(name), make_verifier(cfg, name)
    rows = labelled_examples(cfg)
    try:
        found = [
            (label, row_problem(verify, name, label, e, entry.items, entry.answers))
            for label, e in rows
        ]
    finally:
        close = getattr(verify, "close", None)  # an isolated verifier's worker
        if close is not None:
            close()
    failing = [(label, problem) for label, problem in found if problem]
    tried = "reference and garbage" if entry.answers else "garbage (the reference is a spec)"
    if not failing:
        return Check("verifier", GO, f"{len(rows):,} rows, {tried}, with {name}")
    labels = ", ".join(label for label, _ in failing[:SHOWN_ROWS])
    more = " …" if len(failing) > SHOWN_ROWS else ""
    figure = f"{len(failing):,} of {len(rows):,} rows fail: {labels}{more}"
    return Check("verifier", NO_GO, figure, failing[0][1])


def no_reference(cfg: RecipeConfig) -> str | None:
    """Why the run has no reference answers to check, or None when it has them."""
    if kind_of(cfg.data.task).own_reward:
        return f"data.task={cfg.data.task}: the environment's own reward, no reference"
    if cfg.feedback.source != "verifier":
        return f"feedback.source={cfg.feedback.source}: no reference answers"
    return None


def labelled_examples(cfg: RecipeConfig) -> list[tuple[str, Example]]:
    """Every train and held-out example, labelled as
    :func:`rlmap.assembly.data.labelled_prompts` labels its prompt (``file:line`` for a JSONL
    file)."""
    d = cfg.data
    if not kind_of(d.task).data_files:
        train, heldout = load_data(cfg)
        return [(f"data.task={d.task} example {i}", e) for i, e in enumerate([*train, *heldout])]
    sources = [d.task, *([d.eval_path] if d.eval_path is not None else [])]
    fields = (d.prompt_field, d.answer_field, d.answer_format)
    return [row for f in sources for row in load_labelled_examples(f, *fields)]


def row_problem(
    verify: Verify, name: str, label: str, example: Example, items: bool, answers: bool
) -> str:
    """The first problem of one row ('' for none): the verifier crashed or timed out, the
    reference answer (``answers``) does not score 1, or a garbage answer does."""
    reference = reference_for(example, items)
    tried = [(example.answer, True)] if answers else []
    for response, should_pass in [*tried, *((g, False) for g in garbage_for(example.answer))]:
        score = verify_score(verify, response, reference, name)
        if score.status in (RewardStatus.INFRA_ERROR, RewardStatus.TIMEOUT):
            return f"{label}: {name} crashed on the answer {clip(response)}: {score.reason}"
        passed = score.status == RewardStatus.OK and score.value >= 1.0
        if should_pass and not passed:
            return f"{label}: the reference {clip(response)} scores {score.value:g} with {name}"
        if passed and not should_pass:
            return f"{label}: the garbage answer {clip(response)} scores 1 with {name} (spec gap)"
    return ""


def garbage_for(answer: str) -> list[str]:
    """``GARBAGE`` and ``answer`` with its first digit changed (d → d+1 mod 10), those that
    differ from ``answer``."""
    digit = next((i for i, c in enumerate(answer) if c.isdigit()), None)
    changed = (
        []
        if digit is None
        else [answer[:digit] + str((int(answer[digit]) + 1) % 10) + answer[digit + 1 :]]
    )
    return [g for g in (*GARBAGE, *changed) if g.strip() != answer.strip()]


def clip(text: str, limit: int = 40) -> str:
    """``text`` quoted, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def check_build(cfg: RecipeConfig, built: list[Parts]) -> Check:
    """Every part of the run, appended to ``built``."""
    start = model_path(cfg)
    parts = build(cfg, start, reward_path=reward_model_path(cfg))
    built.append(parts)
    n = sum(p.numel() for p in parts.policy.parameters())
    return Check(
        "build",
        GO,
        f"policy of {n:,} parameters on {parts.device}, "
        f"{len(parts.train):,} train + {len(parts.heldout):,} held-out rows",
    )


def check_memory(parts: Parts) -> Check:
    """The learner's resident bytes per part (+ vLLM's share beside it) against the free."""
    models = {
        "policy": parts.policy,
        "reference": parts.reference,
        "critic": parts.critic,
        "reward model": parts.reward_model,
    }
    need, shares = 0, []
    seen: set[int] = set()
    for name, model in models.items():
        if model is None or id(model) in seen:  # LoRA: the reference is the policy itself
            continue
        seen.add(id(model))
        need += (share := resident_bytes([model]))
        shares.append(f"{name} {size(share)}")
    free, where, engine = free_bytes(parts.device, parts.cfg, held(models.values()))
    if engine:
        shares.append(f"vLLM {size(engine)}")
    figure = f"{', '.join(shares)}: {size(need + engine)} of {size(free)} {where}"
    if need + engine > free:
        return Check(
            "memory",
            NO_GO,
            figure,
            f"{size(need + engine)} needed (activations aside) > {size(free)} {where}",
        )
    return Check("memory", GO, figure + " (activations aside)")


def held(models: Any) -> int:
    """Bytes of the parameters already loaded (each counted once)."""
    params = {id(p): p for m in models if m is not None for p in m.parameters()}.values()
    return sum(p.numel() * p.element_size() for p in params)


def free_bytes(device: torch.device, cfg: RecipeConfig, loaded: int) -> tuple[int, str, int]:
    """(bytes free before the learner came, where, vLLM's share of them): a GPU's free plus
    this process's reserve; the host's available memory plus the ``loaded`` weights."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        engine = int(cfg.system.engine_memory * total) if cfg.system.engine == "vllm" else 0
        return free + torch.cuda.memory_reserved(device), f"free on {device}", engine
    return host_available() + loaded, "available on the host", 0


def host_available() -> int:
    """The host's available memory: Linux's ``MemAvailable`` (free plus the page cache it can
    drop), else the free pages (``os.sysconf``), which undercounts."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def size(n: float) -> str:
    """Bytes as MiB below a GiB, else GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def check_step(parts: Parts) -> Check:
    """One micro-batch forward and backward; the weights untouched (module docstring)."""
    tokens_BT, attention_BT, response_BT = micro_batch(parts)
    model, s = parts.trained, parts.settings
    with autocast_to(parts.policy, s.train_dtype):
        logprobs_BT, _ = scored(model, tokens_BT, attention_BT, temperature=s.temperature)
    loss = -(logprobs_BT * response_BT).sum() / response_BT.sum().clamp(min=1)
    loss.backward()
    grads = [p.grad for p in parts.policy.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    parts.policy.zero_grad(set_to_none=True)
    b, t = tokens_BT.shape
    figure = f"{b}×{t} tokens: NLL {loss.item():.3f}, grad norm {norm.item():.3g}"
    if not grads or not torch.isfinite(loss) or not torch.isfinite(norm):
        return Check("step", NO_GO, figure, "the loss or its gradient is not finite")
    return Check("step", GO, figure)


def micro_batch(parts: Parts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, attention, response mask), each (B, T): the first ``micro_batch_size`` train
    rows, prompt then reference answer, right-padded, cut to the model's context."""
    tok, rows = parts.tokenizer, parts.train[: parts.settings.schedule.micro_batch_size]
    if not rows:
        raise InputError("data: no training rows for a micro-batch")
    pairs = [(encode_prompt(tok, e.chat), encode_response(tok, e.answer)) for e in rows]
    context = context_length(getattr(parts.policy, "config", None)) or 1 << 30
    t = min(context, max(len(p) + len(r) for p, r in pairs))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tokens = torch.full((len(rows), t), int(pad), dtype=torch.long)
    attention = torch.zeros((len(rows), t), dtype=torch.bool)
    response = torch.zeros((len(rows), t))
    for i, (p, r) in enumerate(pairs):
        ids = (p + r)[:t]
        tokens[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = True
        response[i, len(p) : len(ids)] = 1.0
    device = parts.device
    return tokens.to(device), attention.to(device), response.to(device)


def table(rows: list[Check]) -> str:
    """The rows as aligned text, then the verdict line: ``go``, or ``no-go`` and the first
    problem."""
    head = ("check", "verdict", "seconds", "figure")
    cells = [head, *[(r.name, r.verdict, f"{r.seconds:.1f}", r.figure) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3] for c in cells]
    lines += [f"  {r.name}: {r.problem}" for r in rows if r.problem]
    first = next((r for r in rows if r.verdict == NO_GO), None)
    lines.append(
        "preflight: go" if first is None else f"preflight: no-go: {first.name}: {first.problem}"
    )
    return "\n".join(lines)


def went(rows: list[Check]) -> bool:
    """Whether no check said no-go."""
    return all(r.verdict != NO_GO for r in rows)
