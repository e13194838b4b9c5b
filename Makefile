# Two entry points: `make demo` and `make test`. Both set up everything they need (Debian
# packages, the .venv, the builds) and are idempotent: a second run only re-checks stamps.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
export VIRTUAL_ENV := $(abspath $(VENV))
CARGO ?= cargo


.PHONY: demo mlp-demo pjrt-demo test wheel upstream-tests upstream-tests-ci upstream-tests-ci-if-present deps venv venv-peer venv-jax system-deps build rust-test python-test python-build lint bench-build bench bench-python bench-criterion clean

# The main job: a small GPT-style language model trained on the CPU and on pjrt in Strict and
# DeferAndFuse, with the loss curves, step times and a PNG (examples/gpt_demo.py).
demo: deps python-build
	$(PY) examples/gpt_demo.py

# A small MLP trained in every mode, Debug included (examples/demo.py).
mlp-demo: deps python-build
	$(PY) examples/demo.py

# The PJRT layer alone: compile and run a StableHLO module on the plugin.
pjrt-demo: deps
	$(CARGO) run --release -q -p pjrt --example stablehlo_demo

# `lint` type-checks every target, benches included (clippy --all-targets), so `test` does not also
# build the benches in release (`make bench-build` does).
test: deps python-build lint rust-test python-test upstream-tests-ci-if-present

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
	$(PIP_TMP) $(PY) -m pip install -q --disable-pip-version-check --no-cache-dir -r requirements.txt
	@touch $@

# pip holds every downloaded wheel (about 3 GiB, torch and its CUDA libraries) until it has installed
# them all; on a short disk that peak fails the install, so the downloads go to RAM when /dev/shm
# has room for them.
SHM_FREE_KIB := $(shell df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $$4}')
PIP_TMP := $(if $(shell [ "$(SHM_FREE_KIB)" -gt 6291456 ] 2>/dev/null && echo y),TMPDIR=/dev/shm,)

lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy -q --workspace --all-targets -- -D warnings

rust-test: deps
	$(CARGO) test -q --workspace

bench-build: deps
	$(CARGO) bench -q --workspace --no-run

# The benchmark suite (benches/python/suite.py): CPU eager, inductor, torch_xla and openxla (from .venv-peer)
# and pjrt in each mode, written to benches/results/latest.md and latest.png; then the criterion
# benches of the engine stages, whose HTML reports land in benches/results/criterion/.
# BENCH_CRITERION=0 skips criterion, BENCH_CRITERION_ARGS passes options to it (e.g.
# "--warm-up-time 1 --measurement-time 2"); BENCH_QUICK=1 and BENCH_REPS=<n> size the Python suite;
# BENCH_PEER=0 skips building .venv-peer (torch_xla is then reported unavailable), BENCH_JAX=0
# skips building .venv-jax (jax.jit is then reported unavailable).
BENCH_CRITERION ?= 1
BENCH_PEER ?= 1
BENCH_JAX ?= 1
bench: deps python-build
	@if [ "$(BENCH_PEER)" != 0 ]; then $(MAKE) --no-print-directory venv-peer || \
		echo "warning: .venv-peer could not be built; torch_xla will be reported unavailable"; fi
	@if [ "$(BENCH_JAX)" != 0 ]; then $(MAKE) --no-print-directory venv-jax || \
		echo "warning: .venv-jax could not be built; jax.jit will be reported unavailable"; fi
	@$(MAKE) --no-print-directory bench-python
	@if [ "$(BENCH_CRITERION)" != 0 ]; then $(MAKE) --no-print-directory bench-criterion; fi

bench-python: deps python-build
	$(PY) benches/python/suite.py --peer-python $(PEER_PY) --jax-python $(JAX_PY)
	$(PY) benches/python/ddp.py

# criterion writes its HTML reports only when it has a plotting backend: gnuplot (Debian).
bench-criterion: deps $(STAMPS)/gnuplot
	@if [ -n "$(BENCH_CRITERION_ARGS)" ]; then \
		$(CARGO) bench --workspace --bench '*' -- $(BENCH_CRITERION_ARGS); \
	else $(CARGO) bench --workspace; fi
	@rm -rf benches/results/criterion
	@mkdir -p benches/results
	@if [ -d target/criterion ]; then cp -r target/criterion benches/results/criterion; \
		echo "criterion reports: benches/results/criterion/report/index.html"; fi

