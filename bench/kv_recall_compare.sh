#!/usr/bin/env bash
# Issue 33 item 3: truncate_oldest against compact on the long-context recall task
# (data.task=kv_recall: 10 facts, one per turn, then a question about one of the first 2;
# 193 tokens against the embedded chat model's 128), 3 seeds each, then `rlmap compare`.
#
# Both arms start from the same warm start (its demonstrations include compaction
# summaries; only compact asks for them) and train the same recipe, advise's row 7: ppo with
# one GAE step per turn, whose critic measures the state sufficiency at each boundary
# (critic/segment_value_gap). The seeds' runs go in parallel, THREADS CPU threads each (on
# a GPU machine they share the GPU).
#
#     bash bench/kv_recall_compare.sh                 # runs/kv_recall/{truncate_oldest,compact}/seed<S>
#     STEPS=2 EVAL_SAMPLES=1 SEEDS=0 bash bench/kv_recall_compare.sh   # the same, toy size
#
# On the lent GPU machine (no package index): carry .whl/ (bash bench/gpu_wheels.sh) and the
# warm start (RLMAP_CACHE) as bench/gpu_check.sh says.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT_DIR=${COMPARE_OUT:-runs/kv_recall}
STEPS=${STEPS:-100}
EVAL_SAMPLES=${EVAL_SAMPLES:-4}   # (data.eval_size stays the task's: it is part of the warm start's split)
SEEDS=${SEEDS:-"0 1 2"}
THREADS=${THREADS:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-0}   # seconds a run may take (0: no limit); a run cut keeps what it logged
export OMP_NUM_THREADS=$THREADS PYTHONUNBUFFERED=1
if [ -d .whl ] && ! $PY -c "import pydantic, jsonschema, math_verify" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/rlmap-site .whl/*.whl
  export PYTHONPATH="/tmp/rlmap-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
started=$SECONDS
COMMON=(credit.time_unit=turn data.task=kv_recall data.max_turns=12 "optim.steps=$STEPS"
        "generation.eval_samples=$EVAL_SAMPLES" run.eval_every=10 run.checkpoint_every=1000 run.progress=false)

echo "=== warm start (cached after the first)"
$PY -m rlmap.cli train --recipe ppo --preflight "${COMMON[@]}" data.context_policy=compact | tail -3 || echo "preflight: no-go"

mkdir -p "$OUT_DIR/logs"
for policy in truncate_oldest compact; do
  for seed in $SEEDS; do
    dir="$OUT_DIR/$policy/seed$seed"
    rm -rf "$dir"
    timeout "$RUN_TIMEOUT" $PY -m rlmap.cli train --recipe ppo --seed "$seed" --out "$dir" "${COMMON[@]}" \
      "data.context_policy=$policy" > "$OUT_DIR/logs/$policy.$seed.log" 2>&1 &
  done
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
echo "=== runs done ($((SECONDS - started)) s, failed=$failed)"
$PY -m rlmap.cli compare "$OUT_DIR/truncate_oldest" "$OUT_DIR/compact" --out "$OUT_DIR/report" --force || echo "compare failed"
$PY bench/kv_recall_table.py "$OUT_DIR"
echo "=== done ($((SECONDS - started)) s)"
