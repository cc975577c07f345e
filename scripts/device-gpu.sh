#!/usr/bin/env bash
# On the GPU machine (no installs there): configure for sm_90a, build the GPU suite and the
# CLI (its `mxmoe bench` is the benchmark), check registers/SASS, run the GPU tests, a
# compute-sanitizer pass on a small case, and the benchmark. Full logs go to $OUT (or
# ./device-out); a short table is printed last.
#   scripts/device-gpu.sh [all|build|test|sanitize|bench|profile|bench2|kprofile|dprofile|sprofile|sm120|ab|phases|pipes|timeline] ...
#   (default: all; sprofile, per-instruction stall samples, sm120, the SM120 path in emulation
#   and its sm_120a SASS, ab, a compile-time variant against the default, phases, the GEMM
#   CTAs' cycles by phase, pipes, the GEMM kernels' pipe and issue shares, and timeline, a call's
#   routing / GEMM / combine times from CUDA events, only when named)
#   EXTRA_CUDA_FLAGS adds nvcc flags (e.g. -DMXMOE_DEBUG_MBAR_TIMEOUT); GTEST_FILTER=... narrows the suite; BENCH_ARGS="--shapes kimi-k3 --tokens 1,8" narrows the
#   benchmark (default: the whole sweep of `make bench`, with the PyTorch peer and the report).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
STAGES=${*:-all}
BUILD=build-gpu
GEMM_KERNELS='Moe(Gemm|Wgmma|Decode)Kernel'  # the fused GEMMs' kernel names, as a regex (FC1 launches first; n8f's MoeDecodeKernel runs both)
# (named to sort first: the device tool returns only the first few files of $OUT in name order)
SUMMARY="$OUT/00summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
named() { [[ " $STAGES " == *" $1 "* ]]; }  # stage $1 was asked for by name
want() { named all || named "$1"; }
secs() { date +%s; }
# configure_sm90 DIR LOG [FLAGS [SOURCE]]: the release tree for sm_90a in DIR, of the sources in
# SOURCE (default: this checkout), with -Xptxas -v, EXTRA_CUDA_FLAGS and FLAGS as nvcc flags (the
# build stage's tree, and both trees of `ab`).
configure_sm90() {
  cmake -S "${4:-.}" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA=ON -DMXMOE_CUDA_ARCHS=90a \
    -DCMAKE_CUDA_FLAGS="-Xptxas -v ${EXTRA_CUDA_FLAGS:-} ${3:-}" >"$2" 2>&1
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$SUMMARY"

if want build || want test || want sanitize || want bench || want profile || want bench2 || want kprofile || want dist \
   || named sprofile || named pipes || named timeline; then
  t0=$(secs)
  configure_sm90 "$BUILD" "$OUT/configure.log" || { note "configure FAILED"; tail -20 "$OUT/configure.log"; exit 1; }
  cmake --build "$BUILD" -j16 --target mxmoe_gpu_tests mxmoe_cli >"$OUT/build.log" 2>&1 \
    || { note "build FAILED"; grep -E "error" "$OUT/build.log" | head -20; exit 1; }
  note "build: ok in $(( $(secs) - t0 )) s"
  # Registers / spills of the GEMM kernels, and the SASS instructions they are meant to use.
  grep -A3 -E "MoeGemmKernel|MoeWgmmaKernel|MoeDecodeKernel" "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c | sed 's/^/ptxas: /' | tee -a "$SUMMARY"
  obj=$(find "$BUILD" -name 'moe_gemm_n8.cu.o' | head -1)
  if [ -n "$obj" ] && command -v cuobjdump >/dev/null; then
    for f in $(find "$BUILD" -name 'moe_gemm_n*.cu.o' -o -name 'moe_wgmma_*.cu.o' -o -name 'moe_decode.cu.o'); do
      cuobjdump -sass "$f" > "$OUT/sass_$(basename "$f" .cu.o).txt" 2>&1
      note "sass $(basename "$f" .cu.o): HMMA $(grep -c HMMA "$OUT/sass_$(basename "$f" .cu.o).txt") HGMMA $(grep -c HGMMA "$OUT/sass_$(basename "$f" .cu.o).txt") LDSM $(grep -c LDSM "$OUT/sass_$(basename "$f" .cu.o).txt") LDGSTS $(grep -c LDGSTS "$OUT/sass_$(basename "$f" .cu.o).txt") local(LDL/STL) $(grep -cE 'LDL|STL' "$OUT/sass_$(basename "$f" .cu.o).txt")"
    done
  fi
fi

# "SM clock MHz min / median / max, power W median" of an nvidia-smi log of "clock, power" lines
# (samples with the GPU busy, clock above 1000 MHz; "no samples" otherwise).
ab_clock_summary() {
  local c p n
  c=$(awk -F', *' '$1 + 0 > 1000 { print $1 + 0 }' "$1" | sort -n)
  p=$(awk -F', *' '$1 + 0 > 1000 { print $2 + 0 }' "$1" | sort -n)
  n=$(printf '%s\n' "$c" | grep -c .)
  if [ "$n" = 0 ]; then echo "clock: no samples"; return; fi
  echo "clock MHz $(printf '%s\n' "$c" | head -1) / $(printf '%s\n' "$c" | sed -n "$(( (n + 1) / 2 ))p") / $(printf '%s\n' "$c" | tail -1), power W $(printf '%s\n' "$p" | sed -n "$(( (n + 1) / 2 ))p") ($n samples)"
}

# Runs "$@" (a test binary) for at most $1 seconds with its output in $2. Every 20 s it notes the GPU's
# utilization and the test running; at the deadline it saves every host thread's stack (gdb) and
# the GPU's state before killing it, so a stall says whether the host or the device was waiting.
watched() {
  local limit=$1 log=$2; shift 2
  "$@" >"$log" 2>&1 &
  local pid=$! t=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2; t=$((t + 2))
    if (( t % 20 == 0 )); then
      echo "watch t=${t}s gpu=$(nvidia-smi --query-gpu=utilization.gpu,power.draw --format=csv,noheader 2>/dev/null) cpu%=$(ps -o %cpu= -p "$pid" 2>/dev/null) test=$(grep -E '^\[ RUN' "$log" | tail -1 | awk '{print $NF}')" >>"$OUT/watch.log"
    fi
    if (( t >= limit )); then
      note "STALL: $(grep -E '^\[ RUN' "$log" | tail -1 | awk '{print $NF}') still running after ${t} s; host stacks in stall_stacks.txt, GPU in watch.log"
      nvidia-smi >>"$OUT/watch.log" 2>&1
      local dbg; dbg=$(command -v gdb || command -v cuda-gdb)
      [ -n "$dbg" ] && timeout 60 "$dbg" -batch -p "$pid" -ex "thread apply all bt 12" >"$OUT/stall_stacks.txt" 2>&1
      kill -9 "$pid"; wait "$pid" 2>/dev/null
      return 124
    fi
  done
  wait "$pid"
}

if want test; then
  t0=$(secs)
  watched "${TEST_TIMEOUT:-240}" "$OUT/tests.log" "$BUILD/bin/mxmoe_gpu_tests" --gtest_filter="${GTEST_FILTER:-*}"
  rc=$?
  note "tests: rc=$rc in $(( $(secs) - t0 )) s; $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] [A-Z]" "$OUT/tests.log" | sort -u | head -20 | tee -a "$SUMMARY"
  grep -E "Failure|error:" -A4 "$OUT/tests.log" | head -60
  grep -E "^differential:|^stress:|^WorkspaceSize|^Run T=|^\[ router \]" "$OUT/tests.log" | head -12 | tee -a "$SUMMARY"
fi

if want sanitize; then
  t0=$(secs)
  f="CudaMoeSmall.OutOfRangeIdsAreSkipped:CudaMoeSmall.PrequantizedInputMatchesReference"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/bin/mxmoe_gpu_tests" --gtest_filter="$f" >"$OUT/memcheck.log" 2>&1
  note "compute-sanitizer memcheck ($f): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/bin/mxmoe_gpu_tests" --gtest_filter="CudaMoeSmall.OutOfRangeIdsAreSkipped" >"$OUT/racecheck.log" 2>&1
  note "compute-sanitizer racecheck (CudaMoeSmall.OutOfRangeIdsAreSkipped): rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1) in $(( $(secs) - t0 )) s"
  # Reads of memory nobody wrote (workspace padding, sort scratch), and barrier misuse; then 8 random
  # differential configurations (seeds 4818..4825: K not a multiple of 64, TP, EP, bad ids, fp8 x,
  # every kind) under memcheck and initcheck.
  t0=$(secs)
  f="CudaMoeSmall.OutOfRangeIdsAreSkipped:CudaMoeSmall.PrequantizedInputMatchesReference:CudaMoeErrors.*"
  timeout 60 compute-sanitizer --tool initcheck --error-exitcode 9 "$BUILD/bin/mxmoe_gpu_tests" --gtest_filter="$f" >"$OUT/initcheck.log" 2>&1
  note "compute-sanitizer initcheck ($f): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/initcheck.log" | tail -1)"
  timeout 45 compute-sanitizer --tool synccheck --error-exitcode 9 "$BUILD/bin/mxmoe_gpu_tests" --gtest_filter="CudaMoeSmall.OutOfRangeIdsAreSkipped" >"$OUT/synccheck.log" 2>&1
  note "compute-sanitizer synccheck (CudaMoeSmall.OutOfRangeIdsAreSkipped): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/synccheck.log" | tail -1)"
  for tool in memcheck initcheck; do
    MXMOE_DIFF_SEED=4818 MXMOE_DIFF_CONFIGS=8 timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/bin/mxmoe_gpu_tests" --gtest_filter="Differential.*" >"$OUT/diff_$tool.log" 2>&1
    note "compute-sanitizer $tool (Differential, 8 configs from seed 4818): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/diff_$tool.log" | tail -1)"
  done
  note "sanitize (initcheck, synccheck, differential): $(( $(secs) - t0 )) s"
