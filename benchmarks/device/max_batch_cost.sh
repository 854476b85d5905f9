#!/usr/bin/env bash
# What `sweep max-batch` costs against one measured trial of the batch it finds fastest (issue 28: at most 1.5x), for
# one max-batch GRID, on the lent one-H200 machine from the project root, carrying .whl (a fresh machine: an empty
# compile cache):
#
#   SWEEP_GIT_SHA=<commit> bash benchmarks/device/max_batch_cost.sh GRID [PROFILE]
#
# cold_sweep.sh's max-batch part without its base tree and results wheels: the search into /tmp/max-batch/search,
# then one `sweep run` of its fastest batch (fresh processes, its own empty compile cache) into /tmp/max-batch/one,
# packed into $OUT/max-batch.tgz; `python3 benchmarks/cold_sweep_check.py DIR` reads them on this side once named
# max-batch-search and max-batch-one-trial.
set -uo pipefail
grid=$1 profile=${2:-benchmarks/profiles/h200x1.yaml}
source benchmarks/device/env.sh
OUT=${OUT:-/tmp/out} results=/tmp/max-batch
mkdir -p "$OUT" && rm -rf "$results" /tmp/cc-search /tmp/cc-one
bash benchmarks/device/install.sh >/dev/null || exit 1
with_cache() {  # with_cache DIR: the profile with its own compile cache (Triton's under it)
  python3 - "$profile" "$1" <<'PY'
import sys, yaml
p = yaml.safe_load(open(sys.argv[1]))
p["compile_cache"] = sys.argv[2]
p.setdefault("env", {})["TRITON_CACHE_DIR"] = sys.argv[2] + "/triton"
yaml.safe_dump(p, open(sys.argv[2] + ".yaml", "w"))
PY
  echo "$1.yaml"
}
began=$SECONDS
$SWEEP run "$grid" --cluster "$(with_cache /tmp/cc-search)" --output $results/max-batch-search --no-progress 2>&1 |
  grep -E "^│|GPU time|fits|limit" | tail -12
echo "== search: $((SECONDS - began)) s"
tar czf "$OUT/max-batch.tgz" -C /tmp max-batch  # what a call's deadline leaves still comes back
fastest=$(python3 -c 'import json, glob, sys; v = json.load(open(sorted(glob.glob(sys.argv[1] + "/_search/*.json"))[-1]))
print((v[0] if isinstance(v, list) else v["verdicts"][0])["fastest_batch"])' $results/max-batch-search)
echo "fastest batch of the search: $fastest"
sed "s/^batch_sizes: .*/batch_sizes: [$fastest]/; s/^search: .*//; s/^name: .*/name: one-trial/" "$grid" >/tmp/one-trial.yaml
$SWEEP run /tmp/one-trial.yaml --cluster "$(with_cache /tmp/cc-one)" --output $results/max-batch-one-trial --no-progress 2>&1 |
  grep -E "^│|GPU time" | tail -4
echo "== both: $((SECONDS - began)) s"
tar czf "$OUT/max-batch.tgz" -C /tmp max-batch
