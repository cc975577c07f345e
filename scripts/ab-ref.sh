#!/bin/bash
# scripts/ab-ref.sh REF: exports commit REF's sources into .ab_ref (git-ignored), the base of a
# device A/B against this checkout: carry ".ab_ref" in the device call and run
#   AB_BASE_SRC=.ab_ref [AB_FLAGS=...] [AB_ENV="VAR=value"] bash scripts/device-gpu.sh ab
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/ab-ref.sh REF}
rm -rf .ab_ref
mkdir .ab_ref
# -m: the files get the time of the export, not of the commit, so that a build tree of an earlier
# export sees them as changed.
git archive "$ref" | tar -x -m -C .ab_ref --exclude=docs
echo "exported $(git rev-parse --short "$ref") into .ab_ref ($(du -sh .ab_ref | cut -f1))"
