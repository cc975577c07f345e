#!/usr/bin/env bash
# `make bench` on the GPU machine, after the build: the sweep (mxmoe bench), the plain PyTorch peer
# on the same weights and inputs, then the report (table with the ratio per row, issue 5's
# targets, PNG). Installs nothing.
#   bench/run.sh BUILD_DIR OUT_DIR [mxmoe bench options ...]
# Writes OUT_DIR/{mxmoe.csv,mxmoe.log,torch.csv,torch.log,report.txt,roofline.png}. The dump the
# peer reads (23 GB for the default sweep) goes to /dev/shm when it has room (no disk traffic),
# else OUT_DIR/dump, or to $BENCH_DUMP; it is deleted at the end unless BENCH_KEEP_DUMP=1.
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
start=$(date +%s)
lap() { echo "== $1 done at $(( $(date +%s) - start )) s"; }

echo "== mxmoe bench (dump for the peer in $dump)"
"$mxmoe" bench --csv "$out/mxmoe.csv" --dump "$dump" "$@" 2>&1 | tee "$out/mxmoe.log"
rc_mxmoe=${PIPESTATUS[0]}
lap "mxmoe bench (rc $rc_mxmoe)"

rc_peer=1
if [ -f "$dump/manifest.json" ]; then
  echo "== PyTorch peer (bench/peers/torch_moe.py)"
  python3 bench/peers/torch_moe.py --dump "$dump" --csv "$out/torch.csv" 2>&1 | tee "$out/torch.log"
  rc_peer=${PIPESTATUS[0]}
  lap "torch peer (rc $rc_peer)"
fi
[ "${BENCH_KEEP_DUMP:-0}" = 1 ] || rm -rf "$dump"

rc_report=1
if [ -s "$out/mxmoe.csv" ]; then
  echo "== report"
  peers=()
  [ -s "$out/torch.csv" ] && peers=(--peer "$out/torch.csv")
  python3 bench/report.py --mxmoe "$out/mxmoe.csv" "${peers[@]}" --plot "$out/roofline.png" | tee "$out/report.txt"
  rc_report=${PIPESTATUS[0]}
fi
echo "== make bench: $(( $(date +%s) - start )) s; mxmoe bench rc $rc_mxmoe, torch peer rc $rc_peer, report rc $rc_report;" \
  "results in $out"
[ "$rc_mxmoe" = 0 ] && [ "$rc_peer" = 0 ] && [ "$rc_report" = 0 ]
