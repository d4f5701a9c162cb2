# Thin front end over CMake: the targets people type. Everything real is in CMakeLists.txt and scripts/.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
TESSERA := $(BUILD)/bin/tessera
PREFIX ?= /usr/local

.PHONY: all build cli setup model test demo install bench fuzz format clean

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: $(BUILD)/build.ninja
	@cmake --build $(BUILD) -j $(JOBS)

# Only the `tessera` executable and what it links, quietly: the build log goes to a file, shown only on failure.
cli: $(BUILD)/build.ninja
	@echo "building tessera (log: $(BUILD)/cli-build.log)"
	@cmake --build $(BUILD) -j $(JOBS) --target tessera_cli > $(BUILD)/cli-build.log 2>&1 || \
	  { tail -n 40 $(BUILD)/cli-build.log; echo "build failed; the whole log is $(BUILD)/cli-build.log"; exit 1; }

model:
	@scripts/fetch_model.sh >/dev/null

# The whole CPU test suite: installs what is missing, builds, fetches the default model, runs ctest.
test: setup
	@$(MAKE) --no-print-directory build
	@$(MAKE) --no-print-directory model
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Shows Tessera working on the default model: builds only the CLI (not the tests or benchmarks).
demo: setup
	@$(MAKE) --no-print-directory cli
	@$(MAKE) --no-print-directory model
	@scripts/demo.sh $(TESSERA)

# Installs the `tessera` executable into $(PREFIX)/bin (PREFIX=/usr/local by default; DESTDIR is honoured).
install: cli
	@cmake --install $(BUILD) --prefix $(PREFIX)

bench: setup build model
	@$(BUILD)/bin/tessera_bench_kernels --benchmark_min_time=0.2

# libFuzzer targets for the GGUF and safetensors parsers (clang); FUZZ_SECONDS per target, corpus in tests/fuzz/.
FUZZ_SECONDS ?= 60
fuzz: setup
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON \
	  -DTESSERA_CUDA=OFF -DTESSERA_BENCH=OFF >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_gguf fuzz_safetensors
	@scripts/run_fuzz.sh build-fuzz $(FUZZ_SECONDS)

format:
	@git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) build-fuzz