fi

if want bench; then
  # The sweep, the PyTorch and Triton peers on the same inputs and the report (bench/run.sh, as
  # `make bench`).
  t0=$(secs)
  timeout "${BENCH_TIMEOUT:-360}" bash bench/run.sh "$BUILD" "$OUT/bench" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  note "bench: rc=$? in $(( $(secs) - t0 )) s"
  grep -E "^device|FAILED|^workspace|^  rows|^== make bench" "$OUT/bench.log" | tee -a "$SUMMARY" >/dev/null
  [ -f "$OUT/bench/report.txt" ] && tee -a "$SUMMARY" < "$OUT/bench/report.txt" >/dev/null
fi

if want profile; then
  # One FC1 launch of the prefill config under Nsight Compute (clocks left alone).
  t0=$(secs)
  timeout 120 ncu --clock-control none -k regex:MoeGemmKernel -c 1 --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section ComputeWorkloadAnalysis "$BUILD/bin/mxmoe" bench --shapes kimi-k3 --routing uniform \
    --experts 128 --tokens 4096 --repeats 1 --warmup 0 --no-graph \
    >"$OUT/ncu.log" 2>&1
  note "ncu: rc=$? in $(( $(secs) - t0 )) s"
  grep -E "Compute \(SM\) Throughput|Memory Throughput|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A" "$OUT/ncu.log" | head -30 | tee -a "$SUMMARY" >/dev/null
