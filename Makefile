# ferroce: the two entry points are `make bench` (the main job) and `make test` (every test).
# Both install missing system packages first (ci/install-deps.sh), so a fresh Debian 12 works.

CARGO   ?= cargo
CC      ?= cc
RELEASE := target/release
PLUGIN  := $(RELEASE)/libnccl-net-ferroce.so
CFLAGS_SHIM := -O2 -g -Wall -Wextra -Werror -Iinclude
SHIM_OUT := $(RELEASE)/c_shim

.PHONY: all deps build plugin softroce c_shim harness doctor lint test bench clean

all: build

deps:
	@ci/install-deps.sh

build: deps
	$(MAKE) --no-print-directory plugin softroce c_shim harness doctor

plugin:
	$(CARGO) build --release -p ferroce
	cp -f $(RELEASE)/libnccl_net_ferroce.so $(PLUGIN)
	@echo "built $(PLUGIN) (NCCL_NET_PLUGIN=ferroce finds it through LD_LIBRARY_PATH=$(CURDIR)/$(RELEASE))"

softroce:
	softroce/build.sh

# The checklist tool (docs/doctor.md), built against the plugin's rlib.
doctor:
	$(CARGO) build --release -p ferroce-doctor

# C programs that load the plugin exactly as NCCL does (dlopen + dlsym of ncclNetPlugin_vN).
c_shim:
	@mkdir -p $(SHIM_OUT)
	$(CC) $(CFLAGS_SHIM) c_shim/abi_layout_test.c -o $(SHIM_OUT)/abi_layout_test
	$(CC) $(CFLAGS_SHIM) c_shim/conformance.c -o $(SHIM_OUT)/conformance -ldl
	$(CC) $(CFLAGS_SHIM) -fsanitize=address,undefined -fno-omit-frame-pointer c_shim/conformance.c -o $(SHIM_OUT)/conformance-asan -ldl
	@for src in c_shim/*_test.c; do \
	  name=$$(basename $$src .c); [ "$$name" = abi_layout_test ] && continue; \
	  echo "$(CC) $$src -> $(SHIM_OUT)/$$name"; \
	  $(CC) $(CFLAGS_SHIM) $$src -o $(SHIM_OUT)/$$name -ldl -lpthread || exit 1; \
	done

harness:
	@if [ -f nccl-tests-harness/Makefile ]; then $(MAKE) --no-print-directory -C nccl-tests-harness; fi

# Formatting and clippy, warnings as errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# FERROCE_TEST_SOFTROCE=1: the transport's integration tests run the real verbs path over the
# softroce library that `build` made (they skip without it).
test: build
	$(MAKE) --no-print-directory lint
	FERROCE_TEST_SOFTROCE=1 $(CARGO) test --release --workspace
	ci/run-tests.sh

# BASELINE_PLUGIN=/path/to/libnccl-net-X.so: also the side-by-side tables against that plugin.
bench: build
	ci/bench.sh $(if $(BASELINE_PLUGIN),--baseline-plugin $(BASELINE_PLUGIN))

clean:
	$(CARGO) clean
