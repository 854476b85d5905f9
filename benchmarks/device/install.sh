#!/usr/bin/env bash
# On the lent H200 machine, from the project root: install into /tmp/site what this job carries (folders made
# by benchmarks/device/prepare.sh). /tmp stays while the machine is warm, so packages too big for one job
# arrive over several jobs run back to back:
#   .whl/           ray, torchao, pydantic, nvidia-ml-py (pynvml: GPU energy; without it the energy columns are null)
#   .whl-results/   duckdb, matplotlib (the tables of `sweep results`)
#   .te1 ... .te5   one 50 MiB part each of Transformer Engine's core wheel: kept in /tmp/stage
#   .tefinal/       the last part, the core wheel's checksum, TE's Python wheel and torch binding: the parts
#                   are joined, checked and TE installed
set -euo pipefail

pip_install() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$@"
}

have() {  # have MODULE...: all import from /tmp/site (a warm machine keeps what an earlier job installed)
  PYTHONPATH=/tmp/site python3 -c "import $(IFS=,; echo "$*")" 2>/dev/null
}

[ -d .whl ] && ! have ray torchao pydantic pynvml && { echo "install: .whl"; pip_install .whl/*.whl; }
[ -d .whl-results ] && ! have duckdb matplotlib && { echo "install: .whl-results"; pip_install .whl-results/*.whl; }

mkdir -p /tmp/stage
for d in .te1 .te2 .te3 .te4 .te5 .tefinal; do
  if [ -d "$d" ]; then
    cp "$d"/part* /tmp/stage/
    echo "install: staged $(ls "$d" | grep '^part') of Transformer Engine's core wheel"
  fi
done

if [ -d .tefinal ] && ! have transformer_engine.pytorch; then
  core=$(awk '{print $2}' .tefinal/core.sha256)
  for i in 0 1 2 3 4 5; do
    [ -f /tmp/stage/part$i ] || { echo "error: TE part$i is not staged (carry .te$((i + 1)) in a job before this one;" \
                                       "a fresh machine starts again from .whl)" >&2; exit 1; }
  done
  cat /tmp/stage/part0 /tmp/stage/part1 /tmp/stage/part2 /tmp/stage/part3 /tmp/stage/part4 /tmp/stage/part5 \
    > "/tmp/stage/$core"
  (cd /tmp/stage && sha256sum --check --quiet -) < .tefinal/core.sha256
  pip_install "/tmp/stage/$core" .tefinal/transformer_engine-*.whl .tefinal/transformer_engine_torch-*.whl
  echo "install: Transformer Engine in /tmp/site"
fi
