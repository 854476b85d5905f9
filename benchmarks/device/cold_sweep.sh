#!/usr/bin/env bash
# The cold-sweep campaign on the lent one-H200 machine (kind nvidia-h200), from the project root:
#
#   SWEEP_GIT_SHA=<commit> bash benchmarks/device/cold_sweep.sh cold|warm|cold-warm|acceptance|cold-first|wait|store|store-sides|current-cold-warm|prestart|report|threads|searches|max-batch [PROFILE]
#
# GRID (default benchmarks/campaigns/cold-sweep/a-grid.yaml, sized for an H200's 141 GB) is the grid of every part
# but searches and max-batch; on an 80 GB H100 (benchmarks/profiles/h100x1.yaml) give a-grid-80gb.yaml.
# Carries .whl, then .whl-results with .base-tree (bash benchmarks/device/prepare.sh base COMMIT: the tree of the
# commit that is "today" for issue 28, whose rows are the baseline). Each `sweep run` below starts its own Ray, so
# every run has fresh rank processes; a run is cold when its compile cache (inductor's, Triton's kernels in it)
# starts empty, warm when it is the cache the same tree's cold run filled.
#   cold   benchmarks/campaigns/cold-sweep/a-grid.yaml with the current tree (which compiles a group's graphs at
#          once, in side processes, as it starts), then the base tree, then the current tree with --no-precompile
#          (each trial compiles its own), each on an empty cache, into /tmp/sweep-results/cold-sweep/
#          {current,base,each}-cold (the order alternates with the warm part's, and the log says what each run
#          started beside: load, the busiest processes, the imports' seconds)
#   warm   (the next call, while the machine is warm) the grid again, base first, on the caches the cold part
#          filled, into .../{base,current,each}-warm
#   cold-warm  in one call, carrying .whl and .base-tree only (JOB_NEEDS_RESULTS=0: no tables, the rows come back
#          packed): cold current then base, warm base then current (a machine taken back between two calls loses
#          the cold part's caches)
#   acceptance  in one call, carrying .whl and .base-tree only: current cold, current warm, base cold, base warm, then
#          current cold keeping the side processes' kernel timings too (SWEEP_AUTOTUNE_STORE=all, the default before
#          session 41, .../kept-cold; the deadline stops what does not fit; the current tree's runs first), with
#          `report`'s log and ps.log
#   threads  the current tree alone, cold three times (A B A), each side process given a quarter of the host's cores
#          for inductor's compile workers (SWEEP_PRECOMPILE_THREADS; the default before session 30), then every core
#          (the default since), then a quarter again; the side processes' seconds a set from Ray's worker logs
#          (SWEEP_COMPILE_REPORT)
#   report  the current tree cold once, its side processes' seconds, peak memory and span a set in the log (from
#          the first trial's wait), the busiest processes every 2 s in $OUT/ps.log
#   prestart  the current tree alone (JOB_NEEDS_RESULTS=0, .whl only): cold as it is (rank and side processes started
#          ahead), cold with them started once placed (prestarted_ranks 0, .../late-cold, its own cache), then warm
#          the other way round (.../late-warm, .../current-warm)
#   store  the current tree cold, then warm A B A (current, the base tree on the current tree's cache, current again):
#          kernel benchmarks kept across processes against none, with .base-tree the commit before them (f6ac372)
#   store-sides  the current tree alone, cold then warm, as it is (only the trials' own kernel timings kept: a side
#          process's, measured beside the others, are not) and keeping the side processes' too
#          (SWEEP_AUTOTUNE_STORE=all), each its own cache: current, kept cold, then kept, current warm
#          (.../{current,kept}-{cold,warm})
#   searches  the OOM-retry grid (b-oom.yaml) and the max-batch search (c-max-batch.yaml) with the current tree and
#          the OOM grid with the base one, on their own empty caches, into .../{current,base}-searches
#   max-batch  c-max-batch.yaml alone on an empty cache into .../max-batch-search, then one `sweep run` of the batch
#          it found fastest (static shapes, fresh processes, its own empty cache) into .../max-batch-one-trial
# then benchmarks/cold_sweep_check.py over what is there, and packs the rows into $OUT/cold-sweep.tgz (a warm part
# on a machine released since finds no rows of the cold part: call it cold again).
set -uo pipefail
campaign=cold-sweep
part=${1:-cold}
[[ $part != *cold-warm && $part != acceptance && $part != cold-first && $part != prestart && $part != threads && $part != report && $part != wait && $part != store && $part != store-sides && $part != base ]] || export JOB_NEEDS_RESULTS=0  # carries .whl and .base-tree: no room for .whl-results
profile=${2:-benchmarks/profiles/h200x1.yaml}
grids=benchmarks/campaigns/$campaign
grid=${GRID:-$grids/a-grid.yaml}  # the grid of every part but searches and max-batch (a-grid-80gb.yaml for an 80 GB GPU)
source benchmarks/device/lib.sh
job_begin $campaign 0
# the parts that run the current tree alone need no base tree
[[ $part == report || $part == wait || $part == prestart || $part == threads || $part == current-cold-warm || $part == store-sides ]] || [ -f .base-tree/COMMIT ] ||
  { echo "job: carry .base-tree (bash benchmarks/device/prepare.sh base COMMIT)"; exit 2; }
