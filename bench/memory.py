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

The last line reads ``memory ratio X, time ratio Y`` (chunked / full, at the first T).
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
    config = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=tokens, tie_word_embeddings=True)  # fmt: skip
    ids = torch.randint(0, vocab, (rows, tokens))
    return Qwen2ForCausalLM(config), ids, torch.ones_like(ids, dtype=torch.bool)


def _step(path: str, model: Any, ids: Any, attention: Any) -> float:
    from rlmap.system import logprobs

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
            results.append({"path": path, "tokens": tokens, "peak_mb": peak,
                            "seconds": times[path]})  # fmt: skip
            print(f"V={vocab} B={rows} T={tokens} {path:>7}: peak {peak:8.1f} MB, "
                  f"{times[path]:.3f} s per forward+backward", flush=True)  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2, help="B, rows per micro-batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--toy", action="store_true", help="V = 4,096, T = 64, 32: a smoke run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    vocab, lengths = (4096, [64, 32]) if args.toy else (QWEN25_VOCAB, [1024, 512])
    results = run(vocab, args.rows, lengths, args.repeats)
    if args.json:
        print(json.dumps(results))
    full, chunked = results[0], results[1]
    print(f"memory ratio {chunked['peak_mb'] / full['peak_mb']:.3f}, "
          f"time ratio {chunked['seconds'] / full['seconds']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
