"""Warm start for the embedded default: SFT of the tiny model on noisy demonstrations.

RL sharpens what a model can already sample; it does not teach arithmetic from
scratch in CPU-minutes. So the embedded default starts from a supervised model,
trained in two phases: first on correct demonstrations until it has learned the
algorithm (held-out pass@1 ≈ 0.8 for 2-digit addition), then briefly on
demonstrations whose last answer digit is replaced, with probability ``noise``,
by a uniformly random digit. The second phase blurs the answer distribution
without erasing the algorithm: pass@1 drops well below pass@8, the regime where
RL on a verifier helps (it moves pass@1 toward pass@k). Noise from the start
would slow learning the algorithm itself several-fold (measured: held-out pass@1
0.08 vs 0.62 after 500 steps).

For the calculator task (:mod:`rlmap.tasks.calculator`) a fraction ``tool_demos`` of
the demonstrations calls the tool before answering (the observation tokens are not
trained on); the rest answer directly. The tiny model cannot multiply reliably, so
it starts able to call the tool sometimes and right mostly when it does: the
regime where RL raises the tool-call rate and the success rate with it.

The result is cached by a content hash of everything that determines it
(task, model spec, SFT settings, the whole tokenizer and this module's
format version), under ``$RLMAP_CACHE`` (default ``~/.cache/rlmap``), written
atomically, so a rerun or a second run reuses it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import string
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlmap.embedded.tiny import TinySpec, build_tiny_model
from rlmap.embedded.tokenizer import CHARACTERS, build_bpe_tokenizer, build_tokenizer
from rlmap.learner.supervised import fit
from rlmap.tasks.arithmetic import Example, make_splits
from rlmap.tasks.calculator import demonstration, prompt_tools, tool_call_text
from rlmap.tasks.kind import Split
from rlmap.tasks.prompts import encode_prompt, encode_response
from rlmap.tasks.registry import kind_of

FORMAT_VERSION = 2
"""Bump when the warm-start procedure changes, so old cache entries are not reused."""


@dataclass(frozen=True)
class WarmStartSpec:
    """Everything that determines the warm-start checkpoint."""

    task: str = "arithmetic"
    """``arithmetic``, ``calculator`` (its tokenizer has the tool markers) or a reasoning-gym
    task (``reasoning_gym:NAME``: its tokenizer has every printable ASCII character)."""
    task_args: str = "{}"
    """A reasoning-gym task's generator settings (``data.task_args``), as JSON."""
    tool_demos: float = 0.0
    """Calculator: fraction of demonstrations that call the tool before answering."""
    seed: int = 0
    """Seed of the model initialisation and of the demonstration stream."""
    split_seed: int = 0
    """The task's train/held-out split (``data.split_seed``): demonstrations come only from
    the train part, so held-out prompts stay unseen by the warm start too."""
    eval_size: int = 256
    train_size: int = 6000
    max_digits: int = 2
    ops: str = "+"
    steps: int = 800
    """Steps on correct demonstrations (one-cycle schedule, peak ``lr``)."""
    batch_size: int = 128
    lr: float = 3e-3
    blur_steps: int = 100
    """Steps on noisy demonstrations afterwards (constant ``blur_lr``)."""
    blur_lr: float = 1e-3
    noise: float = 0.6
    """Probability that a blur-phase demonstration's last digit is replaced by a random digit."""
    model: TinySpec = field(default_factory=TinySpec)
    demonstrations: int = 0
    """The version of the task kind's demonstrations (its ``warm_start`` hook sets one when
    they change, so that older checkpoints are not reused; 0: the first, left out of the
    digest)."""
    chat: bool = False
    """A chat model (``embedded:tiny-chat``): the byte-level BPE tokenizer with the ChatML
    template (:func:`chat_tokenizer`), prompts and tool calls in that format."""

    def digest(self) -> str:
        """Content hash of the spec, the whole tokenizer (vocabulary, pre- and post-processing,
        chat template) and the procedure's version."""
        tokenizer = spec_tokenizer(self)
        rules = tokenizer.backend_tokenizer.to_str()  # vocab and rules
        spec = asdict(self)
        payload = {"spec": spec, "tokenizer": rules, "format": FORMAT_VERSION}
        if self.chat:
            payload["template"] = tokenizer.chat_template
        else:  # the digest it had before chat models: caches stay valid
            del spec["chat"]
        if not self.demonstrations:  # the digest it had before versions: caches stay valid
            del spec["demonstrations"]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def task_tokenizer(
    task: str, *, chat: bool = False, task_args: str = "{}", split: tuple[int, int] = (0, 256)
) -> PreTrainedTokenizerFast:
    """The embedded tokenizer of a task: the calculator's has the tool markers; a
    reasoning-gym task's has every printable ASCII character (its questions are prose);
    ``chat``: the chat model's BPE tokenizer, trained on the task's training text as well
    on a reasoning-gym task (``task_args``: its settings, as JSON; ``split``: the run's
    ``data.split_seed`` and ``data.eval_size``, whose held-out questions it never sees)."""
    kind = kind_of(task)
    if chat:
        if kind.chat_corpus is not None:
            return copy.deepcopy(_chat_tokenizer(task, task_args, split))
        return chat_tokenizer()
    if kind.prose:
        return build_tokenizer(characters=PRINTABLE)
    return build_tokenizer(extra_tokens=kind.tool_tokens)