base_sha=$(cat .base-tree/COMMIT 2>/dev/null)
root=$PWD profile=$(realpath "$profile")  # both read from inside a tree below
echo "base tree: $base_sha; current tree: ${SWEEP_GIT_SHA:-unknown}"

prestarted=""  # set: the profile's prestarted_ranks (a key the base tree does not know)
threads=""  # set: SWEEP_PRECOMPILE_THREADS in the profile's env (each side process's compile workers)
report=""  # set: SWEEP_COMPILE_REPORT in the profile's env
extra=""  # set: more of the profile's env, NAME=VALUE[,NAME=VALUE...]
cached_profile() {  # cached_profile LABEL: the profile with its own compile cache, /tmp/cc-LABEL (Triton's under it)
  python3 - "$profile" "/tmp/cc-$1" "/tmp/$campaign-$1.yaml" "$prestarted" "$threads" "$report" "$extra" <<'PY'
import sys, yaml
p = yaml.safe_load(open(sys.argv[1]))
p["compile_cache"] = sys.argv[2]
p.setdefault("env", {})["TRITON_CACHE_DIR"] = sys.argv[2] + "/triton"
if sys.argv[6]:  # rank 0's compile report (and its side processes' seconds) in Ray's worker logs
    p["env"]["SWEEP_COMPILE_REPORT"] = "1"
if sys.argv[4]:
    p["prestarted_ranks"] = int(sys.argv[4])
if sys.argv[5]:
    p["env"]["SWEEP_PRECOMPILE_THREADS"] = sys.argv[5]
for pair in filter(None, sys.argv[7].split(",")):
    name, value = pair.split("=", 1)
    p["env"][name] = value
yaml.safe_dump(p, open(sys.argv[3], "w"))
PY
  echo "/tmp/$campaign-$1.yaml"
}

sample_processes() {  # the busiest processes over 1 s, every 2 s for two minutes, into $OUT/ps.log (in the background)
  (for _ in $(seq 60); do echo "== $(date +%s.%N) load $(cut -d' ' -f1-3 /proc/loadavg) processes $(ls /proc | grep -c '^[0-9]')"
     top -b -c -n 2 -d 1 -w 200 | awk '/^top -/ {n++} n == 2' | sed -n '7,30p' | cut -c1-200; sleep 1; done) >"$OUT/ps.log" 2>&1 &
}

