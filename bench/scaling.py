"""Memory of each part of an rlmap training setup, and what crosses the network per step.

Parameters are *counted*, not looked up: each model is built on the meta device (no memory,
no download) from its published architecture, and its tensors' ``numel`` summed; LoRA's
trainable parameters are counted from the shapes of the targeted ``nn.Linear`` modules,
the critic's by building ``AutoModelForTokenClassification`` the same way. Every figure
is then bytes per element × elements, in GiB (2^30 bytes). Two are estimates, and are
printed as such: activation memory (a published formula, not a measurement) and the
transient buffers of FSDP2 and autocast (what their documented behaviour implies).

    python bench/scaling.py                       # Qwen2.5-0.5B, 7B and 32B
    python bench/scaling.py --models 7B 32B
    python bench/scaling.py --tiny                # a 2-layer toy config, for the smoke test

The figures in docs/scaling.md come from the first command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, Qwen2Config

from rlmap.learner.logprobs import LOGPROB_CHUNK
from rlmap.learner.memory import learner_bytes  # the trainer's own check uses the same bytes

# Architecture numbers from each model's published config.json on the Hugging Face Hub
# (Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-7B, Qwen/Qwen2.5-32B). Head dim = hidden / heads
# (64, 128, 128); Qwen2 puts biases on q, k, v only. The embedding of 7B and 32B is padded
# to 152,064 rows, the small models' to 151,936; the tokenizer has 151,665 tokens.
MODELS: dict[str, dict[str, Any]] = {
    "0.5B": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151_936,
        tie_word_embeddings=True,
    ),
    "7B": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152_064,
        tie_word_embeddings=False,
    ),
    "32B": dict(
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152_064,
        tie_word_embeddings=False,
    ),
}
TINY: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    tie_word_embeddings=True,
)

GIB = 2**30
RANKS = (1, 8, 16, 32, 64)
LORA_RANKS = (8, 64)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MICRO_BATCH = 8  # rows per learner micro-batch
LENGTHS = (1024, 4096)  # T, tokens per row
ENGINE_SEQS, ENGINE_TOKENS = 256, 2048  # sequences in flight in one rollout engine × length
STEP_TRAJECTORIES, STEP_TOKENS = 512, 1024  # one step's global batch
GPUS = {"80 GB": 80, "141 GB": 141}
HEADROOM = 0.9  # a setup "fits" below 90 % of nominal: CUDA context, NCCL, fragmentation

# Activation bytes per token per layer, Korthikanti et al. 2022, "Reducing Activation
# Recomputation in Large Transformer Models", eq. (1): s·b·h·(34 + 5·a·s/h) per layer with
# 16-bit activations and no tensor parallelism. Flash/SDPA attention never stores the
# a·s² score matrix, so the 5·a·s/h term is dropped: 34·h bytes per token per layer.
ACT_BYTES_PER_H = 34
# With full recomputation (gradient checkpointing) only each layer's input is kept:
# 2·h bytes per token per layer, plus one layer's full activations while it is recomputed.
CKPT_BYTES_PER_H = 2


@dataclass(frozen=True)
class Counts:
    """Exact element counts of one model, from its meta-device build."""

    name: str
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    total: int  # every parameter once (tied embeddings counted once)
    embedding: int
    head: int  # the LM head's own weight; 0 when tied to the embedding
    layer: int  # one decoder layer
    critic: int  # AutoModelForTokenClassification with one label: trunk + scalar head
    lora: dict[int, int]  # LoRA rank -> trainable parameters

    @property
    def root(self) -> int:
        """What FSDP2's root unit holds when each decoder layer is its own unit."""
        return self.total - self.layers * self.layer


