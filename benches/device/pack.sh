#!/usr/bin/env bash
# Builds the Rust benchmarks and the engine's tests in release and packs them, stripped, into
# .devbin/bins.tar.xz for benches/device/cuda.sh on a machine without Rust.
set -euo pipefail
exes() {
  cargo "$@" --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p'
}
stage=$(mktemp -d)
mkdir -p "$stage/tests" "$stage/benches"
cargo test --release --no-run -p torch-glue -p compile -p pjrt >/dev/null
cargo bench --no-run -p pjrt -p compile -p torch-glue >/dev/null
cargo build --release -p pjrt --example stablehlo_demo
for exe in $(exes test --release --no-run -p torch-glue -p compile -p pjrt | grep /deps/); do
  name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
  # Snapshot tests read their snapshots from this checkout; the C program test needs a compiler.
  # The fake-plugin test builds a C library.
  case $name in region_snapshots | views_hlo_snapshots | c_program | header | fake_plugin) continue ;; esac
  # Unit tests of the library crates share names with their crates' benches; keep them apart.
  case $exe in */deps/pjrt-* | */deps/compile-*) name=lib_$name ;; esac
  cp "$exe" "$stage/tests/$name"
done
for exe in $(exes bench --no-run -p pjrt -p compile -p torch-glue); do
  name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
  case $name in runtime | cache | cold_start | engine) cp "$exe" "$stage/benches/$name" ;; esac
done
cp target/release/examples/stablehlo_demo "$stage/"
strip "$stage"/tests/* "$stage"/benches/* "$stage/stablehlo_demo"
mkdir -p .devbin
tar cJf .devbin/bins.tar.xz -C "$stage" tests benches stablehlo_demo
rm -rf "$stage"
ls -la .devbin/bins.tar.xz