fi

if want kprofile; then
  # Kernel durations of the prefill GEMMs per config (Nsight Compute, clocks left alone): FC1 and
  # FC2 of the bench's check run, Kimi-K3 shape with 128 experts, T = 4096.
  for cfg in ${BENCH_CONFIGS:-n32 wg128 wg128d wg128d8}; do
    MXMOE_GEMM_CONFIG=$cfg timeout 90 ncu --clock-control none -k regex:"$GEMM_KERNELS" --metrics gpu__time_duration.sum -c 2 \
      "$BUILD/bin/mxmoe" bench --shapes kimi-k3 --routing uniform --experts 128 --tokens 4096 --repeats 1 --warmup 0 --no-graph \
      >"$OUT/kprofile_$cfg.log" 2>&1
    note "kernel durations ($cfg, 128 experts, T = 4096): rc=$? $(grep -E 'gpu__time_duration.sum' "$OUT/kprofile_$cfg.log" | awk '{print $NF " " $(NF-1)}' | tr '\n' ' ')"
  done
fi
if want dprofile; then
  # Decode: every kernel of one call (Nsight Compute, clocks left alone, caches flushed between
  # kernels as the bench flushes L2): duration and DRAM throughput, T = 1 and 8, 896 experts
  # (DPROFILE_TOKENS; DPROFILE_KERNELS=regex keeps the kernels whose names match, e.g. not the
  # weight repack; DPROFILE_COUNT=N stops after N of them, e.g. before the check's reference).
  for t in ${DPROFILE_TOKENS:-1 8}; do
    timeout 120 ncu --clock-control none ${DPROFILE_COUNT:+-c $DPROFILE_COUNT} ${DPROFILE_KERNELS:+-k regex:$DPROFILE_KERNELS} --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
      "$BUILD/bin/mxmoe" bench --shapes kimi-k3 --routing uniform --tokens "$t" --repeats 1 --warmup 0 --no-graph \
      >"$OUT/dprofile_$t.log" 2>&1
    note "decode kernels (T = $t): rc=$?"
    awk '/^  [A-Za-z_].*\(/ { name = $1 } /gpu__time_duration.sum|dram__bytes_read.sum|dram__throughput|launch__grid_size/ { printf "  %s %s %s %s\n", substr(name, 1, 60), $1, $(NF-1), $NF }' \
      "$OUT/dprofile_$t.log" | tail -40 | tee -a "$SUMMARY" >/dev/null
  done
fi
if named timeline; then
  # Where a call's time goes without a profiler (MXMOE_STAGE_TIMES=1, cuda_moe.cu: CUDA events
  # between the stages, each eager call waiting for its stream): for each config in
  # TIMELINE_CONFIGS (auto: the heuristics') the medians over the bench's calls of the routing,
  # GEMM and combine times, per T in TIMELINE_TOKENS and shape in TIMELINE_SHAPES.
  for cfg in ${TIMELINE_CONFIGS:-auto n8f}; do
    forced=(-u MXMOE_GEMM_CONFIG)
    [ "$cfg" = auto ] || forced=(MXMOE_GEMM_CONFIG="$cfg")
    log="$OUT/timeline_${cfg//\//-}.log"
    env "${forced[@]}" MXMOE_STAGE_TIMES=1 timeout "${TIMELINE_TIMEOUT:-200}" "$BUILD/bin/mxmoe" bench \
      --shapes "${TIMELINE_SHAPES:-kimi-k3}" --routing uniform --tokens "${TIMELINE_TOKENS:-1,2,8}" --repeats 30 --no-graph \
      >"$log" 2>&1
    note "timeline ($cfg): rc=$?"
    python3 - "$log" <<'PY' | tee -a "$SUMMARY"