def count(name: str, kwargs: dict[str, Any]) -> Counts:
    config, critic_config = Qwen2Config(**kwargs), Qwen2Config(**kwargs)
    critic_config.num_labels = 1  # a scalar value head, as rlmap.learner.critic builds it
    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(config)
        critic = AutoModelForTokenClassification.from_config(critic_config)
    lora = {
        r: sum(
            r * (m.in_features + m.out_features)
            for path, m in policy.named_modules()
            if isinstance(m, nn.Linear) and path.rsplit(".", 1)[-1] in LORA_TARGETS
        )
        for r in LORA_RANKS
    }
    head_dim = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    tied = kwargs["tie_word_embeddings"]
    return Counts(
        name=name,
        hidden=kwargs["hidden_size"],
        layers=kwargs["num_hidden_layers"],
        kv_heads=kwargs["num_key_value_heads"],
        head_dim=head_dim,
        vocab=kwargs["vocab_size"],
        total=sum(p.numel() for p in policy.parameters()),
        embedding=policy.get_input_embeddings().weight.numel(),
        head=0 if tied else policy.get_output_embeddings().weight.numel(),
        layer=sum(p.numel() for p in policy.model.layers[0].parameters()),
        critic=sum(p.numel() for p in critic.parameters()),
        lora=lora,
    )


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f}"


def size(n_bytes: float) -> str:
    """GiB, or MiB below 1 GiB, with the unit."""
    return f"{n_bytes / GIB:.2f} GiB" if n_bytes >= GIB else f"{n_bytes / 2**20:.1f} MiB"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Plain text, first column left-aligned, the others right-aligned."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parameters_section(c: Counts) -> str:
    head = " (tied: also the LM head)" if c.head == 0 else f" + LM head {c.head:,}"
    return (
        f"parameters (exact, meta device): {c.total:,}\n"
        f"  = embedding {c.embedding:,}{head} + {c.layers} layers × {c.layer:,}"
        f" + final norm {c.root - c.embedding - c.head:,}\n"
        f"critic (PPO, token-classification head, exact): {c.critic:,}"
    )


def state_section(c: Counts) -> str:
    p = c.total
    rows = [
        ("weights bf16", 2, gib(2 * p)),
        ("weights fp32", 4, gib(4 * p)),
        ("gradients fp32", 4, gib(4 * p)),
        ("AdamW moments m, v (2 × fp32)", 8, gib(8 * p)),
        ("full FT fp32: weights + grads + AdamW", 16, gib(learner_bytes(p, 0))),
        ("bf16 autocast: fp32 master weights + grads + AdamW", 16, gib(learner_bytes(p, 0))),
        ("  + autocast's bf16 weight copies (estimate, transient)", 2, gib(2 * p)),
        ("reference policy, frozen bf16 copy (no LoRA)", 2, gib(2 * p)),
        ("critic (PPO), full FT, 16 B/param of the critic", 16, gib(learner_bytes(c.critic, 0))),
    ]
    return "learner state, one replica (computed)\n" + table(("part", "B/param", "GiB"), rows)


def sharding_section(c: Counts) -> str:
    rows = [
        ("DDP: policy weights + grads + AdamW", *(gib(learner_bytes(c.total, 0)) for _ in RANKS)),
        (
            "FSDP2: policy weights + grads + AdamW",
            *(gib(learner_bytes(c.total, 0, shards=n)) for n in RANKS),
        ),
        # set_requires_gradient_sync(False) keeps each parameter's unsharded gradient
        # (FSDPParam.unsharded_accumulated_grad, in the reduce dtype) until the sync.
        ("  + FSDP2 sync deferred over micro-batches", *(gib(4 * c.total) for _ in RANKS)),
        ("FSDP2: reference, frozen bf16", *(gib(2 * c.total / n) for n in RANKS)),
        (
            "FSDP2: critic weights + grads + AdamW",
            *(gib(learner_bytes(c.critic, 0, shards=n)) for n in RANKS),
        ),
    ]
    headers = ("GiB per rank (computed), N ranks =", *(str(n) for n in RANKS))
    return table(headers, rows)


