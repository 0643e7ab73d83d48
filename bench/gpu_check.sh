#!/usr/bin/env bash
# The GPU check (issue 28), for the machine this project can be lent: one NVIDIA H200,
# Python 3.12, PyTorch 2.11 (CUDA 13), transformers, peft, accelerate, pyarrow; no vLLM and
# no package index. Within 6 minutes, nothing downloaded (models built from configs):
#
#   1. the suite's GPU tests (`-m gpu`; skipped on a machine without CUDA);
#   2. bench/gpu_check.py: grpo on the embedded default on cuda:0 (ledger device, an audit
#      of every tensor, fp32 κ < 1e-3, held-out pass@1 up), a ~0.5B Qwen2 in bf16 (32 × 8
#      samples, 256 new tokens: s/step split, tokens/s, peak memory, MFU), kill -9 and
#      --resume; (issue 29) a one-rank world through rlmap's process group (NCCL on the GPU)
#      and its DDP / FSDP2 wrappers, gradient equal to one process's; the 0.5B weights
#      streamed into a bfloat16 engine copy, timed; vLLM sleep cycles where vLLM's CUDA
#      build imports (not on the lent machine: skipped, saying so). Its figures go to one
#      file, ${GPU_CHECK_OUT:-gpu_check.json}.
#
# rlmap's small pure-Python dependencies the machine lacks travel as wheels in .whl/
# (ignored by git): `bash bench/gpu_wheels.sh` fetches them here (Python 3.12 builds), and
# this script installs them with --no-index when the folder is there.
#
#     bash bench/gpu_check.sh                  # on the GPU machine, from the repository root
#     CHECK_SMALL=1 bash bench/gpu_check.sh    # the same steps at toy size, on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1
started=$SECONDS
say() { printf '\n=== %s (%ds)\n' "$1" $((SECONDS - started)); }

say "what travels to the GPU machine"
echo "working tree (tracked files): $(git ls-files -z | du -ch --files0-from=- | tail -1 | cut -f1)"
echo "carried wheels (.whl/): $([ -d .whl ] && du -sh .whl | cut -f1 || echo 'none: bash bench/gpu_wheels.sh')"
if [ -d .whl ] && ! $PY -c "import pydantic, jsonschema, math_verify" 2>/dev/null; then
  say "installing the carried wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/rlmap-site .whl/*.whl
  export PYTHONPATH="/tmp/rlmap-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # rlmap from this checkout
export RLMAP_CACHE=${RLMAP_CACHE:-$(mktemp -d)}

say "environment"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

SMALL=()
[ -n "${CHECK_SMALL:-}" ] && SMALL=(--small)

say "GPU tests of the suite"
$PY -m pytest -q -o addopts="" -rs -m gpu -p no:cacheprovider tests/learner/test_learner_gpu.py

say "bench/gpu_check.py ${SMALL[*]:-}"
$PY bench/gpu_check.py --out "${GPU_CHECK_OUT:-gpu_check.json}" "${SMALL[@]}"
say "done"