status=0
sweep_run() {  # sweep_run TREE GRID OUTPUT [LABEL [FLAG...]]: `sweep run` of TREE (base or current) with its compile
  # cache /tmp/cc-LABEL (LABEL: TREE unless given) and FLAGs, stopped with SIGINT at the deadline
  local tree=$1 grid_file=$2 out=$3 label=${4:-$1} path sha left began
  shift $(($# < 4 ? $# : 4))
  if [ "$tree" = base ]; then path=$PWD/.base-tree sha=$base_sha; else path=$PWD sha=${SWEEP_GIT_SHA:-}; fi
  left=$((deadline - SECONDS))
  [ $left -gt 30 ] || { echo "job: no time left for $tree $grid_file"; status=124; return; }
  began=$SECONDS
  echo "== $(date -u +%FT%TZ) $tree: sweep run $grid_file -> $out; load $(cut -d' ' -f1-3 /proc/loadavg); busiest:"
  ps -eo pcpu=,etimes=,comm= --sort=-pcpu | head -n 4
  # run from inside the tree: `python3 -m` puts the working directory ahead of PYTHONPATH, and Ray puts the driver's
  # working directory on every worker's path, so a run from the project root imports the root's sweep and trainer
  # whatever PYTHONPATH says (every "base" run before session 20 was the current tree)
  (cd "$path" && PYTHONPATH=$path:/tmp/site python3 -c 'import sweep, trainer; print("imports", sweep.__file__, trainer.__file__)' &&
   PYTHONPATH=$path:/tmp/site SWEEP_GIT_SHA=$sha timeout --signal=INT --kill-after=20 $left \
     python3 -m sweep run "$(cd "$root" && realpath "$grid_file")" --cluster "$(cached_profile "$label")" --output "$out" \
       --no-progress "$@")
  local rc=$?
  echo "== $tree $grid_file: exit $rc after $((SECONDS - began)) s (driver wall, Ray start included)"
  # the side processes' seconds a set, as the first trial's rank saw them (its stderr: Ray's newest session's logs)
  grep -h "waited .* for side processes" /tmp/ray/session_latest/logs/worker-*.err 2>/dev/null | tail -n 4
  # and, with the compile report on, every trial's (its caches' hits and misses, its compile phases) into $OUT
  [ -z "$report" ] || grep -h -A1 -e "sweep compile report" -e "sweep trial phases" /tmp/ray/session_latest/logs/worker-*.err \
    >"$OUT/compile-report-$(basename "$out").log" 2>/dev/null
  [ $rc -eq 0 ] || [ $rc -eq 3 ] || status=$rc
}

both_trees() {  # both_trees RUN...: the grid for each RUN (TREE-PHASE: current-cold, base-warm, ...) in that order, on
  # both trees' emptied caches, the compile report on and what ran beside sampled, as `report` does
  report=1
  rm -rf /tmp/cc-current /tmp/cc-base "$results"/*-cold "$results"/*-warm
  sample_processes
  for run in "$@"; do sweep_run "${run%-*}" $grid "$results/$run"; done
}

case $part in
  cold)
    # what a rank's first trial imports (import_s), by module: where a fresh process's seconds go
    python3 -X importtime -c 'import torch._dynamo, torch.distributed; import trainer.train' 2>&1 |
      sort -t'|' -k2 -n | tail -n 12
    rm -rf /tmp/cc-base /tmp/cc-current /tmp/cc-each "$results"/*-cold
    sweep_run current $grid "$results/current-cold"
    sweep_run base $grid "$results/base-cold"
    sweep_run current $grid "$results/each-cold" each --no-precompile ;;
  warm)
    [ -d /tmp/cc-current ] && [ -d /tmp/cc-base ] || {
      echo "job: no compile caches of a cold part on this machine (released since?): run the cold part first"; exit 2; }
    sweep_run base $grid "$results/base-warm"
    sweep_run current $grid "$results/current-warm"
    [ ! -d /tmp/cc-each ] || sweep_run current $grid "$results/each-warm" each --no-precompile ;;
  cold-warm)
    rm -rf /tmp/cc-base /tmp/cc-current "$results"/*-cold "$results"/*-warm
    sweep_run current $grid "$results/current-cold"
    sweep_run base $grid "$results/base-cold"
    sweep_run base $grid "$results/base-warm"
    sweep_run current $grid "$results/current-warm" ;;
  acceptance)  # one call: the current tree cold then warm, then the base cold then warm (what the deadline leaves),
    # the current tree's compile report on and what ran beside its cold run sampled, as `report` does
    both_trees current-cold current-warm base-cold base-warm
    # what the deadline leaves: the current tree cold again keeping the side processes' kernel timings too (measured
    # beside the others, they picked rowwise's slower config in sessions 39 and 41's H100 runs), its own cache
    rm -rf /tmp/cc-kept
    extra=SWEEP_AUTOTUNE_STORE=all sweep_run current $grid "$results/kept-cold" kept ;;
  store-sides)  # the current tree alone: only the trials' kernel timings kept (the default) against the sides' too
    report=1
    rm -rf /tmp/cc-current /tmp/cc-kept "$results"/*-cold "$results"/*-warm
    sweep_run current $grid "$results/current-cold"
    extra=SWEEP_AUTOTUNE_STORE=all sweep_run current $grid "$results/kept-cold" kept
    extra=SWEEP_AUTOTUNE_STORE=all sweep_run current $grid "$results/kept-warm" kept
    sweep_run current $grid "$results/current-warm" ;;
  cold-first)  # acceptance for a short device budget: both trees cold first, then warm (the deadline stops the rest)
    both_trees current-cold base-cold current-warm base-warm ;;
  wait)  # the current tree cold twice, each its own empty cache: each trial waiting for its own side processes (the
    # default), then for all of them (SWEEP_PRECOMPILE_WAIT=all, as before session 33)
    report=1
    rm -rf /tmp/cc-current /tmp/cc-all "$results"/*-cold
    sample_processes
    sweep_run current $grid "$results/current-cold"
    extra=SWEEP_PRECOMPILE_WAIT=all sweep_run current $grid "$results/all-cold" all ;;
  current-cold-warm)  # the current tree alone, cold then warm (a device budget too short for the base beside it)
    rm -rf /tmp/cc-current "$results"/*-cold "$results"/*-warm
    sweep_run current $grid "$results/current-cold"
    sweep_run current $grid "$results/current-warm" ;;
  prestart)  # rank (and side) processes started ahead against started once placed: the same tree, each its own cache
    rm -rf /tmp/cc-current /tmp/cc-late "$results"/*-cold "$results"/*-warm
    sweep_run current $grid "$results/current-cold"
    prestarted=0 sweep_run current $grid "$results/late-cold" late
    prestarted=0 sweep_run current $grid "$results/late-warm" late
    sweep_run current $grid "$results/current-warm" ;;
  threads)  # each side process's compile workers: a quarter of the cores against every core (the default), A B A
    report=1
    rm -rf /tmp/cc-quarter /tmp/cc-threads /tmp/cc-again "$results"/*-cold
    threads=$(($(nproc) / 4)) sweep_run current $grid "$results/quarter-cold" quarter
    sweep_run current $grid "$results/threads-cold" threads
    threads=$(($(nproc) / 4)) sweep_run current $grid "$results/again-cold" again ;;
  report)  # the current tree cold once, with the side processes' seconds, peak memory and span a set
    # (SWEEP_COMPILE_REPORT), and what ran beside them (sample_processes)
    report=1
    rm -rf /tmp/cc-current "$results"/*-cold
    sample_processes
    sweep_run current $grid "$results/current-cold" ;;
  store)  # kernel benchmarks kept across processes (trainer.autotune_store) on and off, on one warm cache: the current
    # tree cold, then warm A B A: the current tree, the base tree (prepare.sh base with the commit before the store,
    # f6ac372) on the current tree's cache, the current tree again (.../again-warm)
    report=1
    rm -rf /tmp/cc-current "$results"/*-cold "$results"/*-warm
    sweep_run current $grid "$results/current-cold"
    sweep_run current $grid "$results/current-warm"
    sweep_run base $grid "$results/base-warm" current
    sweep_run current $grid "$results/again-warm" ;;
  base)  # the base tree alone, cold then warm, on a machine where a current part (prestart) has just run
    rm -rf /tmp/cc-base "$results"/base-*
    sweep_run base $grid "$results/base-cold"
    sweep_run base $grid "$results/base-warm" ;;
  searches)
    rm -rf /tmp/cc-base /tmp/cc-current
    sweep_run current $grids/b-oom.yaml "$results/current-searches"
    sweep_run current $grids/c-max-batch.yaml "$results/current-searches"
    sweep_run base $grids/b-oom.yaml "$results/base-searches" ;;  # the baseline's halvings, if time is left
  max-batch)
    # the max-batch search alone on a fresh machine (an empty compile cache), then one trial of the batch it found
    # fastest, as a user would measure it (`sweep run`, fresh processes, static shapes, its own empty cache): the
    # search's cost against measuring its answer once (issue 28: at most 1.5x)
    rm -rf /tmp/cc-current /tmp/cc-one "$results"/max-batch-*
    sweep_run current $grids/c-max-batch.yaml "$results/max-batch-search"
    fastest=$(python3 -c 'import json, glob, sys; v = json.load(open(sorted(glob.glob(sys.argv[1] + "/_search/*.json"))[-1]))
print((v[0] if isinstance(v, list) else v["verdicts"][0])["fastest_batch"])' "$results/max-batch-search")
    echo "fastest batch of the search: $fastest"
    sed "s/^batch_sizes: .*/batch_sizes: [$fastest]/; s/^search: .*//; s/^name: .*/name: cold-sweep\/one-trial/" \
      $grids/c-max-batch.yaml >/tmp/one-trial.yaml
    rm -rf /tmp/cc-current  # the one trial: its own empty cache
    sweep_run current /tmp/one-trial.yaml "$results/max-batch-one-trial" ;;
  *) echo "usage: bash benchmarks/device/cold_sweep.sh cold|warm|cold-warm|acceptance|cold-first|wait|store|store-sides|current-cold-warm|prestart|report|threads|searches|max-batch [PROFILE]" >&2; exit 2 ;;
esac
python3 benchmarks/cold_sweep_check.py "$results" || { [ $status -ne 0 ] || status=1; }
python3 -c 'import duckdb' 2>/dev/null && for d in "$results"/*/; do  # `sweep results` needs .whl-results
  echo "== $(basename "$d")"
  $SWEEP results export "$d" --format md
done
pack "$results"
echo "job: rows in \$OUT/$campaign.tgz (exit $status)"
exit $status
