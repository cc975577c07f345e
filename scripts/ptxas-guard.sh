#!/usr/bin/env bash
# The CUDA library's compiler launcher (CMakeLists.txt): runs the compile command it is given and
# fails it when ptxas reports that it serialized a kernel's wgmma instructions ("(C7512) Potential
# Performance Loss: wgmma.mma_async instructions are serialized due to ...", with other codes for
# other causes; the -G build's notes that it injected waits are not that). Such a kernel is
# correct but waits for every MMA before the next: wg128h compiled that way for a session unnoticed
# (perf-log v20). Everything the compiler prints is passed on unchanged.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>"$log"
rc=$?
cat "$log" >&2
if [ "$rc" -eq 0 ] && grep -q 'wgmma.mma_async instructions are serialized' "$log"; then
  echo "ptxas-guard: ptxas serialized wgmma in the unit above; the kernel would wait for each MMA." >&2
  echo "ptxas-guard: give its consumers more registers or fewer MMA groups in flight (perf-log v20)." >&2
  # The object is written by then: remove it, so that no later build takes it as up to date.
  prev=""
  for arg in "$@"; do
    [ "$prev" = "-o" ] && rm -f -- "$arg"
    prev=$arg
  done
  exit 1
fi
exit "$rc"