def lora_section(c: Counts) -> str:
    rows = []
    for r, n in c.lora.items():
        trained, frozen = 16 * n, 2 * c.total
        rows.append(
            (
                f"r = {r}",
                f"{n:,}",
                f"{100 * n / c.total:.2f}",
                gib(trained),
                gib(frozen),
                gib(trained + frozen),
                "0",
            )
        )
    headers = (
        "LoRA on q,k,v,o,gate,up,down",
        "trainable",
        "% of all",
        "adapter+grad+AdamW",
        "frozen base bf16",
        "total GiB",
        "reference extra",
    )
    return "LoRA (computed; GiB; the reference is the base with adapters disabled)\n" + table(
        headers, rows
    )


def logprob_bytes(c: Counts, tokens: int, *, chunked: bool, head_trained: bool = True) -> int:
    """Working memory of one log-prob forward + backward over ``tokens`` positions.

    Full: fp32 logits (tokens × V) and their gradient as much again. Chunked
    (``rlmap.learner.logprobs.ChunkedLogprobs``): at most two chunk × V fp32 buffers, plus a
    V × H fp32 accumulator for the LM head's gradient when the head is trained.
    """
    if not chunked:
        return 2 * tokens * c.vocab * 4
    return 2 * LOGPROB_CHUNK * c.vocab * 4 + (c.vocab * c.hidden * 4 if head_trained else 0)


def logprob_section(c: Counts) -> str:
    rows = []
    for t in LENGTHS:
        n = MICRO_BATCH * t
        full, chunked = logprob_bytes(c, n, chunked=False), logprob_bytes(c, n, chunked=True)
        frozen = logprob_bytes(c, n, chunked=True, head_trained=False)
        rows.append(
            (
                f"B = {MICRO_BATCH}, T = {t:,}",
                gib(full),
                gib(chunked),
                gib(frozen),
                f"{chunked / full:.3f}",
            )
        )
    headers = (
        "micro-batch",
        "full logits+grad",
        f"chunked ({LOGPROB_CHUNK} tokens)",
        "chunked, frozen head (LoRA)",
        "chunked / full",
    )
    return f"log-prob working memory (computed; GiB; V = {c.vocab:,})\n" + table(headers, rows)


def activation_bytes(c: Counts, tokens: int, *, checkpointing: bool, width: int = 2) -> float:
    """Estimate: Korthikanti et al. 2022 eq. (1) without the attention-score term.

    ``width`` 2 for bf16 activations, 4 for fp32 (doubling every stored tensor).
    """
    per_layer = ACT_BYTES_PER_H * c.hidden * tokens * width / 2
    if not checkpointing:
        return c.layers * per_layer
    return c.layers * CKPT_BYTES_PER_H * c.hidden * tokens * width / 2 + per_layer


def activation_section(c: Counts) -> str:
    rows = []
    for t in LENGTHS:
        n = MICRO_BATCH * t
        rows.append(
            (
                f"B = {MICRO_BATCH}, T = {t:,}",
                gib(activation_bytes(c, n, checkpointing=False)),
                gib(activation_bytes(c, n, checkpointing=True)),
                gib(activation_bytes(c, n, checkpointing=False, width=4)),
            )
        )
    headers = ("micro-batch", "bf16, no checkpointing", "bf16, checkpointing", "fp32, none")
    return (
        "activations (ESTIMATE; GiB): 34·h B/token/layer without recomputation, "
        "2·h with full checkpointing + one layer recomputed\n"
        "  (Korthikanti et al. 2022 eq. 1, attention scores dropped: flash/SDPA; "
        "fp32 doubles it)\n" + table(headers, rows)
    )


def kv_bytes_per_token(c: Counts) -> int:
    return 2 * c.layers * c.kv_heads * c.head_dim * 2  # K and V, bf16


