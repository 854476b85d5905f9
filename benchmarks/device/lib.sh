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