import re, statistics, sys
rows = {}
pat = re.compile(r"mxmoe stages: T=(\d+) (.*): routing ([\d.]+) us, GEMMs ([\d.]+) us, combine ([\d.]+) us, total ([\d.]+) us")
for line in open(sys.argv[1], errors="replace"):
    m = pat.match(line)
    if m:
        rows.setdefault((int(m[1]), m[2]), []).append([float(m[i]) for i in (3, 4, 5, 6)])
for (t, plan), v in sorted(rows.items()):
    med = [statistics.median(c) for c in zip(*v)]
    print(f"  T={t} {plan}: routing {med[0]:.1f}, GEMMs {med[1]:.1f}, combine {med[2]:.1f}, total {med[3]:.1f} us "
          f"(medians of {len(v)} calls)")
PY
  done
fi
if want python; then
  # The CUDA wheel and the whole pytest suite (CUDA, torch, the router, the FlashInfer entry point).
  t0=$(secs)
  MXMOE_PYTHON_CUDA=1 MXMOE_CUDA_ARCHS=90a timeout "${PY_TIMEOUT:-300}" make test-python >"$OUT/python.log" 2>&1
  note "python (CUDA wheel): rc=$? in $(( $(secs) - t0 )) s; $(grep -E '[0-9]+ (passed|failed)' "$OUT/python.log" | tail -1)"
  grep -E "^FAILED|Error" "$OUT/python.log" | head -10 | tee -a "$SUMMARY"
fi
if want dist; then
  t0=$(secs)
  { cmake --build "$BUILD" -j16 --target mxmoe_dist && ctest --test-dir "$BUILD" -R '^dist\.' --output-on-failure; } >"$OUT/dist.log" 2>&1
  note "dist: rc=$? in $(( $(secs) - t0 )) s; $(grep -E 'tests passed|tests failed' "$OUT/dist.log" | tail -1)"
  grep -E "max relative error|result:|all-reduce" "$OUT/dist.log" | head -8 | tee -a "$SUMMARY"
fi
if want bench2; then
  # Prefill with each forced GEMM config (BENCH_CONFIGS), against the heuristics' choice above.
  for cfg in ${BENCH_CONFIGS:-n32 wg64 wg128}; do
    t0=$(secs)
    MXMOE_GEMM_CONFIG=$cfg timeout 150 "$BUILD/bin/mxmoe" bench --shapes kimi-k3 --routing uniform --tokens ${BENCH2_TOKENS:-1024,4096,16384} 2>&1 | tee "$OUT/bench_$cfg.log" >/dev/null
    note "bench (forced $cfg): rc=$? in $(( $(secs) - t0 )) s"
    grep -E "^kimi-k3 " "$OUT/bench_$cfg.log" | sed "s/^/$cfg: /" | tee -a "$SUMMARY" >/dev/null
  done
fi

# Not part of `all`: `scripts/device-gpu.sh build sprofile`. Where the FC1 GEMM kernel's warps
# stall, per SASS instruction (Nsight Compute's PC sampling; clocks left alone), Kimi-K3 shape with
# SPROFILE_EXPERTS experts (default 128: full 128-token tiles; 896 for the benchmark's shape), at
# T = SPROFILE_TOKENS (default 4096), the kernel the environment picks (MXMOE_FC1_PERSISTENT,
# MXMOE_GEMM_CONFIG, default wg128; e.g. SPROFILE_EXPERTS=896 SPROFILE_TOKENS=1024
# MXMOE_GEMM_CONFIG=n32 for the mma.sync kernel at T = 1024): $OUT/sprofile.csv, and the
# instructions with the most samples (scripts/sprofile_top.py, which also reads the CSV on any
# machine). First run on the device in perf-log v8.
if named sprofile; then
  t0=$(secs)
  rep=/tmp/mxmoe_sprofile
  MXMOE_GEMM_CONFIG=${MXMOE_GEMM_CONFIG:-wg128} timeout 200 ncu --clock-control none -k regex:"$GEMM_KERNELS" -c 1 \
    --section SourceCounters --section WarpStateStats -f -o "$rep" \
    "$BUILD/bin/mxmoe" bench --shapes kimi-k3 --routing uniform --experts "${SPROFILE_EXPERTS:-128}" \
    --tokens "${SPROFILE_TOKENS:-4096}" --repeats 1 --warmup 0 --no-graph >"$OUT/sprofile_run.log" 2>&1
  note "sprofile run: rc=$?"
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$OUT/sprofile.csv" 2>"$OUT/sprofile_err.log"
  note "sprofile export: rc=$? $(wc -l <"$OUT/sprofile.csv") lines in $(( $(secs) - t0 )) s"
  python3 scripts/sprofile_top.py "$OUT/sprofile.csv" 40 | tee -a "$SUMMARY"