$(STAMPS)/gnuplot:
	@mkdir -p $(STAMPS)
	@if ! command -v gnuplot >/dev/null; then \
		echo "installing Debian package: gnuplot-nox (criterion's HTML reports)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gnuplot-nox >/dev/null; \
	fi
	@touch $@

# torch_xla pins its own torch version, so the peer gets a venv of its own, built only for
# `make bench`.
PEER_VENV := .venv-peer
PEER_PY := $(PEER_VENV)/bin/python
venv-peer: $(STAMPS)/venv-peer
$(STAMPS)/venv-peer: requirements-peer.txt
	@mkdir -p $(STAMPS)
	@test -x $(PEER_PY) || python3 -m venv $(PEER_VENV)
	$(PIP_TMP) $(PEER_PY) -m pip install -q --disable-pip-version-check --no-cache-dir -r requirements-peer.txt
	@touch $@

# JAX with its CPU jaxlib: `jax.jit` of the suite's computations, the ceiling of the same XLA
# CPU compiler; a venv of its own, built only for `make bench`.
JAX_VENV := .venv-jax
JAX_PY := $(JAX_VENV)/bin/python
venv-jax: $(STAMPS)/venv-jax
$(STAMPS)/venv-jax: requirements-jax.txt
	@mkdir -p $(STAMPS)
	@test -x $(JAX_PY) || python3 -m venv $(JAX_VENV)
	$(PIP_TMP) $(JAX_PY) -m pip install -q --disable-pip-version-check --no-cache-dir -r requirements-jax.txt
	@touch $@

# The OpInfo sweep (the longest file, mostly XLA compile time) runs beside the rest of the suite:
# on a 2-core machine the two overlap, and its log is printed after the rest.
python-test: deps python-build
	@mkdir -p $(STAMPS)
	@rc=0; opinfo_rc=0; \
	$(PY) -m pytest -q tests/python/test_opinfo.py > $(STAMPS)/opinfo-test.log 2>&1 & opinfo=$$!; \
	$(PY) -m pytest -q tests/python --ignore=tests/python/test_opinfo.py || rc=$$?; \
	wait $$opinfo || opinfo_rc=$$?; \
	echo "--- tests/python/test_opinfo.py"; cat $(STAMPS)/opinfo-test.log; \
	test $$rc = 0 && test $$opinfo_rc = 0

# PyTorch's own device-generic test files (../shared/pytorch-tests/v2.4.0) on pjrt in Strict,
# Debug and DeferAndFuse, judged against tests/upstream/expected_failures.toml (tests/upstream/run.py;
# UPSTREAM_ARGS passes options, e.g. "--files test_indexing.py --modes strict"). `test` runs the
# CI subset.
UPSTREAM_ARGS ?=
upstream-tests: deps python-build
	$(PY) tests/upstream/run.py $(UPSTREAM_ARGS)

# The subset CI runs: about four minutes on a 2-core machine.
upstream-tests-ci: deps python-build
	$(PY) tests/upstream/run.py --ci $(UPSTREAM_ARGS)

# `make test` runs the subset where PyTorch's test files are present beside the checkout (they are
# not part of it); elsewhere it says it did not run them.
UPSTREAM_FILES ?= ../shared/pytorch-tests/v2.4.0
upstream-tests-ci-if-present: deps python-build
	@if [ -d "$(UPSTREAM_FILES)" ]; then \
		$(MAKE) --no-print-directory upstream-tests-ci UPSTREAM_ARGS="$(UPSTREAM_ARGS) $(abspath $(UPSTREAM_FILES))"; \
	else \
		echo "upstream tests not run: $(UPSTREAM_FILES) (PyTorch's test files) is not here"; \
	fi

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

# A wheel of the package as built here: the engine library and the C++ extension inside
# (the extension links in place from python/build, so this takes seconds after python-build).
wheel: python-build
	rm -f dist/torch_pjrt-*.whl
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pip wheel -q --disable-pip-version-check \
		--no-build-isolation --no-deps -w dist ./python
	@ls dist/torch_pjrt-*.whl

clean:
	$(CARGO) clean
	rm -rf $(STAMPS)
