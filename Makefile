# difflet — thin wrapper over CMake. `make demo` and `make test` are the two
# commands of the README.
BUILD      ?= build
BUILD_ASAN ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all build deps test test-asan bench demo clean tools-venv fuzz

all: build

deps:
	@scripts/deps.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) > /dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j 1

test-asan: deps
	@cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDIFFLET_SANITIZE=ON > /dev/null
	@cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j 1

bench: deps build
	$(BUILD)/difflet bench kernels --json $(BUILD)/bench-kernels.json

# The main job: a prompt in, a picture and a clip out, with the embedded models
# (difflet-tiny: pictures; difflet-tiny-video: 64x64 clips of 9 frames at 8 fps).
DEMO_PROMPT ?= a large yellow triangle in the bottom right on a purple background
DEMO_VIDEO_PROMPT ?= a large white circle moving from left to right on a green background
demo: deps build
	$(BUILD)/difflet selfcheck > /dev/null
	$(BUILD)/difflet generate --prompt "$(DEMO_PROMPT)" --seed 1 -o $(CURDIR)/demo.png
	$(BUILD)/difflet generate --model $(CURDIR)/models/difflet-tiny-video --prompt "$(DEMO_VIDEO_PROMPT)" --seed 1 -o $(CURDIR)/demo.mp4
	@echo "wrote $(CURDIR)/demo.png ($(DEMO_PROMPT))"
	@echo "wrote $(CURDIR)/demo.mp4 ($(DEMO_VIDEO_PROMPT))"
	@echo "try: make demo DEMO_PROMPT='a small green square in the centre on a white background' DEMO_VIDEO_PROMPT='a small red square moving up on a black background'"

# libFuzzer targets (clang): parsers and tokenizers, FUZZ_SECONDS each (not in CI).
FUZZ_SECONDS ?= 300
FUZZ_TARGETS ?= safetensors config tokenizers tokenizer_files
fuzz: deps
	@command -v clang >/dev/null || (apt-get update -qq && apt-get install -y -qq clang libclang-rt-dev)
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DDIFFLET_FUZZ=ON > /dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus-$$t; \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
	  build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/ build-fuzz/corpus-$$t tests/fuzz/seeds/$$t > build-fuzz/fuzz_$$t.log 2>&1; \
	  rc=$$?; grep -E "stat::number_of_executed|Done" build-fuzz/fuzz_$$t.log; \
	  if [ $$rc != 0 ]; then grep -E "ERROR|SUMMARY" build-fuzz/fuzz_$$t.log; echo "fuzz_$$t FAILED (see build-fuzz/)"; exit 1; fi; \
	done

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) build-fuzz

# Python tools (test vectors, training, peer benchmarks): a virtualenv under tools/,
# never needed at run time or in CI.
TOOLS_VENV ?= tools/venv
tools-venv: $(TOOLS_VENV)/.ok
$(TOOLS_VENV)/.ok: tools/requirements.txt
	python3 -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install -q --upgrade pip
	$(TOOLS_VENV)/bin/pip install -q -r tools/requirements.txt
	touch $@
