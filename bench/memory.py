"""Peak memory and time of one log-prob forward + backward: full logits vs chunked LM head.

A Qwen2 causal LM with Qwen2.5's vocabulary (V = 151,936) and a small trunk (so the LM
head dominates, as it does at real sizes per token), B rows of T tokens, float32 on CPU.
Memory: each path runs one step in a fresh process, and the process's peak resident set
(``ru_maxrss``) minus its resident set just before the step is the step's peak memory.
Time: one more process times both paths alternately (full, chunked, full, ...) after a
warm-up of each, so other work on the machine slows both alike; medians of
``--repeats``.

    python bench/memory.py                 # B = 2, T = 1,024 and 512
    python bench/memory.py --toy           # a seconds-long smoke run (small V and T)
    python bench/memory.py --options       # also: checkpointing and bf16 autocast, below

The last line reads ``memory ratio X, time ratio Y`` (chunked / full, at the first T).

``--options`` adds a section before it: one chunked forward + backward of a deeper model
(8 layers of width 512, V = 32,768, B = 2, T = 512, where the trunk's activations matter)
with the learner's memory options — float32, activation checkpointing, bf16 autocast over
float32 weights, both — measured the same way, and each one's memory and time relative to
float32. On a CPU without bfloat16 instructions the two autocast lines take minutes each.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import time
from typing import Any

QWEN25_VOCAB = 151_936


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _model_and_batch(vocab: int, rows: int, tokens: int) -> tuple[Any, Any, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=tokens,
        tie_word_embeddings=True,
    )
    ids = torch.randint(0, vocab, (rows, tokens))
    return Qwen2ForCausalLM(config), ids, torch.ones_like(ids, dtype=torch.bool)


def _step(path: str, model: Any, ids: Any, attention: Any) -> float:
    from rlmap.learner import logprobs

    started = time.perf_counter()
    if path == "full":
        lp, _ = logprobs._full_logprobs(model, ids, attention, 1.0, False)
    else:
        lp, _ = logprobs.token_logprobs(model, ids, attention)
    lp.sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def _peak(path: str, vocab: int, rows: int, tokens: int, out: Any) -> None:
    model, ids, attention = _model_and_batch(vocab, rows, tokens)
    before = _rss_mb()
    _step(path, model, ids, attention)
    out.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before)  # KiB


def _times(vocab: int, rows: int, tokens: int, repeats: int, out: Any) -> None:
    model, ids, attention = _model_and_batch(vocab, rows, tokens)
    seconds: dict[str, list[float]] = {"full": [], "chunked": []}
    for path in seconds:  # warm-up
        _step(path, model, ids, attention)
    for _ in range(repeats):
        for path, kept in seconds.items():
            kept.append(_step(path, model, ids, attention))
    out.put({path: statistics.median(v) for path, v in seconds.items()})


OPTIONS = {
    "float32": (False, False),
    "checkpointing": (True, False),
    "bf16 autocast": (False, True),
    "both": (True, True),
}
"""Name -> (activation checkpointing, bf16 autocast)."""


def _deep_model(vocab: int, rows: int, tokens: int, layers: int, width: int) -> tuple[Any, ...]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=width * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=width // 64,
        num_key_value_heads=max(1, width // 256),
        max_position_embeddings=tokens,
        tie_word_embeddings=True,
    )
    ids = torch.randint(0, vocab, (rows, tokens))
    return Qwen2ForCausalLM(config).train(), ids, torch.ones_like(ids, dtype=torch.bool)


def _option_model(option: str, model: Any) -> Any:
    from rlmap.learner.memory import checkpoint_activations

    if OPTIONS[option][0]:
        checkpoint_activations(model)
    return model


def _option_step(option: str, model: Any, ids: Any, attention: Any) -> float:
    import torch

    from rlmap.learner import logprobs
    from rlmap.learner.memory import autocast_to

    dtype = torch.bfloat16 if OPTIONS[option][1] else torch.float32
    started = time.perf_counter()
    with autocast_to(model, dtype):
        lp, _ = logprobs.token_logprobs(model, ids, attention)
    lp.sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def _option_peak(option: str, shape: tuple[int, ...], out: Any) -> None:
    model, ids, attention = _deep_model(*shape)
    model = _option_model(option, model)
    before = _rss_mb()
    _option_step(option, model, ids, attention)
    out.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before)  # KiB


def _option_times(shape: tuple[int, ...], repeats: int, out: Any) -> None:
    import copy

    plain, ids, attention = _deep_model(*shape)
    checkpointed = _option_model("checkpointing", copy.deepcopy(plain))
    models = {o: checkpointed if OPTIONS[o][0] else plain for o in OPTIONS}
    seconds: dict[str, list[float]] = {o: [] for o in OPTIONS}
    for option in seconds:  # warm-up
        _option_step(option, models[option], ids, attention)
    for _ in range(repeats):
        for option, kept in seconds.items():
            kept.append(_option_step(option, models[option], ids, attention))
    out.put({option: statistics.median(v) for option, v in seconds.items()})


def run_options(shape: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    """The memory options' peak and time, each also relative to float32 (same run)."""
    vocab, rows, tokens, layers, width = shape
    times = _in_process(_option_times, shape, repeats)
    peaks = {option: _in_process(_option_peak, option, shape) for option in OPTIONS}
    results = []
    for option in OPTIONS:
        memory = peaks[option] / peaks["float32"]
        slower = times[option] / times["float32"]
        results.append(
            {
                "option": option,
                "peak_mb": peaks[option],
                "seconds": times[option],
                "memory_ratio": memory,
                "time_ratio": slower,
            }
        )
        print(
            f"options V={vocab} B={rows} T={tokens} layers={layers} width={width} "
            f"{option:>13}: peak {peaks[option]:8.1f} MB ({memory:.3f}x), "
            f"{times[option]:.3f} s ({slower:.3f}x) per step",
            flush=True,
        )
    return results


def _in_process(target: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def run(vocab: int, rows: int, lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    results = []
    for tokens in lengths:
        times = _in_process(_times, vocab, rows, tokens, repeats)
        for path in ("full", "chunked"):
            peak = _in_process(_peak, path, vocab, rows, tokens)
            results.append(
                {"path": path, "tokens": tokens, "peak_mb": peak, "seconds": times[path]}
            )
            print(
                f"V={vocab} B={rows} T={tokens} {path:>7}: peak {peak:8.1f} MB, "
                f"{times[path]:.3f} s per forward+backward",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2, help="B, rows per micro-batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--toy", action="store_true", help="V = 4,096, T = 64, 32: a smoke run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--options",
        action="store_true",
        help="also checkpointing and bf16 autocast on a deeper model",
    )
    args = parser.parse_args()
    vocab, lengths = (4096, [64, 32]) if args.toy else (QWEN25_VOCAB, [1024, 512])
    results = run(vocab, args.rows, lengths, args.repeats)
    if args.json:
        print(json.dumps(results))
    if args.options:  # (V, B, T, layers, width)
        shape = (1024, args.rows, 32, 2, 64) if args.toy else (32_768, args.rows, 512, 8, 512)
        options = run_options(shape, args.repeats)
        if args.json:
            print(json.dumps(options))
    full, chunked = results[0], results[1]
    print(
        f"memory ratio {chunked['peak_mb'] / full['peak_mb']:.3f}, "
        f"time ratio {chunked['seconds'] / full['seconds']:.3f}"
    )


if __name__ == "__main__":
    main()
