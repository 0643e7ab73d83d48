#!/usr/bin/env bash
# The GPU check of the vLLM engine, meant to finish within 8 minutes on one GPU with nothing
# downloaded (models are built from configs with random weights):
#
#   1. vLLM's CUDA build: used when importable; otherwise `pip install 'vllm>=0.32,<0.33'` is tried
#      (a machine without the package index must have it installed already);
#   2. the vLLM engine tests (tests/system/test_vllm_engine.py) on the GPU;
#   3. bench/engines.py: tokens/s of both engines on the embedded default and on a ~0.5B
#      random Qwen2 in bfloat16 (24 layers × 896 and vocabulary 151,936, as Qwen2.5-0.5B),
#      128 sequences of up to 256 new tokens with long-tailed lengths;
#   4. the κ tails: 20 grpo steps with the vLLM engine in float32 and in bfloat16, and
#      the largest ratio/kappa/max_abs_log and p99 of each.
#
#     bash bench/gpu_check.sh            # on the GPU machine, from the repository root
#     CHECK_SMALL=1 bash bench/gpu_check.sh   # the same steps at toy size (a CPU dry run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
started=$SECONDS
say() { printf '\n=== %s (%ds)\n' "$1" $((SECONDS - started)); }

say "environment"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
if ! $PY -c "import vllm" 2>/dev/null; then
  say "installing vLLM's CUDA build"
  $PY -m pip install -q 'vllm>=0.32,<0.33' || { echo "vLLM is not installed and could not be"; exit 1; }
fi
$PY -c "import vllm; print('vllm', vllm.__version__)"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # rlmap from this checkout

if [ -n "${CHECK_SMALL:-}" ]; then
  LARGE=(--sequences 8 --new-tokens 16 --layers 2 --hidden 128 --mean-length 8 --repeats 2)
  STEPS=2
else
  LARGE=(--sequences 128 --new-tokens 256 --layers 24 --hidden 896 --vocab 151936
         --dtype bfloat16 --repeats 3)
  STEPS=20
fi

say "vLLM engine tests"
$PY -m pytest -q -o addopts="" -rs tests/system/test_vllm_engine.py

say "bench/engines.py"
$PY bench/engines.py --cases embedded large "${LARGE[@]}"

say "kappa tails (grpo, $STEPS steps, vLLM engine)"
out=$(mktemp -d)
for dtype in float32 bfloat16; do
  $PY -m rlmap.cli train --recipe grpo --out "$out/$dtype" system.engine=vllm \
    "system.rollout_dtype=$dtype" "optim.steps=$STEPS" run.eval_every=1000 \
    run.checkpoint_every=1000 run.progress=false > /dev/null
  $PY - "$out/$dtype" "$dtype" <<'EOF'
import json, sys
rows = [json.loads(x) for x in open(f"{sys.argv[1]}/metrics.jsonl")][1:]
worst = max(r["ratio/kappa/max_abs_log"] for r in rows)
p99 = max(r["ratio/kappa/p99_abs_log"] for r in rows)
print(f"rollout {sys.argv[2]}: {len(rows)} steps, max ratio/kappa/max_abs_log {worst:.2e}, "
      f"max ratio/kappa/p99_abs_log {p99:.2e}")
EOF
done
rm -rf "$out"
say "done"
