# muonbench: thin aliases; logic lives in Python. `make help` lists targets.
SHELL := /bin/bash
PY_SYS ?= $(shell PYENV_VERSION=$$(cat .python-version) pyenv which python 2>/dev/null || command -v python3.12 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Keyed on the content of what the install reads, not on mtimes: a checkout with the same pins reuses an existing
# .venv (a clone's fresh mtimes do not reinstall it); a changed pin names a new stamp and reinstalls.
INSTALL_INPUTS := pyproject.toml tests/requirements-bridge.txt
STAMP := $(VENV)/.installed-$(shell cat $(INSTALL_INPUTS) | sha256sum | cut -c1-16)
BRIDGE_VERSION := 0.6.2
# uv resolves and links from its cache several times faster than pip; INSTALLER=pip (or uv failing) installs with pip.
# uv compiles no bytecode unless asked (pip does): without it every process recompiles torch & co. from source
# where bytecode is not written (PYTHONDONTWRITEBYTECODE), several seconds per process of the test suite.
INSTALLER ?= uv
UV_VERSION := $(shell sed -n 's/^ *"uv==\(.*\)",*$$/\1/p' pyproject.toml)
# Test processes: pytest-xdist workers (`make test WORKERS=0` runs in one process).
WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install test test-gpu bench compare bench-hf bench-example bench-bridge bridge-diff bench-cluster bench-ns flops balance model project recommend calibrate perfmodel optim-step optim-scaling collect report regress quality quality-gpu docs lint typecheck docker-build docker-shell

help: ## List targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-16s %s\n", $$1, $$2}'

# Megatron-Bridge and what it imports, except Transformer Engine: the CPU tests build real ConfigContainers from
# Bridge's own recipes (tests/bridge_live.py). nvidia-resiliency-ext 0.7.0 (Bridge imports its `inprocess` module) is
# published for glibc >= 2.39 only; its Python part is all the import needs.
define install_with
$(1) pip==25.3 -e '.[test]' && $(1) --no-deps megatron-bridge==$(BRIDGE_VERSION) -r tests/requirements-bridge.txt
endef

$(STAMP):
	rm -f $(VENV)/.installed*
	$(PY_SYS) -m venv --without-pip $(VENV)
	if [ "$(INSTALLER)" = uv ] && $(PY_SYS) -m pip install -q --upgrade --target $(VENV)/uv uv==$(UV_VERSION) && \
		$(call install_with,$(VENV)/uv/bin/uv pip install -q --compile-bytecode --python $(PY)); then :; else \
		echo "installing with pip"; $(PY) -m ensurepip >/dev/null && $(call install_with,$(PY) -m pip install -q --upgrade); fi
	$(PY) -m pip install -q --no-deps --only-binary=:all: --platform manylinux_2_39_$(shell uname -m) \
		--python-version 3.12 --upgrade --target $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
		nvidia-resiliency-ext==0.7.0
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install the suite with its pinned dependencies

test: lint ## Lint, then run the CPU test suite (unit + gloo multi-process) on WORKERS processes (default 2)
	$(PY) -m pytest -q -n $(WORKERS) --dist loadgroup tests experiments

test-gpu: $(STAMP) ## Run the GPU tests (needs CUDA)
	$(PY) -m pytest -q -m gpu tests experiments

# OUT_DIR=DIR puts a sweep's records and report under DIR (bench.out_dir): the report then reads the same folder.
OUT_FLAGS = $(if $(OUT_DIR),bench.out_dir=$(OUT_DIR))
REPORT_FLAGS = $(if $(OUT_DIR),--out-dir $(OUT_DIR))
comma := ,
check_args = $(if $(findstring bench.out_dir=,$(ARGS)),$(error ARGS sets bench.out_dir, which the report step would not read: pass OUT_DIR=DIR instead))

# bench.run, then the report of its sweep; exit 2 is bench.run refusing to start (a config error, or bench.out_dir
# held by another sweep): nothing of this invocation to collect, and an earlier sweep's folder is left alone.
define run_and_report
$(PY) -m bench.run $(1); rc=$$?; if [ $$rc -eq 2 ]; then exit 2; fi; \
$(PY) -m bench.results.collect $(REPORT_FLAGS) && $(PY) -m bench.results.report $(REPORT_FLAGS) && exit $$rc
endef

SMOKE := -m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2
bench: $(STAMP) ## Main job: AdamW vs Muon on the tiny Qwen3-MoE proxy, 2 gloo ranks, records + report in runs/<sweep>/report/ [OUT_DIR=...]
	$(call run_and_report,$(SMOKE) $(OUT_FLAGS))

bench-hf: $(STAMP) ## AdamW vs Muon on a tiny CPU slice of your model: make bench-hf CONFIG=path/to/config.json [ARGS=...] [OUT_DIR=...]
	$(call check_args)
	$(call run_and_report,-m optimizer=adamw$(comma)muon experiment=cpu/hf_tiny_dp2 'model=hf:$(CONFIG)' $(OUT_FLAGS) $(ARGS))

EXAMPLE_REPORT := smoke_cpu_202612
bench-example: $(STAMP) ## Rewrite the committed example reports/smoke_cpu_202612/ from the latest sweep (only after a complete make bench)
	$(PY) -m bench.results.collect --name $(EXAMPLE_REPORT) --expect-command "$(SMOKE)" && \
	$(PY) -m bench.results.report --name $(EXAMPLE_REPORT)

compare: $(STAMP) ## A variant optimizer's cost against a baseline to +-0.5% (muonbench compare): ARGS="experiment=... [--variant muon]"
	$(PY) -m bench.tools.compare $(ARGS)

bench-bridge: $(STAMP) ## Megatron-Bridge's pretrain loop on one GPU: AdamW, ours (Muon), Megatron's Muon on the FLOP-matched Qwen3 slice
	$(PY) -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu optimizer=adamw,muon,muon_megatron $(ARGS)

BRIDGE_EXPERIMENT ?= h200/qwen3_30b_a3b_slice_flops_bridge_1gpu
bridge-diff: $(STAMP) ## Settings that differ between Bridge's run and the megatron engine's (needs TE): ARGS="engine.moe_permute_fusion=true"
	$(PY) -m bench.tools.bridge_diff experiment=$(BRIDGE_EXPERIMENT) $(ARGS)

bench-ns: $(STAMP) ## Newton-Schulz kernels vs QuACK vs emerging-optimizers vs torch Muon (needs a GPU): reports/ns_kernels_*
	$(PY) -m bench.tools.ns_kernels $(ARGS)

flops: $(STAMP) ## Model and Newton-Schulz FLOPs: make flops ARGS="model=kimi_k2 parallelism=pp4_dp64_ep64"
	$(PY) -m bench.tools.flops $(ARGS)

balance: $(STAMP) ## Layer-wise optimizer load balance: make balance ARGS="model=qwen3_30b_a3b parallelism=dp8_ep8"
	$(PY) -m bench.tools.balance $(ARGS)

model: $(STAMP) ## conf/model YAML of a Hugging Face config: make model ARGS="hf:path/to/config.json [model.num_layers=4]"
	$(PY) -m bench.tools.model $(ARGS)

project: $(STAMP) ## Performance model prediction: make project ARGS="model=kimi_k2 parallelism=pp4_dp64_ep64 hardware=gb300"
	$(PY) -m bench.tools.project $(ARGS)

recommend: $(STAMP) ## Recommended Muon settings, predicted cost and DP scaling curve: make recommend ARGS="model=qwen3_30b_a3b parallelism=dp8_ep8 hardware=h200"
	$(PY) -m bench.tools.recommend $(ARGS)

calibrate: $(STAMP) ## This GPU's hardware profile at a model's shapes, read by project/recommend (needs a GPU, < 3 min): make calibrate ARGS="model=qwen3_8b hardware=h100"
	$(PY) -m bench.tools.calibrate $(ARGS)

perfmodel: $(STAMP) ## Performance model calibration and sweeps: README, CSV and plots under reports/perfmodel_gb300_202611
	$(PY) -m bench.tools.project report=reports/perfmodel_gb300_202611

optim-step: $(STAMP) ## Time one optimizer step on a Qwen3-30B-A3B layer: make optim-step ARGS="device=cuda"
	$(PY) -m bench.tools.optim_step $(ARGS)

NPROC ?= 2
optim-scaling: $(STAMP) ## Layer-wise optimizer step strong scaling on NPROC ranks: make optim-scaling NPROC=8 ARGS="out=DIR"
	$(PY) -m torch.distributed.run --nproc_per_node=$(NPROC) -m bench.tools.optim_scaling $(ARGS)

collect: $(STAMP) ## Gather the latest sweep's run directories into runs/<sweep>/report/results.csv (ARGS="--name N": reports/N/)
	$(PY) -m bench.results.collect $(ARGS)

report: $(STAMP) ## Write the markdown report and plots from the collected CSVs
	$(PY) -m bench.results.report $(ARGS)

GOLDEN ?= reports/golden/h200.csv
regress: $(STAMP) ## Compare a report with golden rows (+-5%): make regress NAME=<report name> [GOLDEN=reports/golden/h200.csv] [ARGS=--warn-only]
	$(if $(NAME),,$(error NAME is required: make regress NAME=<report name under reports/>))
	$(PY) -m bench.results.regress compare --results reports/$(NAME)/results.csv --golden $(GOLDEN) $(ARGS)

EXPERIMENT ?= gb300/kimi_k2_muon
VIA ?= nemo_run
# DRY_RUN (1/true/yes or 0/false/no) reaches `muonbench cluster` in the environment, which reads it.
bench-cluster: $(STAMP) ## Slurm job of a published setup through NeMo-Run: EXPERIMENT=gb300/kimi_k2_muon [DRY_RUN=1] [VIA=sbatch] [ARGS="launcher.partition=P launcher.account=A"]
	$(PY) -m bench.cli cluster experiment=$(EXPERIMENT) launcher.via=$(VIA) $(ARGS)

# GB300 nodes (the gb300 experiments) are aarch64; H100 / H200 nodes are x86-64: PLATFORM=linux/amd64.
PLATFORM ?= linux/arm64
docker-build: ## Build the NeMo 26.02 based image with megatron-core 0.19.2 / megatron-bridge 0.6.2 [PLATFORM=linux/amd64]
	docker build --platform $(PLATFORM) --build-arg GIT_SHA=$$(git rev-parse HEAD) -t muonbench:26.02 $(ARGS) .

docker-shell: ## Shell in the image with this checkout mounted
	docker run --rm -it --gpus all --ipc=host -v $(CURDIR):/opt/muonbench -w /opt/muonbench muonbench:26.02 bash

quality: $(STAMP) ## Time-to-target-loss of AdamW, Muon, MOP, SOAP-REKLS on stdlib text (CPU, < 30 min), into a fresh runs/quality_cpu_<time>/
	$(PY) -m bench.tools.quality profile=cpu

quality-gpu: $(STAMP) ## Compute-optimal, equally tuned sweep on one GPU (resumable, docs/quality.md): ARGS="out=DIR budget_s=S"
	$(PY) -m bench.tools.quality profile=compute_optimal $(ARGS)

DEV_STAMP := $(VENV)/.installed-dev
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $(DEV_STAMP)

LINT_PATHS := optim muonbench bench recipes experiments tests
docs: $(STAMP) ## Rewrite the numbers README.md and docs/ quote from the reports' summary.json files
	$(PY) -m bench.tools.docs

lint: $(STAMP) ## ruff lint (make test runs it first)
	$(PY) -m ruff check $(LINT_PATHS)

typecheck: $(DEV_STAMP) ## mypy strict on optim/
	$(PY) -m mypy