def engine_section(c: Counts) -> str:
    kv = kv_bytes_per_token(c)
    cache = kv * ENGINE_SEQS * ENGINE_TOKENS
    need = 2 * c.total + cache
    tp = {
        gpu: next((n for n in (1, 2, 4, 8) if need / n <= HEADROOM * cap * GIB), "> 8")
        for gpu, cap in GPUS.items()
    }
    rows = [
        ("weights bf16", size(2 * c.total)),
        ("KV cache per token (2·layers·kv_heads·head_dim·2 B)", f"{kv:,} B"),
        (f"KV cache, {ENGINE_SEQS} sequences × {ENGINE_TOKENS:,} tokens", size(cache)),
        ("weights + that KV cache", size(need)),
        *(
            (f"tensor-parallel {gpu} GPUs it needs (90 %, vLLM's default)", str(n))
            for gpu, n in tp.items()
        ),
    ]
    return "rollout engine, one vLLM replica (computed)\n" + table(("part", "size"), rows)


def network_section(c: Counts) -> str:
    traj = STEP_TRAJECTORIES * STEP_TOKENS
    once = [
        ("weights to each rollout engine, bf16 (LoRA: merged, the same)", size(2 * c.total)),
        *(
            (f"  adapter-only alternative, LoRA r = {r}, bf16", size(2 * n))
            for r, n in c.lora.items()
        ),
        (
            f"trajectories, {STEP_TRAJECTORIES} × {STEP_TOKENS:,} tokens: int64 ids + fp32 log μ",
            size(traj * (8 + 4)),
        ),
        ("  with int32 ids", size(traj * (4 + 4))),
    ]

    def per_rank(factor: float) -> list[str]:
        return [gib(factor * (n - 1) / n) for n in RANKS]

    p, lora = c.total, c.lora[LORA_RANKS[-1]]
    collectives = [
        ("DDP all-reduce of fp32 grads (ring: 2·(N−1)/N·4P)", *per_rank(2 * 4 * p)),
        ("FSDP2, fp32 params: 2 all-gathers + reduce-scatter", *per_rank(3 * 4 * p)),
        ("FSDP2, bf16 all-gathers + fp32 reduce-scatter", *per_rank((2 + 2 + 4) * p)),
        (f"DDP, LoRA r = {LORA_RANKS[-1]}: adapters' grads", *per_rank(2 * 4 * lora)),
    ]
    headers = ("GiB sent per rank (computed), N =", *(str(n) for n in RANKS))
    return (
        "network per step (computed)\n" + table(("what", "size"), once) + "\n\n"
        "gradient synchronisation: DDP once per optimiser step; FSDP2 per micro-batch "
        "forward + backward\n" + table(headers, collectives)
    )


def fit_rows(c: Counts) -> list[tuple[str, list[float]]]:
    """Per-rank GiB: state, transient, activations, log-probs, reference; checkpointing on.

    Micro-batch ``MICRO_BATCH`` × ``LENGTHS[0]``, chunked log-probs. FSDP2 rows assume
    ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` and one unit per
    decoder layer; their transient is the unsharded root (embedding, head) and two layers
    in bf16 (the current and the prefetched one) plus one layer's fp32 gradients.
    """
    n_tok, p = MICRO_BATCH * LENGTHS[0], c.total
    act2 = activation_bytes(c, n_tok, checkpointing=True)
    act4 = activation_bytes(c, n_tok, checkpointing=True, width=4)
    lp = logprob_bytes(c, n_tok, chunked=True)
    lp_frozen = logprob_bytes(c, n_tok, chunked=True, head_trained=False)
    unsharded = 2 * c.root + 2 * 2 * c.layer + 4 * c.layer
    lora = c.lora[LORA_RANKS[-1]]
    rows: list[tuple[str, list[float]]] = [
        ("full FT fp32, DDP", [16 * p, 0, act4, lp, 4 * p]),
        ("full FT bf16 autocast, DDP", [16 * p, 2 * p, act2, lp, 2 * p]),
        *(
            (f"full FT bf16, FSDP2 N = {n}", [16 * p / n, unsharded, act2, lp, 2 * p / n])
            for n in RANKS[1:]
        ),
        (f"LoRA r = {LORA_RANKS[-1]}, bf16 base, DDP", [16 * lora + 2 * p, 0, act2, lp_frozen, 0]),
        (
            f"LoRA r = {LORA_RANKS[-1]}, bf16 base, FSDP2 N = 8",
            [(16 * lora + 2 * p) / 8, 2 * c.root + 2 * 2 * c.layer, act2, lp_frozen, 0],
        ),
    ]
    return [(name, [v / GIB for v in values]) for name, values in rows]