CHAT_VOCAB = 512
"""The chat model's vocabulary at most: the 256 bytes, 3 special tokens, the rest merges
(its corpus, pre-tokenized as Qwen2 does, digits one by one, has 320 tokens' worth)."""


def spec_tokenizer(spec: WarmStartSpec) -> PreTrainedTokenizerFast:
    """The tokenizer of the warm start ``spec`` describes (:func:`task_tokenizer`)."""
    split = (spec.split_seed, spec.eval_size)
    return task_tokenizer(spec.task, chat=spec.chat, task_args=spec.task_args, split=split)


TASK_TEXTS = 2000
"""Training items of a reasoning-gym task whose text the chat tokenizer learns too: the
run's first ones (its split's), never a held-out one."""


@lru_cache(maxsize=4)
def _chat_tokenizer(
    task: str = "", task_args: str = "{}", split: tuple[int, int] = (0, 256)
) -> PreTrainedTokenizerFast:
    return build_bpe_tokenizer(chat_corpus(task, task_args, split), vocab_size=CHAT_VOCAB)


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """The embedded chat model's tokenizer: byte-level BPE trained here on
    :func:`chat_corpus` (deterministic), with the ChatML template; a copy each call."""
    return copy.deepcopy(_chat_tokenizer())


def chat_corpus(
    task: str = "", task_args: str = "{}", split: tuple[int, int] = (0, 256)
) -> list[str]:
    """What the chat tokenizer is trained on: the built-in tasks' text as a chat model sees
    it — arithmetic prompts and answers, calculator calls in ``<tool_call>`` JSON, the
    template's turns — from seed 0's problems (any split: only the vocabulary is learned);
    with a ``task`` whose kind has a corpus (reasoning-gym's), its first ``TASK_TEXTS``
    training questions and answers of the run's ``split`` too (so its prose costs a token a
    word, not one a byte)."""
    problems, _ = make_splits(0, 2000, 0, max_digits=2, ops="+-*")
    texts = ["<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>tool\n"]
    for e in problems:
        texts += [e.prompt, e.answer, tool_call_text(e.prompt.removesuffix("="))]
    if task:
        corpus = kind_of(task).chat_corpus
        assert corpus is not None  # task_tokenizer asks only for a kind with one
        (split_seed, eval_size), args = split, json.loads(task_args)
        texts += corpus(Split(task, args, split_seed, TASK_TEXTS, eval_size))
    return texts


PRINTABLE = CHARACTERS + "".join(
    c for c in string.printable if c not in CHARACTERS + "\t\r\x0b\x0c"
)
"""The embedded characters, then the rest of printable ASCII and the newline."""


def demonstrations(spec: WarmStartSpec) -> list[Example]:
    """The examples the warm start imitates: the task kind's demonstrations from the train
    split (never held-out ones); the arithmetic problems for most kinds, none for a gym
    task (nothing to imitate: it starts from the initialisation)."""
    split = Split(
        spec.task,
        json.loads(spec.task_args),
        spec.split_seed,
        spec.train_size,
        spec.eval_size,
        max_digits=spec.max_digits,
        ops=spec.ops,
    )
    return kind_of(spec.task).demonstrations(split)


