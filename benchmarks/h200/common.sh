# Sourced by the H200 job scripts (run from the project root on the device machine).
# Results accumulate in /tmp/sweep-results while the machine stays warm; every job packs all of them
# into $OUT/results.tgz, and its log into $OUT/<job>.log.
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=220 SWEEP_DEBUG=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PROFILE=${PROFILE:-benchmarks/h200/profile-h200x2.yaml}
RES=${RES:-/tmp/sweep-results}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$RES"
LOG="$OUT/${JOB:-job}.log"
exec > >(tee -a "$LOG") 2>&1

install_wheels() {  # ray, torchao, pydantic (../shared/gpu/wheels.sh made .whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
}

stage_te_part() {  # one 50 MiB part of TE's core wheel (../shared/gpu/te-stage.sh made .te1 ... .te5)
  mkdir -p /tmp/stage && cp "$1"/part* /tmp/stage/ && ls -l /tmp/stage
}

versions() {
  date -u +%FT%TZ
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 - <<'PY'
from importlib.metadata import version
for p in ("ray", "torchao", "pydantic", "transformer-engine", "transformer-engine-cu13", "transformer-engine-torch"):
    try:
        print(p, version(p))
    except Exception:
        print(p, "-")
PY
}

pack() {
  tar czf "$OUT/results.tgz" -C "$(dirname "$RES")" "$(basename "$RES")" 2>/dev/null
  ls -l "$OUT"
}

# sweep_grid NAME GRID LIMIT_S [sweep options...]: one `sweep run`, stopped with SIGINT (sweep then tears
# down its actors and keeps the rows already written) if it runs past LIMIT_S.
sweep_grid() {
  local name=$1 grid=$2 limit=$3
  shift 3
  echo "== $(date -u +%FT%TZ) python3 -m sweep run $grid --cluster $PROFILE --output $RES/$name $*"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=30 "$limit" python3 -m sweep run "$grid" --cluster "$PROFILE" \
    --output "$RES/$name" "$@"
  echo "== sweep exit $? after $((SECONDS - t0)) s"
  python3 benchmarks/h200/summarize.py "$RES/$name"
  pack
}

# max_batch NAME LIMIT_S [sweep max-batch options...]: one `sweep max-batch`, stopped with SIGINT past LIMIT_S.
max_batch() {
  local name=$1 limit=$2
  shift 2
  echo "== $(date -u +%FT%TZ) python3 -m sweep max-batch $* --cluster $PROFILE --output $RES/$name"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=30 "$limit" python3 -m sweep max-batch "$@" --cluster "$PROFILE" \
    --output "$RES/$name"
  echo "== max-batch exit $? after $((SECONDS - t0)) s"
  cat "$RES/$name"/_search/*.json 2>/dev/null
  pack
}
