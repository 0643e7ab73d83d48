"""A small generative judge of the embedded task, that any OpenAI-compatible server can
serve (``vllm serve``): fine-tuned from a causal LM to say whether an answer is right.

It reads the embedded judge templates (``feedback.judge_template=embedded``), short enough
for the embedded model's 64 positions. The response comes first and the task last, so the
judge works the task out as its base model learnt to (after the ``=``), then compares:

- pointwise ``{response}?{prompt}`` → the sum, ``:``, then ``1`` (correct) or ``0``:
  ``19?12+7=`` → ``19:1``;
- pairwise ``{first},{second}?{prompt}`` → the sum, ``:``, then ``a`` (the first is
  correct) or ``b``: ``18,19?12+7=`` → ``19:b``.

Its training examples come from the task's training prompts, each answer correct or one of
the plausible wrong kinds of :func:`rlmap.learned.preferences.wrong_answer` (or, for a tenth,
no number at all: what an untrained policy writes); pairwise examples put one correct and
one wrong answer in a random order. Held-out accuracy is measured on held-out prompts, by
the verdict that the judge rewards read in its greedy reply, before and after.

The saved directory has a chat template that joins the messages after ``<bos>`` (the
tokenizer adds no ``<bos>`` of its own to chat prompts), so ``/v1/chat/completions`` sends
the model exactly the text it was trained on, and plain ``transformers`` loads it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from rlmap.embedded.tokenizer import restore_bos
from rlmap.embedded.warmstart import sft_batch
from rlmap.feedback.judge_text import EMBEDDED_PAIRWISE as PAIRWISE
from rlmap.feedback.judge_text import EMBEDDED_POINTWISE as POINTWISE
from rlmap.feedback.judge_text import parse_choice, parse_score
from rlmap.learned.preferences import wrong_answer
from rlmap.learner.supervised import fit
from rlmap.tasks.arithmetic import Example

CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
"""Every message's text after ``<bos>``: the embedded judge's prompt, as it was trained."""
GARBAGE = 0.1
"""Fraction of wrong answers that are no number at all."""


@dataclass(frozen=True)
class JudgeModelSpec:
    """Everything that determines the embedded judge besides its base model."""

    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-4
    """As the embedded reward model's (a 1e-3 peak left it at 0.59 held-out accuracy)."""
    seed: int = 0
    pairwise: float = 0.5
    """Fraction of training examples that are pairwise."""
    heldout: int = 512
    """Held-out examples of each mode, from held-out prompts."""


def judge_example(e: Example, rng: random.Random, pairwise: bool) -> Example:
    """One training (or held-out) example of the judge for the task example ``e``."""
    wrong = _wrong(e.answer, rng)
    if pairwise:
        first_correct = rng.random() < 0.5
        first, second = (e.answer, wrong) if first_correct else (wrong, e.answer)
        return Example(
            PAIRWISE.format(prompt=e.prompt, first=first, second=second),
            f"{e.answer}:{'a' if first_correct else 'b'}",
        )
    correct = rng.random() < 0.5
    response = e.answer if correct else wrong
    return Example(
        POINTWISE.format(prompt=e.prompt, response=response), f"{e.answer}:{1 if correct else 0}"
    )


def _wrong(answer: str, rng: random.Random) -> str:
    if rng.random() < GARBAGE:  # no number: what an untrained policy writes
        return "".join(rng.choice("+-*=() ") for _ in range(rng.randint(0, 4)))
    return wrong_answer(answer, rng)


def judge_examples(task: Sequence[Example], n: int, pairwise: float, seed: int) -> list[Example]:
    """``n`` judge examples over ``task`` (cycled), a fraction ``pairwise`` of them pairwise."""
    rng = random.Random(seed)
    return [judge_example(task[k % len(task)], rng, rng.random() < pairwise) for k in range(n)]


@torch.no_grad()
def accuracy(model: PreTrainedModel, tokenizer: Tokenizer, examples: Sequence[Example]) -> float:
    """Share of ``examples`` whose greedy reply says what the target says, as the judge
    reward reads it (:func:`verdict`)."""
    model.eval()
    hits = 0
    pad = int(tokenizer.pad_token_id)
    for start in range(0, len(examples), 64):
        chunk = examples[start : start + 64]
        rows = [tokenizer.encode(e.prompt) for e in chunk]
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # left-padded
        ids = ids.to(next(model.parameters()).device)
        mask = (ids != pad).long()
        generate: Any = model.generate  # transformers' typing of generate differs by release
        out = generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=int(tokenizer.eos_token_id),
        )
        replies = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        for reply, e in zip(replies, chunk, strict=True):
            said, meant = verdict(reply), verdict(e.answer)
            hits += meant is not None and said == meant
    return hits / len(examples)


def verdict(reply: str) -> float | None:
    """What rlmap's judge reward reads in an embedded judge's reply: the pointwise rating
    in [0, 1] (``19:1`` → 1), or the pairwise choice (``19:b`` → 1), None if neither."""
    if reply.strip()[-1:] in ("a", "b"):
        return parse_choice(reply)
    return parse_score(reply, 0.0, 1.0)


def train_judge(
    base: Path,
    train_task: Sequence[Example],
    heldout_task: Sequence[Example],
    spec: JudgeModelSpec,
    *,
    progress: Callable[[int, int, float], None] | None = None,
    device: torch.device | None = None,
) -> tuple[PreTrainedModel, Tokenizer, dict[str, float]]:
    """Fine-tune the causal LM at ``base`` into the judge on ``device`` (None: the CPU); its
    held-out accuracies, pointwise and pairwise, before and after
    (``judge/heldout_{pointwise,pairwise}_accuracy[_before]``)."""
    tokenizer = restore_bos(AutoTokenizer.from_pretrained(base))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if device is not None:
        torch.nn.Module.to(model, device)  # in place
    held = {
        mode: judge_examples(heldout_task, spec.heldout, float(mode == "pairwise"), spec.seed + 1)
        for mode in ("pointwise", "pairwise")
    }
    metrics = {
        f"judge/heldout_{m}_accuracy_before": accuracy(model, tokenizer, e) for m, e in held.items()
    }
    train = judge_examples(train_task, spec.steps * spec.batch_size, spec.pairwise, spec.seed)
    rng = random.Random(spec.seed)
    with torch.random.fork_rng(devices=[]):  # on the CPU: no CUDA state to save (or start)
        torch.manual_seed(spec.seed)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=spec.lr, total_steps=spec.steps, pct_start=0.1
        )

        def loss_of(step: int) -> torch.Tensor:
            chunk = train[step * spec.batch_size : (step + 1) * spec.batch_size]
            ids, attention, labels = (
                t.to(model.device) for t in sft_batch(tokenizer, chunk, 0.0, rng)
            )
            return model(input_ids=ids, attention_mask=attention, labels=labels).loss

        shown = None if progress is None else lambda s, loss: progress(s, spec.steps, loss)
        fit(model, optimizer, spec.steps, loss_of, schedule=schedule, progress=shown)
    metrics |= {
        f"judge/heldout_{m}_accuracy": accuracy(model, tokenizer, e) for m, e in held.items()
    }
    return model, tokenizer, metrics


def save_judge(
    out: Path, model: PreTrainedModel, tokenizer: Tokenizer, info: dict[str, object]
) -> None:
    """The judge in Hugging Face format, with its chat template, and ``judge.json``."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "judge.json").write_text(json.dumps(info, indent=2, default=str))
