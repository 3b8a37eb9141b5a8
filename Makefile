# The two commands: `make run` and `make test`. Everything else is a step of theirs.
#   make test SANITIZE=1   ASan + UBSan build in build-asan/
#   make bench             Google Benchmark programs (Release build in build-release/)
#   make fuzz              libFuzzer over every input parser, FUZZ_SECONDS each (clang-14, build-fuzz/)
BUILD_TYPE ?= RelWithDebInfo
SANITIZE ?= 0
JOBS ?= $(shell nproc)

ifeq ($(SANITIZE),1)
BUILD_DIR ?= build-asan
CMAKE_FLAGS += -DGPUFLEET_SANITIZE=ON
BUILD_TYPE := Debug
else
BUILD_DIR ?= build
endif

# CI turns warnings into errors; a local build keeps whatever its build dir was configured with.
CMAKE_FLAGS += -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(if $(CI),-DGPUFLEET_WERROR=ON,)
GPUFLEET := $(BUILD_DIR)/gpufleet

.PHONY: all deps configure build test test-images run bench fuzz format format-check clean

all: build

deps:
	@scripts/deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The containers' tests run images built offline from Debian's mirror, cached between runs.
test-images: deps
	@scripts/test-images.sh

test: build test-images
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) --timeout 600

# A one-machine cluster: control plane + node agent, state in ./.gpufleet, real GPUs when NVML
# finds them, simulated ones (said so in the banner) otherwise. Ctrl-C stops it.
run: build
	$(GPUFLEET) dev $(DEV_ARGS)

bench:
	$(MAKE) build BUILD_DIR=build-release BUILD_TYPE=Release
	build-release/bench/bench_sched --benchmark_min_time=0.2

FUZZ_SECONDS ?= 60
fuzz:
	@scripts/deps.sh fuzz
	CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DGPUFLEET_FUZZ=ON -DGPUFLEET_BUILD_BENCH=OFF
	cmake --build build-fuzz -j $(JOBS) --target fuzz_api_json fuzz_job_yaml fuzz_agent_requests \
	    fuzz_http fuzz_traces
	scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

format:
	git ls-files '*.cpp' '*.h' | xargs clang-format -i

format-check:
	git ls-files '*.cpp' '*.h' | xargs clang-format --dry-run --Werror

clean:
	rm -rf build build-asan build-release build-fuzz
