# Two entry points: `make demo` and `make test`. Both set up everything they need (Debian
# packages, the .venv, the builds) and are idempotent: a second run only re-checks stamps.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
export VIRTUAL_ENV := $(abspath $(VENV))
CARGO ?= cargo


.PHONY: demo pjrt-demo test deps venv system-deps build rust-test python-test python-build lint bench-build bench clean

# The main job: an MLP trained on pjrt in all three modes and on the CPU (examples/demo.py).
demo: deps python-build
	$(PY) examples/demo.py

# The PJRT layer alone: compile and run a StableHLO module on the plugin.
pjrt-demo: deps
	$(CARGO) run --release -q -p pjrt --example stablehlo_demo

test: deps python-build lint rust-test bench-build python-test

deps: system-deps venv

# bindgen needs libclang; a C compiler is needed for the fake-plugin tests.
system-deps: $(STAMPS)/system-deps
$(STAMPS)/system-deps:
	@mkdir -p $(STAMPS)
	@if ! dpkg -s libclang-dev >/dev/null 2>&1 || ! command -v cc >/dev/null; then \
		echo "installing Debian packages: libclang-dev build-essential"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libclang-dev build-essential >/dev/null; \
	fi
	@touch $@

venv: $(STAMPS)/venv
$(STAMPS)/venv: requirements.txt
	@mkdir -p $(STAMPS)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy -q --workspace --all-targets -- -D warnings

rust-test: deps
	$(CARGO) test -q --workspace

bench-build: deps
	$(CARGO) bench -q --workspace --no-run

bench: deps
	$(CARGO) bench --workspace

python-test: deps python-build
	@if ls tests/python/test_*.py >/dev/null 2>&1; then $(PY) -m pytest -q tests/python; \
	else echo "no Python tests yet"; fi

# The PyTorch plugin: the engine library (cargo) copied next to the package, the package installed
# editable into the .venv (metadata only: it carries the torch.backends entry point), and the C++
# extension torch_pjrt._C built in place with ninja (incremental, in python/build).
PY_PKG := python/torch_pjrt
PY_EXT_SOURCES := $(wildcard $(PY_PKG)/csrc/*.cpp $(PY_PKG)/csrc/*.h $(PY_PKG)/csrc/*.py) \
	torch-glue/include/torch_pjrt_engine.h python/setup.py

python-build: deps
	$(CARGO) build --release -q -p torch-glue
	@cmp -s target/release/libtorch_glue.so $(PY_PKG)/libtorch_glue.so || { \
		cp target/release/libtorch_glue.so $(PY_PKG)/.libtorch_glue.so.tmp && \
		mv -f $(PY_PKG)/.libtorch_glue.so.tmp $(PY_PKG)/libtorch_glue.so; }
	@ls $(PY_PKG)/_C*.so >/dev/null 2>&1 || rm -f $(STAMPS)/python-ext
	@$(MAKE) --no-print-directory $(STAMPS)/python-install $(STAMPS)/python-ext

$(STAMPS)/python-install: python/setup.py python/pyproject.toml $(STAMPS)/venv
	@mkdir -p $(STAMPS)
	TORCH_PJRT_METADATA_ONLY=1 $(PY) -m pip install -q --disable-pip-version-check \
		--no-build-isolation --no-deps -e python
	@touch $@

$(STAMPS)/python-ext: $(PY_EXT_SOURCES) $(STAMPS)/python-install
	cd python && PATH="$(abspath $(VENV))/bin:$$PATH" $(abspath $(PY)) setup.py -q build_ext --inplace
	@touch $@

clean:
	$(CARGO) clean
	rm -rf $(STAMPS)
