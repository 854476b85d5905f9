# The `layouts` campaign (issue 35), sourced by benchmarks/device/job.sh on a lent machine of 2 or 4 H200s
# (kind nvidia-h200-x2 or -x4, carrying .whl then .whl-results):
#
#   SWEEP_GIT_SHA=<commit> bash benchmarks/device/job.sh layouts
#
# Each grid of benchmarks/campaigns/layouts/ runs on its own profile, as many as the machine's GPUs allow, all into
# one result folder: with 2 GPUs a-two-gpus (FSDP 2 against TP 2, one Ray node) and b-two-nodes (FSDP 2 against HSDP
# 2 x 1 over two Ray nodes of one GPU, started here; and `sweep plan` must refuse TP 2 across them, exit 2); with 4
# GPUs c-four-gpus (FSDP 4, FSDP 2 x TP 2) and d-four-gpus-two-nodes (HSDP 2 x 2 over two Ray nodes of two GPUs)
# instead (LAYOUTS_GPUS=2 runs the 2-GPU ones there). A campaign cut by the job's limit goes on in the next job from
# the rows it packed, as job.sh says (--resume). Then `sweep results compare --by tp` and `--by dp_replicate`: each
# layout's TFLOP/s/GPU over FSDP's, with both losses at the same tokens. A grid that measured nothing (exit 3) does not
# stop the others; the job exits with it, as benchmarks/run.sh does. Needs from job.sh: $SWEEP, $results, $deadline;
# lib.sh's ray_nodes_start/stop.

layout_grid() {  # layout_grid GRID PROFILE: one grid of the campaign on one profile, stopped with SIGINT at the deadline
  local left=$((deadline - SECONDS)) grid=benchmarks/campaigns/layouts/$1.yaml
  [ $left -gt 30 ] || { echo "job: no time left for $1"; return 124; }
  echo "== $(date -u +%FT%TZ) $SWEEP run $grid --cluster $2"
  # shellcheck disable=SC2086 # SWEEP_RUN_ARGS: job.sh's --resume when an earlier job's rows were carried in
  timeout --signal=INT --kill-after=20 $left $SWEEP run "$grid" --cluster "$2" --output "$results" --no-progress \
    ${SWEEP_RUN_ARGS:-}
}

layouts() {
  local gpus status=0
  gpus=${LAYOUTS_GPUS:-$(nvidia-smi -L | wc -l)}  # LAYOUTS_GPUS=2 runs the 2-GPU grids on a 4-GPU machine
  echo "layouts: $gpus GPUs"
  if [ "$gpus" -ge 4 ]; then
    layout_grid c-four-gpus benchmarks/profiles/h200x4.yaml || status=$?
    ray_nodes_start 2
    layout_grid d-four-gpus-two-nodes benchmarks/profiles/h200x4-2nodes.yaml || status=$?
    ray_nodes_stop
  elif [ "$gpus" -ge 2 ]; then
    layout_grid a-two-gpus benchmarks/profiles/h200x2.yaml || status=$?
    ray_nodes_start 1
    # TP must stay on one node: planning it over the two nodes is a user error (exit 2) naming the node
    $SWEEP plan benchmarks/campaigns/layouts/b-two-nodes.yaml --cluster benchmarks/profiles/h200-2nodes.yaml \
      --tp 2 --dp-replicate 1
    [ $? -eq 2 ] || { echo "layouts: tp 2 over two nodes was not refused"; status=1; }
    layout_grid b-two-nodes benchmarks/profiles/h200-2nodes.yaml || status=$?
    ray_nodes_stop
  else
    echo "layouts: needs 2 or 4 GPUs (kind nvidia-h200-x2 or -x4)"
    return 2
  fi
  # each layout over FSDP's, with the losses at the same tokens beside them (compare shows both)
  $SWEEP results compare "$results" --by tp --format md
  $SWEEP results compare "$results" --by dp_replicate --format md
  $SWEEP results export "$results" --format md
  return $status
}
