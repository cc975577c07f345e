# Thin wrapper over CMake. `make run` and `make test` install what is missing first (apt-get, pip);
# `make test-gpu` never installs (the GPU image has everything and reaches no registry).
BUILD_DIR ?= build
GPU_BUILD_DIR ?= build-gpu
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
ARGS ?=

.PHONY: all deps configure build run test test-cpu test-python test-sanitize test-gpu bench clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: deps
	@$(MAKE) --no-print-directory $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The main job: the embedded Kimi-K3-shaped layer on the best device here (ARGS="..." adds flags).
run: build
	$(BUILD_DIR)/bin/mxmoe run $(ARGS)

test: build
	ctest --test-dir $(BUILD_DIR) -L cpu --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory test-python
	@$(MAKE) --no-print-directory test-sanitize

# On the GPU machine: configure, build for sm_90a, run the GPU suite. No installs.
test-gpu:
	cmake -S . -B $(GPU_BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA=ON -DMXMOE_CUDA_ARCHS=90a $(CMAKE_FLAGS)
	cmake --build $(GPU_BUILD_DIR) -j $(JOBS)
	ctest --test-dir $(GPU_BUILD_DIR) -L gpu --output-on-failure

# On the GPU machine: build the CLI like test-gpu (no installs), then bench/run.sh: the sweep
# (`mxmoe bench`, every row checked before it is timed), the plain PyTorch peer on the same inputs,
# and the report (ratio per row, issue 5's targets, roofline plot). Results in BENCH_OUT;
# BENCH_ARGS="--shapes kimi-k3 --tokens 1,32" narrows the sweep.
BENCH_OUT ?= $(GPU_BUILD_DIR)/bench
BENCH_ARGS ?=
bench:
	cmake -S . -B $(GPU_BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA=ON -DMXMOE_CUDA_ARCHS=90a $(CMAKE_FLAGS)
	cmake --build $(GPU_BUILD_DIR) -j $(JOBS) --target mxmoe_cli
	bash bench/run.sh $(GPU_BUILD_DIR) $(BENCH_OUT) $(BENCH_ARGS)

clean:
	rm -rf $(BUILD_DIR) $(GPU_BUILD_DIR) build-asan

# The Python package (python/, CPU backend; MXMOE_PYTHON_CUDA=1 builds the CUDA one) and its pytest
# suite. No build isolation and no dependency resolution: it builds with the nanobind and
# scikit-build-core that `make deps` installed (or the image has), fetching nothing. The build tree
# python/_skbuild/ is kept, so a second run recompiles only what changed.
PYTHON ?= python3
# On the GPU machine: MXMOE_PYTHON_CUDA=1 MXMOE_CUDA_ARCHS=90a make test-python (its own build tree).
test-python:
	PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 $(PYTHON) -m pip install -q --no-build-isolation --no-deps $(if $(MXMOE_PYTHON_CUDA),-C build-dir=_skbuild/cuda) ./python
	cd tests/python && $(PYTHON) -m pytest -q .

# The CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer (clang), then every libFuzzer
# target for FUZZ_SECONDS on its corpus (fuzz/corpus/). Run by `make test`.
FUZZ_SECONDS ?= 60
test-sanitize: deps
	JOBS=$(JOBS) bash scripts/fuzz.sh $(FUZZ_SECONDS)