fi

# Not part of `all`: `scripts/device-gpu.sh phases`. Where the GEMM kernels' CTAs spend their
# cycles (src/cuda/sm90/phase_timing.cuh): a tree built with -DMXMOE_PHASE_TIMING, then for each
# token count in PHASE_TOKENS (default 1 1024 4096 16384: n8c2, n32, wg128d3x3) one process of the
# Kimi-K3 layer (uniform; the heuristics' config unless MXMOE_GEMM_CONFIG says otherwise), whose
# per-GEMM lines it keeps.
if named phases; then
  t0=$(secs)
  configure_sm90 "$BUILD-phases" "$OUT/phases_configure.log" "-DMXMOE_PHASE_TIMING" \
    && cmake --build "$BUILD-phases" -j16 --target mxmoe_cli >"$OUT/phases_build.log" 2>&1
  rc=$?
  note "phases build: rc=$rc in $(( $(secs) - t0 )) s"
  if [ "$rc" = 0 ]; then
    for t in ${PHASE_TOKENS:-1 1024 4096 16384}; do
      timeout 120 "$BUILD-phases/bin/mxmoe" bench --shapes kimi-k3 --routing uniform --tokens "$t" --check-tokens 1 \
        >"$OUT/phases_$t.log" 2>&1
      note "phases T = $t: rc=$?"
      grep -E "^kimi-k3 |mxmoe phase timing" "$OUT/phases_$t.log" | tee -a "$SUMMARY" >/dev/null
    done
  fi
fi

# Not part of `all`: `scripts/device-gpu.sh pipes` (it builds the default tree). What holds the GEMM kernels at the
# benchmark's shape: for each T in PIPES_TOKENS (default 1 1024 4096), FC1 and FC2 of one call of the
# Kimi-K3 layer (896 experts, uniform) under Nsight Compute, for each config in PIPES_CONFIGS
# (default "auto", the heuristics' choice; names as MXMOE_GEMM_CONFIG takes them, e.g.
# PIPES_CONFIGS="auto wg32x2d"): duration, DRAM throughput, issue slots busy, warps per scheduler,
# and the active cycles of every tensor, FMA, ALU and shared-memory pipe the machine's ncu knows
# (`ncu --query-metrics`: the tensor pipes' names differ between mma.sync and wgmma), as shares of
# their peaks. perf-log v17 says what each reading would decide.
if named pipes; then
  t0=$(secs)
  base="launch__grid_size,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
  base+=",sm__inst_issued.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active"
  ncu --query-metrics >"$OUT/pipes_query.log" 2>&1
  metrics=$base
  for m in $(awk '{print $1}' "$OUT/pipes_query.log" \
             | grep -E '^sm__(pipe_(tensor[a-z_]*|alu|fma|fmaheavy|fmalite|fp16|shared)_cycles_active)$' | sort -u); do
    metrics+=",$m.avg.pct_of_peak_sustained_active"
  done
  for cfg in ${PIPES_CONFIGS:-auto}; do
    # (auto: the heuristics' choice, whatever MXMOE_GEMM_CONFIG this shell exports)
    forced=(-u MXMOE_GEMM_CONFIG)
    [ "$cfg" = auto ] || forced=(MXMOE_GEMM_CONFIG="$cfg")
    for t in ${PIPES_TOKENS:-1 1024 4096}; do
      log="$OUT/pipes_${cfg//\//-}_$t.log"  # (an FC1/FC2 pair names no subfolder)
      set_used=listed
      for m in "$metrics" "$base"; do  # (the listed names, or the base set if ncu refuses one of them)
        env "${forced[@]}" timeout 150 ncu --clock-control none -k regex:"$GEMM_KERNELS" -c 2 --metrics "$m" \
          "$BUILD/bin/mxmoe" bench --shapes kimi-k3 --routing uniform --tokens "$t" --repeats 1 --warmup 0 \
          --no-graph --check-tokens 1 >"$log" 2>&1
        rc=$?
        grep -qiE 'failed to find metric|unknown metric|invalid metric' "$log" || break
        set_used="base only (ncu refused a pipe metric; see $log)"
      done
      note "pipes ($cfg, T = $t): rc=$rc, metrics: $set_used"
      # The first kernel profiled is FC1, the second FC2 (the call's launch order).
      # (only the kernels' header lines: the bench's own indented lines hold parentheses too)
      awk -v kernels="$GEMM_KERNELS" '$0 ~ ("^  [A-Za-z_].*" kernels ".*[(]") { ++k; name = $0 ~ /MoeDecodeKernel/ ? "FC1+FC2 #" k : k == 1 ? "FC1" : k == 2 ? "FC2" : "kernel" k }
           / (launch|gpu|dram|sm|smsp)__[a-z_.]+ / { printf "  %s %s %s\n", name, $1, $NF }' \
        "$log" | tee -a "$SUMMARY" >/dev/null
    done
  done
  note "pipes: $(( $(secs) - t0 )) s"
