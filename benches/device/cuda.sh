#!/usr/bin/env bash
# Runs the engine's Rust benchmarks and tests on a CUDA machine that has Python with
# `jax-cuda13-pjrt` but no Rust: the binaries are built elsewhere (`make device-bins` packs them
# into .devbin/bins.tar.xz). Usage: benches/device/cuda.sh [OUT_DIR]
set -u
out=${1:-${OUT:-/tmp/torch-pjrt-device}}
mkdir -p "$out"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

work=$(mktemp -d)
tar xJf .devbin/bins.tar.xz -C "$work" || exit 1

# The plugin resolves as `cuda` from the Python environment's site-packages.
prefix=$(python3 -c 'import sys; print(sys.prefix)')
export VIRTUAL_ENV=$prefix TORCH_PJRT_PLUGIN=${DEVICE_PLUGIN:-cuda}
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
nvlibs=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=${nvlibs}${LD_LIBRARY_PATH:-}
export CRITERION_HOME=$work/criterion
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  find "$site/jax_plugins" -name 'xla_cuda_plugin.so'
  python3 -m pip show jax-cuda13-pjrt 2>/dev/null | grep -i '^version'
  nproc
} 2>&1 | tee "$out/machine.txt"

echo "== smoke: StableHLO demo on the CUDA plugin"
timeout 120 "$work/stablehlo_demo" 2>&1 | tail -20

bench() {
  local name=$1 limit=$2
  shift 2
  echo "== bench $name ($(elapsed) s in)"
  timeout "$limit" "$work/benches/$name" --bench --noplot "$@" 2>&1 |
    grep -vE '^(Benchmarking|Found|  [0-9]+ \(|Warning|Gnuplot|WARNING)' | tee -a "$out/benches.txt"
}
crit=(--warm-up-time 0.5 --measurement-time 1.5)
# BENCHES picks which to run (all by default; empty for none).
for name in ${BENCHES-engine cold_start cache runtime}; do
  case $name in
    engine) bench engine 150 "${crit[@]}" ;;
    cold_start) bench cold_start 150 "${crit[@]}" ;;
    *) bench "$name" 90 "${crit[@]}" ;;
  esac
done

echo "== tests ($(elapsed) s in)"
export PROPTEST_CASES=${PROPTEST_CASES:-24}
budget=${TEST_BUDGET_S:-420}
for t in "$work"/tests/*; do
  name=$(basename "$t")
  if [ "$(elapsed)" -gt "$budget" ]; then
    echo "$name: not run (time budget spent)" | tee -a "$out/tests.txt"
    continue
  fi
  timeout 90 "$t" --test-threads 8 >"$out/test-$name.log" 2>&1
  rc=$?
  summary=$(grep -E '^test result:' "$out/test-$name.log" | tail -1)
  echo "$name: rc=$rc $summary" | tee -a "$out/tests.txt"
  if [ $rc -ne 0 ]; then
    grep -E '^test .* FAILED$|panicked at' "$out/test-$name.log" | head -8 | tee -a "$out/tests.txt"
  fi
done
# Failing logs only, to stay within what comes back.
for f in "$out"/test-*.log; do
  grep -q '^test result: ok' "$f" && rm -f "$f"
done
tar czf "$out/failed-test-logs.tgz" -C "$out" $(cd "$out" && ls test-*.log 2>/dev/null) 2>/dev/null
rm -f "$out"/test-*.log
echo "== done in $(elapsed) s"
