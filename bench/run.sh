#!/usr/bin/env bash
# `make bench` on the GPU machine, after the build: the sweep (mxmoe bench), the plain PyTorch peer
# and the Triton MXFP4 peer (where triton imports) on the same weights and inputs, then the report
# (table with the ratio per row for each peer, issue 5's targets, PNG). Installs nothing.
#   bench/run.sh BUILD_DIR OUT_DIR [mxmoe bench options ...]
# Writes OUT_DIR/{mxmoe,torch,triton}.{csv,log}, report.txt and roofline.png. The dump the peers
# read (23 GB for the default sweep) goes to /dev/shm when it has room (no disk traffic), else
# OUT_DIR/dump, or to $BENCH_DUMP; it is deleted at the end unless BENCH_KEEP_DUMP=1.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: bench/run.sh BUILD_DIR OUT_DIR [mxmoe bench options ...]" >&2
  exit 2
fi
build=$1 out=$2
shift 2
mxmoe="$build/bin/mxmoe"
[ -x "$mxmoe" ] || { echo "bench/run.sh: $mxmoe not built" >&2; exit 2; }
mkdir -p "$out"
dump=${BENCH_DUMP:-}
if [ -z "$dump" ]; then
  shm_free=$(df -B1 --output=avail /dev/shm 2>/dev/null | tail -1 || echo 0)
  if [ "${shm_free:-0}" -gt 40000000000 ] 2>/dev/null; then dump=/dev/shm/mxmoe-bench-dump; else dump="$out/dump"; fi
fi
rm -rf "$dump"
# (A peer that does not run this time must not leave an earlier run's rows to the report.)
rm -f "$out"/torch.csv "$out"/torch.log "$out"/triton.csv "$out"/triton.log
start=$(date +%s)
lap() { echo "== $1 done at $(( $(date +%s) - start )) s"; }

echo "== mxmoe bench (dump for the peer in $dump)"
"$mxmoe" bench --csv "$out/mxmoe.csv" --dump "$dump" "$@" 2>&1 | tee "$out/mxmoe.log"
rc_mxmoe=${PIPESTATUS[0]}
lap "mxmoe bench (rc $rc_mxmoe)"

# run_peer NAME TITLE: bench/peers/NAME_moe.py on the dump, into $out/NAME.{csv,log}; its status.
run_peer() {
  echo "== $2 peer (bench/peers/$1_moe.py)"
  python3 "bench/peers/$1_moe.py" --dump "$dump" --csv "$out/$1.csv" 2>&1 | tee "$out/$1.log"
  local rc=${PIPESTATUS[0]}
  lap "$1 peer (rc $rc)"
  return "$rc"
}
rc_peer=1 rc_triton=skipped
if [ -f "$dump/manifest.json" ]; then
  run_peer torch PyTorch
  rc_peer=$?
  if python3 -c "import triton" 2>/dev/null; then
    run_peer triton Triton
    rc_triton=$?
  else
    echo "== Triton peer: skipped (python3 cannot import triton)"
  fi
fi
[ "${BENCH_KEEP_DUMP:-0}" = 1 ] || rm -rf "$dump"

rc_report=1
if [ -s "$out/mxmoe.csv" ]; then
  echo "== report"
  peers=()
  [ -s "$out/torch.csv" ] && peers+=(--peer "$out/torch.csv")
  [ -s "$out/triton.csv" ] && peers+=(--peer "$out/triton.csv")
  python3 bench/report.py --mxmoe "$out/mxmoe.csv" "${peers[@]}" --plot "$out/roofline.png" | tee "$out/report.txt"
  rc_report=${PIPESTATUS[0]}
fi
echo "== make bench: $(( $(date +%s) - start )) s; mxmoe bench rc $rc_mxmoe, torch peer rc $rc_peer," \
  "triton peer rc $rc_triton, report rc $rc_report; results in $out"
[ "$rc_mxmoe" = 0 ] && [ "$rc_peer" = 0 ] && { [ "$rc_triton" = 0 ] || [ "$rc_triton" = skipped ]; } && [ "$rc_report" = 0 ]