def cache_root() -> Path:
    """``$RLMAP_CACHE`` or ``~/.cache/rlmap``."""
    return Path(os.environ.get("RLMAP_CACHE", Path.home() / ".cache" / "rlmap"))


def warm_start(
    spec: WarmStartSpec, *, progress: Callable[[int, int, float], None] | None = None
) -> Path:
    """The warm-start checkpoint directory, trained now only if not cached yet."""
    final = cache_root() / "warmstart" / spec.digest()
    if (final / "config.json").exists():
        return final
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = spec_tokenizer(spec)
    model = supervised_finetune(spec, tokenizer, progress=progress)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "warmstart.json").write_text(json.dumps(asdict(spec), indent=2))
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, final)
    except OSError:  # another process finished first; its checkpoint is the same
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def noisy_answer(answer: str, noise: float, rng: random.Random) -> str:
    """With probability ``noise``, the answer with its last digit drawn uniformly (0-9); an
    answer that does not end in a digit is kept."""
    if rng.random() < noise and answer[-1:].isdigit():
        return answer[:-1] + str(rng.randrange(10))
    return answer


def supervised_finetune(
    spec: WarmStartSpec,
    tokenizer: PreTrainedTokenizerFast,
    *,
    progress: Callable[[int, int, float], None] | None = None,
) -> PreTrainedModel:
    """Train a fresh tiny model: correct demonstrations, then noisy ones (see module doc)."""
    train = demonstrations(spec)
    rng = random.Random(spec.seed)
    total = spec.steps + spec.blur_steps
    with torch.random.fork_rng(devices=[]):  # the warm start runs on the CPU (bit-reproducible)
        torch.manual_seed(spec.seed)
        model = build_tiny_model(tokenizer, spec.model, spec.seed)
        net: torch.nn.Module = model  # called as a plain module (typing of HF's __call__)
        net.train()
        learn = torch.optim.AdamW(net.parameters(), lr=spec.lr)
        one_cycle = torch.optim.lr_scheduler.OneCycleLR(  # a gym task has no steps at all
            learn, max_lr=spec.lr, total_steps=max(spec.steps, 1), pct_start=0.1
        )
        blur = torch.optim.AdamW(net.parameters(), lr=spec.blur_lr)

        def loss_of(noise: float) -> Callable[[int], torch.Tensor]:
            def loss(step: int) -> torch.Tensor:
                examples = (
                    rng.sample(train, spec.batch_size)
                    if len(train) >= spec.batch_size
                    else rng.choices(train, k=spec.batch_size)
                )
                ids, attention, labels = sft_batch(
                    tokenizer, examples, noise, rng, tool_demos=spec.tool_demos
                )
                return net(input_ids=ids, attention_mask=attention, labels=labels).loss

            return loss

        def done(offset: int) -> Callable[[int, float], None] | None:
            return None if progress is None else lambda s, loss: progress(offset + s, total, loss)

        fit(net, learn, spec.steps, loss_of(0.0), schedule=one_cycle, progress=done(0))
        fit(net, blur, spec.blur_steps, loss_of(spec.noise), progress=done(spec.steps))
    return model


def sft_batch(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    noise: float,
    rng: random.Random,
    *,
    tool_demos: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, labels) right-padded; labels are -100 except on the
    demonstrated actions (never on the prompt, observations or padding).

    With ``tool_demos`` > 0 each demonstration calls the calculator with that probability.
    """
    rows = []
    tools = prompt_tools(tokenizer) if tool_demos > 0 else ()  # as the environment shows them
    for e in examples:
        prompt = encode_prompt(tokenizer, e.chat, tools)
        prompt += tokenizer.encode(e.lead, add_special_tokens=False) if e.lead else []
        answer = noisy_answer(e.answer, noise, rng)
        if tool_demos > 0:
            segments = demonstration(tokenizer, e, answer, use_tool=rng.random() < tool_demos)
        else:
            segments = [(encode_response(tokenizer, answer), True)]
        row, targets = list(prompt), [-100] * len(prompt)
        for part, trained in segments:
            row += part
            targets += part if trained else [-100] * len(part)
        rows.append((row, targets))
    width = max(len(row) for row, _ in rows)
    pad = int(tokenizer.pad_token_id)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in rows])
    return ids, attention, labels