fi

# Not part of `all`: `AB_FLAGS=-DSOME_MACRO scripts/device-gpu.sh ab`. An A/B of a
# compile-time variant in one session: $BUILD as the build stage makes it and $BUILD-ab-ab with
# AB_FLAGS added, side by side; AB_FILTER's GPU tests on the variant (default: every GEMM config and
# the small shapes against the CPU reference; '-*' for none); then the layers AB_SHAPES (default
# kimi-k3; a list as `mxmoe bench --shapes` takes) at AB_TOKENS (default 1, 1024, 4096) in the order
# base, variant, variant, base, every row checked against the unfused GPU reference first (perf-log
# v11.2). AB_BASE_SRC=DIR builds the base from the sources in DIR instead (another commit:
# `scripts/ab-ref.sh REF` exports one into .ab_ref, which the device call then carries);
# AB_ENV="VAR=value ..." is the variant rows' environment (split at spaces; no glob characters). With
# AB_ENV alone the variant runs on the base's tree, built once.
# Several variants in one call: AB_VARIANTS="NAME[:flags=F,F...][:env=V=x,V=y...][:tests=T,T...] ...",
# e.g. AB_VARIANTS="mux:flags=-DMXMOE_KB_MUX=1 warp:env=MXMOE_WARP_ROUTE=1:tests=CudaMoeSmall.*"
# (commas stand for spaces within flags and env, for ':' between gtest patterns within tests;
# tests=-* runs none; default AB_FILTER); AB_FLAGS / AB_ENV alone are the one variant "ab". Each
# variant with flags gets a tree of its own, built beside the base (variants with the same flags
# share one); the tests run on each variant; the rows go base, v1 .. vn, vn .. v1, base.
# AB_ROW_TIMEOUT (default 150 s) bounds each row's `mxmoe bench`.
if named ab; then
  [ -n "${AB_FLAGS:-}${AB_BASE_SRC:-}${AB_ENV:-}${AB_VARIANTS:-}" ] ||
    { note "ab: set AB_FLAGS, AB_ENV, AB_VARIANTS or AB_BASE_SRC"; exit 1; }
  [ -z "${AB_BASE_SRC:-}" ] || [ -f "$AB_BASE_SRC/CMakeLists.txt" ] || { note "ab: no sources in $AB_BASE_SRC"; exit 1; }
  t0=$(secs)
  rm -f "$OUT"/ab_rc_*
  names=() vflags=() venvs=() vtests=()
  if [ -n "${AB_VARIANTS:-}" ]; then
    [ -z "${AB_FLAGS:-}${AB_ENV:-}" ] || { note "ab: AB_VARIANTS replaces AB_FLAGS and AB_ENV: set one of them"; exit 1; }
    set -f  # (no globbing of the specs' flags)
    for spec in $AB_VARIANTS; do
      name=${spec%%:*} f="" e="" tf=${AB_FILTER:-}
      IFS=: read -ra fields <<<"${spec#"$name"}"
      for field in "${fields[@]}"; do
        case "$field" in
          flags=*) f=${field#flags=} ;;
          env=*) e=${field#env=} ;;
          tests=*) tf=${field#tests=} ;;
          "") ;;
          *) note "ab: variant $name: unknown field '$field'"; exit 1 ;;
        esac
      done
      [ "$name" != base ] || { note "ab: 'base' is the base's name, not a variant's"; exit 1; }
      names+=("$name") vflags+=("${f//,/ }") venvs+=("${e//,/ }") vtests+=("${tf//,/:}")
    done
    set +f
  else
    names=(ab) vflags=("${AB_FLAGS:-}") venvs=("${AB_ENV:-}") vtests=("${AB_FILTER:-}")
  fi
  # Trees: the base's ($BUILD, or $BUILD-ref for another commit's sources: a CMake tree stays tied to
  # its sources); a variant with flags $BUILD-ab-NAME, or the tree of an earlier variant with the
  # same flags; one without, this checkout's default tree.
  base_tree=$BUILD
  [ -z "${AB_BASE_SRC:-}" ] || base_tree=$BUILD-ref
  vtrees=()
  for i in "${!names[@]}"; do
    tree=$BUILD
    if [ -n "${vflags[$i]}" ]; then
      tree="$BUILD-ab-${names[$i]}"
      for (( j = 0; j < i; ++j )); do [ "${vflags[$j]}" = "${vflags[$i]}" ] && { tree=${vtrees[$j]}; break; }; done
    fi
    vtrees+=("$tree")
  done
  # A tree of another commit's sources is built afresh: the copy to this machine need not keep
  # the files' times, and a tree left by an earlier call may hold another commit.
  [ -z "${AB_BASE_SRC:-}" ] || rm -rf "$base_tree"
  # Each distinct tree once, all at the same time: "tree|flags|sources".
  builds=("$base_tree||${AB_BASE_SRC:-.}")
  for i in "${!names[@]}"; do
    dup=0
    for b in "${builds[@]}"; do [ "${b%%|*}" = "${vtrees[$i]}" ] && dup=1; done
    [ "$dup" = 1 ] || builds+=("${vtrees[$i]}|${vflags[$i]}|.")
  done
  jobs=$(( 16 / ${#builds[@]} ))
  [ "$jobs" -ge 2 ] || jobs=2
  for b in "${builds[@]}"; do
    IFS='|' read -r tree flags src <<<"$b"
    tag=$(basename "$tree")
    ( configure_sm90 "$tree" "$OUT/ab_configure_$tag.log" "$flags" "$src" \
      && cmake --build "$tree" -j"$jobs" --target mxmoe_gpu_tests mxmoe_cli >"$OUT/ab_build_$tag.log" 2>&1
      echo $? >"$OUT/ab_rc_$tag" ) &
  done
  wait
  failed=0
  for b in "${builds[@]}"; do
    tree=${b%%|*} tag=$(basename "${b%%|*}")
    note "ab build $tree (flags: $(echo "$b" | cut -d'|' -f2); sources: ${b##*|}): rc=$(cat "$OUT/ab_rc_$tag")"
    [ "$(cat "$OUT/ab_rc_$tag")" = 0 ] || failed=1
  done
  note "ab builds: $(( $(secs) - t0 )) s"
  # Binaries of an earlier call stay on the machine: a failed build must not be measured.
  [ "$failed" = 0 ] || { note "ab: a build failed"; exit 1; }
  for i in "${!names[@]}"; do
    [ "${vtests[$i]}" = "-*" ] && continue
    watched 200 "$OUT/ab_tests_${names[$i]}.log" env ${venvs[$i]} "${vtrees[$i]}/bin/mxmoe_gpu_tests" \
      --gtest_filter="${vtests[$i]:-CudaGemmConfigs.EveryConfigMatchesReference:CudaMoeSmall.*}"
    note "ab tests (${names[$i]}): rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$OUT/ab_tests_${names[$i]}.log" | tr '\n' ' ')"
  done
  order=(-1 "${!names[@]}")
  for (( i = ${#names[@]} - 1; i >= 0; --i )); do order+=("$i"); done
  order+=(-1)
  for i in "${order[@]}"; do
    if [ "$i" = -1 ]; then tag=base tree=$base_tree env_v=""
    else tag=${names[$i]} tree=${vtrees[$i]} env_v=${venvs[$i]}; fi
    # The SM clock and the board power every 200 ms while the row runs (whether a slower row ran
    # at lower clocks: v18 left ~1.5 ms of T = 4096 between the kernels' Nsight times and the layer).
    smi_log="$OUT/ab_smi.csv"
    nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 >"$smi_log" 2>/dev/null &
    smi_pid=$!
    timeout "${AB_ROW_TIMEOUT:-150}" env $env_v "$tree/bin/mxmoe" bench --shapes "${AB_SHAPES:-kimi-k3}" --routing uniform \
      --tokens "${AB_TOKENS:-1,1024,4096}" --check-tokens 32 >"$OUT/ab_bench.log" 2>&1
    rc=$?
    kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null
    grep -E "^(kimi-k3|gpt-oss-120b|deepseek-v3) |FAIL" "$OUT/ab_bench.log" | sed "s/^/$tag: /" | tee -a "$SUMMARY" >/dev/null
    [ "$rc" = 0 ] || note "$tag: mxmoe bench rc=$rc"
    note "$tag: $(ab_clock_summary "$smi_log")"
  done
  # The rows above once more as one short line per shape and T (eager / graph µs per run, in run
  # order; FAIL where the row's check failed), last in the summary: a call's output keeps only its
  # tail, and the full rows are ~200 characters each.
  note "ab table (shape T | run: eager / graph µs, in run order):"
  python3 - "$SUMMARY" <<'PY' | tee -a "$SUMMARY"
import re, sys
rows = {}
pat = re.compile(r"^(\w+): (kimi-k3|gpt-oss-120b|deepseek-v3)\s+\S+\s+(\d+)\s+\d+\s+\d+\s+([\d.]+)\s+([\d.]+)")
for line in open(sys.argv[1], errors="replace"):
    m = pat.match(line)
    if m:
        cell = f"{m[1]} {m[4]}/{m[5]}" + ("" if " ok (" in line else " FAIL")
        rows.setdefault((m[2], int(m[3])), []).append(cell)
    elif re.match(r"^\w+: .*FAIL", line):
        rows.setdefault(("failed rows", 0), []).append(line.split(":")[0])
for (shape, t), cells in rows.items():
    print(f"  {shape} {t} | " + " | ".join(cells))
PY
fi

# Not part of `all` (it builds a second tree): `scripts/device-gpu.sh sm120`. A tree for sm_90a and
# sm_120a with the SM120 kernels' sm_90a code emulating the block-scaled MMA; the whole GPU suite
# through the SM120 path on this SM90 device (MXMOE_CUDA_PATH=sm120); registers and spills of the
# SM120 kernels (-Xptxas -v) and the sm_120a SASS (the block-scaled MMA, local memory). docs/sm120.md.
if named sm120; then
  t0=$(secs)
  B120=build-gpu-sm120
  cmake -S . -B "$B120" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA=ON -DMXMOE_CUDA_ARCHS="90a;120a" \
    -DMXMOE_SM120_EMULATION=ON -DCMAKE_CUDA_FLAGS="-Xptxas -v" >"$OUT/sm120_configure.log" 2>&1 \
    || { note "sm120 configure FAILED"; tail -20 "$OUT/sm120_configure.log"; exit 1; }
  cmake --build "$B120" -j16 --target mxmoe_gpu_tests >"$OUT/sm120_build.log" 2>&1 \
    || { note "sm120 build FAILED"; grep -E "error" "$OUT/sm120_build.log" | head -20; exit 1; }
  note "sm120 build: ok in $(( $(secs) - t0 )) s"
  # One line per SM120 kernel and target: config (warps M x N, m16 tiles per warp, stages), FC1/FC2,
  # registers, spills.
  awk '/Compiling entry function/ { if (name != "") print name " | " regs " | " spill; name = ""; regs = ""; spill = "";
         if ($0 ~ /MoeGemmSm120Kernel|weight_prepack_sm120/) name = $0; next }
       name != "" && /Used [0-9]+ registers/ { regs = $0 }
       name != "" && /spill stores/ && spill == "" { spill = $0 }
       END { if (name != "") print name " | " regs " | " spill }' "$OUT/sm120_build.log" \
    | sed -E "s/.*GemmConfigILi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)EEELb([01]).*for '([a-z0-9_]+)'/gemm warps \1x\2 mfrags \3 stages \4 fc1=\6 \7/; s/.*RepackKernelILb([01]).*for '([a-z0-9_]+)'/repack w13=\1 \2/; s/ptxas info +: //g; s/ +/ /g" \
    | sed 's/^/ptxas: /' | tee -a "$SUMMARY"
  t0=$(secs)
  # Stress.* (T = 65536, 10 000 calls) would take minutes with the emulated MMA (hundreds of
  # instructions per MMA), and CudaGemmConfigs.* forces SM90 configs, which this path ignores (it
  # would run the same SM120 kernels five times; Sm120Path.EveryConfigMatchesReference runs each
  # SM120 config). The tests of SM90's fused decode kernel (n8f: CudaFusedDecode.*, the stage
  # timeline of its calls and its graph edges) expect its plan names, which this path never runs.
  # SM120_FILTER / SM120_DIFF_CONFIGS override.
  MXMOE_CUDA_PATH=sm120 MXMOE_DIFF_CONFIGS=${SM120_DIFF_CONFIGS:-200} timeout "${TEST_TIMEOUT:-240}" \
    "$B120/bin/mxmoe_gpu_tests" --gtest_filter="${SM120_FILTER:--Stress.*:CudaGemmConfigs.*:CudaFusedDecode.*:CudaStageTimes.*:CudaMoeGraph.DecodeCalls*}" >"$OUT/sm120_tests.log" 2>&1
  rc=$?
  note "sm120 tests (MXMOE_CUDA_PATH=sm120, emulated MMA): rc=$rc in $(( $(secs) - t0 )) s; $(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test' "$OUT/sm120_tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] [A-Z]" "$OUT/sm120_tests.log" | sort -u | head -20 | tee -a "$SUMMARY"
  grep -E "Failure|error:" -A4 "$OUT/sm120_tests.log" | head -40
  if command -v cuobjdump >/dev/null; then
    for f in $(find "$B120" -path '*sm120*' -name '*.cu.o'); do
      name=$(basename "$f" .cu.o)
      cuobjdump -sass -arch sm_120a "$f" >"$OUT/sass120_$name.txt" 2>&1
      s="$OUT/sass120_$name.txt"
      note "sass sm_120a $name: QMMA.SF $(grep -c 'QMMA.SF' "$s") ($(grep -o 'QMMA[.A-Z0-9]*' "$s" | sort -u | tr '\n' ' ')) LDSM $(grep -c LDSM "$s") LDGSTS $(grep -c LDGSTS "$s") local(LDL/STL) $(grep -cE '\b(LDL|STL)\b' "$s") HMMA $(grep -c HMMA "$s")"
    done
  else
    note "sass sm_120a: no cuobjdump on this machine"
  fi
fi

echo
echo "==== summary ===="
cat "$SUMMARY"
