# ferroce: the two entry points are `make bench` (the main job) and `make test` (every test).
# Both install the missing system packages they need first (ci/install-deps.sh: `make build` only
# what compiling needs, `make test` and `make bench` what they run too), so a fresh Debian 12
# works. Shipping: `make install`/`uninstall`, `make deb`, `make wheel` (docs/install.md).

CARGO   ?= cargo
CC      ?= cc
RELEASE := target/release
PLUGIN  := $(RELEASE)/libnccl-net-ferroce.so
CFLAGS_SHIM := -O2 -g -Wall -Wextra -Werror -Iinclude
SHIM_OUT := $(RELEASE)/c_shim

# make install: PREFIX and DESTDIR as usual. softroce's libibverbs.so.1 goes to a directory of its
# own, never on the loader's default path: on a host with a real NIC only an explicit
# LD_LIBRARY_PATH may put it before rdma-core's.
PREFIX      ?= /usr/local
LIBDIR      ?= $(PREFIX)/lib
BINDIR      ?= $(PREFIX)/bin
INCLUDEDIR  ?= $(PREFIX)/include
SOFTROCEDIR ?= $(LIBDIR)/ferroce/softroce
HEADERS     := $(wildcard include/ferroce/*.h)
# What install copies, SOURCE:MODE:DESTINATION-DIRECTORY; uninstall removes exactly these.
INSTALL_FILES = $(PLUGIN):644:$(LIBDIR) \
	$(RELEASE)/ferroce-doctor:755:$(BINDIR) \
	$(RELEASE)/softroce/libibverbs.so.1:644:$(SOFTROCEDIR) \
	$(RELEASE)/softroce/softroce-ctl:755:$(SOFTROCEDIR) \
	$(foreach h,$(HEADERS),$(h):644:$(INCLUDEDIR)/ferroce)

.PHONY: all deps build binaries plugin softroce c_shim harness doctor lint test bench mutants clean \
	install uninstall deb wheel packages package-binaries

all: build

# DEPS: the sets of ci/install-deps.sh (build, package, test, bench).
DEPS ?= build
deps:
	@ci/install-deps.sh $(DEPS)

build:
	@ci/install-deps.sh build
	$(MAKE) --no-print-directory binaries

binaries: plugin softroce c_shim harness doctor

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

# Each stage prints "stage NAME: ok (N s)" or FAILED (ci/stage.sh); the first failure stops the
# run. ci/run-tests.sh's "test scripts: N passed, M failed" stays the last line of that form (CI
# reads it); "make test: total N s" comes after it.
# FERROCE_TEST_SOFTROCE=1: the transport's integration tests run the real verbs path over the
# softroce library that `binaries` made; they are #[ignore]d for a plain `cargo test` and fail
# when run without softroce, so make test runs them with --include-ignored (bench_* are benchmarks;
# setup_stress_campaign is the campaign 85-setup-stress.sh runs bounded).
# The stages are one shell line, and a line that names $(MAKE) directly runs even under make -n:
# SUBMAKE keeps `make -n test` a dry run.
SUBMAKE = $(MAKE) --no-print-directory
test:
	@start=$$(date +%s); rc=0; \
	ci/stage.sh deps -- ci/install-deps.sh test && \
	ci/stage.sh build -- $(SUBMAKE) binaries && \
	ci/stage.sh lint -- $(SUBMAKE) lint && \
	ci/stage.sh cargo-test -- env FERROCE_TEST_SOFTROCE=1 $(CARGO) test --release --workspace -- --include-ignored --skip bench_ --skip setup_stress_campaign && \
	ci/stage.sh scripts -- ci/run-tests.sh || rc=$$?; \
	echo "make test: total $$(($$(date +%s) - start)) s"; \
	exit $$rc

# The mutation campaign over the sans-IO cores (docs/mutation.md): cargo-mutants, hours on 2 cores,
# not part of `make test`. MUTANTS_FILES narrows it (module directories or files).
MUTANTS_FILES ?=
mutants:
	ci/mutants.sh $(MUTANTS_FILES)

# BASELINE_PLUGIN=/path/to/libnccl-net-X.so: also the side-by-side tables against that plugin.
bench:
	@ci/install-deps.sh bench
	$(MAKE) --no-print-directory binaries
	ci/bench.sh $(if $(BASELINE_PLUGIN),--baseline-plugin $(BASELINE_PLUGIN))

# Copies what `binaries` built; compiles nothing (run as root after a `make build` as a user).
install:
	@for f in $(INSTALL_FILES); do \
	  src=$${f%%:*}; rest=$${f#*:}; mode=$${rest%%:*}; dir=$${rest#*:}; \
	  [ -e "$$src" ] || { echo "make install: $$src is missing (run make build)" >&2; exit 1; }; \
	  echo "install -m $$mode $$src $(DESTDIR)$$dir/"; \
	  install -d "$(DESTDIR)$$dir" && install -m "$$mode" "$$src" "$(DESTDIR)$$dir/" || exit 1; \
	done

# Removes the files of INSTALL_FILES and the directories only ferroce uses, if empty.
uninstall:
	@for f in $(INSTALL_FILES); do \
	  src=$${f%%:*}; dir=$${f##*:}; \
	  rm -f "$(DESTDIR)$$dir/$${src##*/}" || exit 1; \
	done
	@for d in "$(DESTDIR)$(SOFTROCEDIR)" "$(DESTDIR)$(INCLUDEDIR)/ferroce"; do \
	  [ ! -d "$$d" ] || rmdir --ignore-fail-on-non-empty "$$d"; \
	done
	@[ "$(SOFTROCEDIR)" != "$(LIBDIR)/ferroce/softroce" ] || [ ! -d "$(DESTDIR)$(LIBDIR)/ferroce" ] || \
	  rmdir --ignore-fail-on-non-empty "$(DESTDIR)$(LIBDIR)/ferroce"

# target/ferroce_<version>_<arch>.deb and target/wheels/ferroce-<version>-py3-none-manylinux_*.whl,
# from the release binaries (built first if stale), stripped; see packaging/.
deb: package-binaries
	packaging/deb/build.sh

wheel: package-binaries
	packaging/python/build.sh

# What the packages ship (once for `make deb wheel`), and the tools that package them.
package-binaries:
	@ci/install-deps.sh package
	$(MAKE) --no-print-directory plugin softroce doctor

packages: deb wheel

clean:
	$(CARGO) clean
