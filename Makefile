# Two entry points: `make demo` and `make test`. Both set up everything they need (Debian
# packages, the .venv, the builds) and are idempotent: a second run only re-checks stamps.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
export VIRTUAL_ENV := $(abspath $(VENV))
CARGO ?= cargo

.PHONY: demo test deps venv system-deps build rust-test python-test lint bench-build bench clean

demo: deps
	$(CARGO) run --release -q -p pjrt --example stablehlo_demo

test: deps lint rust-test bench-build python-test

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

python-test: deps
	@if ls tests/python/test_*.py >/dev/null 2>&1; then $(PY) -m pytest -q tests/python; \
	else echo "no Python tests yet"; fi

clean:
	$(CARGO) clean
	rm -rf $(STAMPS)
