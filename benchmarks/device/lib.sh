# Sourced by benchmarks/device/job.sh and tune.sh: what a job on the lent H200 machine still lacks, and how
# it packs its rows.

next_carry() {  # next_carry NEEDS_RESULTS NEEDS_TE (0/1): the folder to carry next, or nothing when ready
  python3 -c 'import ray, torchao, pydantic' 2>/dev/null || { echo .whl; return; }
  [ "$1" = 1 ] && ! python3 -c 'import duckdb' 2>/dev/null && { echo .whl-results; return; }
  if [ "$2" = 1 ] && ! python3 -c 'import transformer_engine.pytorch' 2>/dev/null; then
    for i in 0 1 2 3 4; do [ -f /tmp/stage/part$i ] || { echo ".te$((i + 1))"; return; }; done
    echo .tefinal
  fi
}

pack() {  # pack DIR: DIR's rows and verdicts into $OUT/NAME.tgz, its profiler traces into $OUT/NAME-traces.tgz
  # (a tune's traces can make an archive too big to come back, and the rows would be lost with it)
  local parent name traces
  parent=$(dirname "$1") name=$(basename "$1")
  # written aside, then renamed: a call cut while packing leaves the last whole archive
  tar czf "$OUT/.$name.tgz" --exclude=_traces -C "$parent" "$name" && mv "$OUT/.$name.tgz" "$OUT/$name.tgz"
  traces=$(cd "$parent" && find "$name" -type d -name _traces)
  [ -z "$traces" ] || { tar czf "$OUT/.$name-traces.tgz" -C "$parent" $traces &&
                          mv "$OUT/.$name-traces.tgz" "$OUT/$name-traces.tgz"; }
}

carry_in() {  # carry_in DIR: the rows an earlier job packed, unpacked here into .device-out/NAME (NAME: DIR's
  # name) and carried, copied into DIR unless it has rows already (a machine kept warm); false if none were
  local name
  name=$(basename "$1")
  [ -d ".device-out/$name" ] && [ -z "$(find "$1" -name '*.parquet' -print -quit)" ] || return 1
  cp -r ".device-out/$name/." "$1/"
  echo "$(basename "$0" .sh): $(find "$1" -name '*.parquet' | wc -l) carried result files in $1"
}

job_begin() {  # job_begin NAME NEEDS_TE (0/1): a campaign script's start on the lent machine, from the project root
  # (after `source benchmarks/device/lib.sh`): its environment (env.sh), $OUT, $results (/tmp/sweep-results/NAME,
  # with the rows an earlier job packed carried in), the log $OUT/NAME.log, the packages this job carries installed,
  # and $deadline (JOB_LIMIT_S, 570, from here: the device command's limit is 600 s). Exits 0 saying which folder to
  # carry next while something is missing (a fresh machine starts from .whl); else prints the date, GPU and versions.
  local next
  source benchmarks/device/env.sh
  OUT=${OUT:-/tmp/out}
  results=/tmp/sweep-results/$1
  mkdir -p "$OUT" "$results"
  exec > >(tee -a "$OUT/$1.log") 2>&1
  carry_in "$results"
  deadline=$((${JOB_LIMIT_S:-570} + SECONDS))
  bash benchmarks/device/install.sh || exit 1
  next=$(next_carry "${JOB_NEEDS_RESULTS:-1}" "$2")  # a probe that writes no rows: JOB_NEEDS_RESULTS=0
  if [ -n "$next" ]; then
    echo "job: $1 cannot run yet; call this again carrying $next (a fresh machine starts from .whl)"
    exit 0
  fi
  # rows name the commit they ran: the copy's .git (if any) is not this tree's
  [ -n "${SWEEP_GIT_SHA:-}" ] || echo "job: SWEEP_GIT_SHA is not set; rows will record the copy's stale .git"
  date -u +%FT%TZ
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit,power.draw,clocks.sm,clocks.max.sm,temperature.gpu \
    --format=csv
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
}

ray_nodes_start() {  # ray_nodes_start GPUS_PER_NODE: this host's GPUs as two Ray nodes (the first GPUS_PER_NODE GPUs
  # the head, the next ones a worker), 8 CPUs per GPU; a profile with ray_address: auto joins them
  local n=$1 first second
  first=$(seq -s, 0 $((n - 1))) second=$(seq -s, "$n" $((2 * n - 1)))
  export RAY_AUTH_MODE=disabled  # the driver joins with the auth mode the nodes were started with
  CUDA_VISIBLE_DEVICES=$first python3 -m ray.scripts.scripts start --head --port 6380 --num-gpus "$n" \
    --num-cpus $((8 * n)) --include-dashboard=false
  CUDA_VISIBLE_DEVICES=$second python3 -m ray.scripts.scripts start --address 127.0.0.1:6380 --num-gpus "$n" \
    --num-cpus $((8 * n))
  python3 -m ray.scripts.scripts status
}

ray_nodes_stop() {
  python3 -m ray.scripts.scripts stop --force 2>&1 | tail -n 1  # it lists every process it kills
}
