#!/usr/bin/env bash
# The wheels bench/gpu_check.sh carries to the GPU machine (Python 3.12, no package index):
# rlmap's pure-Python dependencies its image lacks, and theirs. Into .whl/ (ignored by git);
# prints the folder's size, which must stay within the device's 64 MiB carry.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NAMES=(pydantic pydantic-core annotated-types typing-inspection
       jsonschema jsonschema-specifications referencing rpds-py
       math-verify latex2sympy2_extended antlr4-python3-runtime)
# the versions this machine's environment resolved together (pydantic pins pydantic-core)
mapfile -t WHEELS < <($PY -c "import importlib.metadata as m, sys
for n in sys.argv[1:]: print(f'{n}=={m.version(n)}')" "${NAMES[@]}")
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any)
mkdir -p .whl
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]/#/--platform=}" -d .whl "${WHEELS[@]}"
echo "carried: $(du -sh .whl | cut -f1) in $(ls .whl | wc -l) wheels (limit 64 MiB)"
