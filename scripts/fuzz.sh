#!/usr/bin/env bash
# Builds the CPU code with clang under AddressSanitizer + UndefinedBehaviorSanitizer (and libFuzzer
# coverage), runs the CPU test suite in that build, then runs every fuzz target for a bounded time
# on its corpus in fuzz/corpus/<target>. Any sanitizer report, failing test or fuzz finding fails.
#   scripts/fuzz.sh [seconds per target, default 60] [build dir, default build-asan]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
dir=${2:-build-asan}
jobs=${JOBS:-$(nproc)}
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DMXMOE_CUDA=OFF -DMXMOE_SANITIZE=ON -DMXMOE_FUZZ=ON
fi
cmake --build "$dir" -j "$jobs"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== CPU tests under ASan + UBSan"
"$dir/bin/mxmoe_cpu_tests" --gtest_brief=1

for target in json safetensors config index moe_args; do
  corpus=fuzz/corpus/$target
  work=$(mktemp -d)
  echo "== fuzz_$target for ${seconds}s (corpus $corpus, $(ls "$corpus" | wc -l) seeds)"
  # New inputs go to a scratch corpus: the committed one only changes by hand.
  "$dir/bin/fuzz_$target" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$dir/fuzz_${target}_" "$work" "$corpus" 2>&1 | tail -n 12
  rm -rf "$work"
done
echo "fuzz: all targets ran clean"