def fits(total: float, reference: float) -> dict[str, str]:
    return {
        gpu: "yes"
        if total + reference <= HEADROOM * cap
        else "w/o ref"
        if total <= HEADROOM * cap
        else "no"
        for gpu, cap in GPUS.items()
    }


def fit_section(c: Counts) -> str:
    rows = []
    for name, (state, transient, act, lp, ref) in fit_rows(c):
        total = state + transient + act + lp
        rows.append(
            (
                name,
                *(f"{v:.2f}" for v in (state, transient, act, lp, total, ref)),
                *fits(total, ref).values(),
            )
        )
    headers = (
        "per learner rank",
        "state",
        "transient*",
        "activations*",
        "log-probs",
        "total",
        "+ reference",
        *(f"fits {g}" for g in GPUS),
    )
    return (
        f"what fits (GiB per rank; micro-batch {MICRO_BATCH} × {LENGTHS[0]:,}, gradient "
        f"checkpointing, chunked log-probs; * = estimate)\n"
        f"  reference: a frozen copy in the training dtype, sharded like the policy under "
        f"FSDP2; fits: total + reference below {HEADROOM:.0%} of nominal, 'w/o ref' without "
        "it\n" + table(headers, rows)
    )


def summary(c: Counts) -> str:
    lora = c.lora[LORA_RANKS[0]]
    smallest = next(
        (
            name
            for name, (s, t, a, lp, ref) in fit_rows(c)
            if fits(s + t + a + lp, ref)["80 GB"] == "yes"
        ),
        "none listed",
    )
    engine = 2 * c.total + kv_bytes_per_token(c) * ENGINE_SEQS * ENGINE_TOKENS
    return (
        f"{c.name}: {c.total / 1e9:.2f} B params; full-FT state {gib(16 * c.total)} GiB "
        f"(FSDP2 N = 8: {gib(2 * c.total)} GiB/rank); LoRA r = {LORA_RANKS[0]} trains "
        f"{100 * lora / c.total:.2f} %; engine {gib(engine)} GiB with "
        f"{ENGINE_SEQS}×{ENGINE_TOKENS} KV; weight push {gib(2 * c.total)} GiB/engine/step; "
        f"first row of the fit table to fit 80 GB with its reference: {smallest}"
    )


def report(c: Counts, kwargs: dict[str, Any]) -> str:
    tied = "tied" if kwargs["tie_word_embeddings"] else "untied"
    header = (
        f"=== {c.name}: hidden {c.hidden}, {c.layers} layers, {kwargs['num_attention_heads']} "
        f"heads / {c.kv_heads} KV heads, head dim {c.head_dim}, MLP "
        f"{kwargs['intermediate_size']}, V = {c.vocab:,}, {tied} embeddings"
    )
    sections = (
        parameters_section,
        state_section,
        sharding_section,
        lora_section,
        logprob_section,
        activation_section,
        engine_section,
        network_section,
        fit_section,
    )
    return "\n\n".join([header, *(section(c) for section in sections)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy config (smoke test)")
    args = parser.parse_args(argv)
    chosen = {"tiny": TINY} if args.tiny else {f"Qwen2.5-{m}": MODELS[m] for m in args.models}
    counts = [count(name, kwargs) for name, kwargs in chosen.items()]
    for c, kwargs in zip(counts, chosen.values(), strict=True):
        print(report(c, kwargs), end="\n\n")
    print("=== summary\n" + "\n".join(summary(c) for c in counts))


if __name__ == "__main__":
    main()
