#!/usr/bin/env bash
# Make, on a machine with pip and a package index, the packages that benchmarks/device/job.sh installs on the
# lent H200 machine. That machine reaches no index; it has Python 3.12, torch 2.11.0+cu130, numpy, pyarrow,
# typer, rich and pyyaml, and a job ships the tracked tree plus at most 64 MiB of git-ignored folders.
# Run from the project root (the folders below are git-ignored):
#
#   bash benchmarks/device/prepare.sh wheels       .whl/: ray (Java jars dropped), torchao, pydantic, nvidia-ml-py (~52 MB)
#   bash benchmarks/device/prepare.sh results      .whl-results/: duckdb, matplotlib for `sweep results` (~48 MB)
#   bash benchmarks/device/prepare.sh te-binding   te-build/out/: TE's torch binding built for the machine's
#                                                  torch (sm_90); needs nvcc 13 and python3.12; ~6 min on 2 cores
#   bash benchmarks/device/prepare.sh te BINDING   .te1 ... .te5 and .tefinal: TE's 276 MB core wheel in 50 MiB
#                                                  parts (more than one job can carry), its Python wheel and the
#                                                  binding wheel BINDING (from te-binding)
#   bash benchmarks/device/prepare.sh base COMMIT  .base-tree/: COMMIT's sweep, trainer and clusters, the baseline
#                                                  benchmarks/device/cold_sweep.sh runs beside the current tree
set -euo pipefail
RAY=${RAY_VERSION:-2.60.0} AO=${TORCHAO_VERSION:-0.18.0} TE=${TE_VERSION:-2.20.2} TORCH=${TORCH_VERSION:-2.11.0}
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# already on the machine: leave them out (the 64 MiB a job may carry is the limit)
ON_MACHINE='^(torch|numpy|nvidia_|triton|setuptools|typing_extensions|pyyaml|PyYAML|filelock|click|requests|urllib3|idna|certifi|charset_normalizer|packaging|msgpack|protobuf|attrs|rich|markdown_it_py|mdurl|pygments|typer|shellingham|pyarrow|fsspec|jinja2|MarkupSafe|markupsafe|sympy|mpmath|networkx)-'

download() {  # download OUT PACKAGE...: wheels for the machine, less what it has
  local out=$1 tmp
  shift
  tmp=$(mktemp -d)
  python3 -m pip download -q "${PLATFORM[@]}" -d "$tmp" "$@"
  mkdir -p "$out"
  # nvidia-ml-py's wheel starts like the CUDA libraries the machine has, but the machine lacks it
  for w in "$tmp"/*.whl; do [[ $(basename "$w") =~ $ON_MACHINE && $(basename "$w") != nvidia_ml_py-* ]] || cp "$w" "$out/"; done
  rm -rf "$tmp"
  du -sh "$out"
}

te_parts() {  # te BINDING
  local binding=$1 tmp core
  [ -f "$binding" ] || { echo "error: no torch binding wheel $binding (make one: prepare.sh te-binding)" >&2; exit 2; }
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps "${PLATFORM[@]}" -d "$tmp" "transformer-engine-cu13==$TE" "transformer-engine==$TE"
  core=$(cd "$tmp" && ls transformer_engine_cu13-*.whl)
  rm -rf .te1 .te2 .te3 .te4 .te5 .tefinal
  mkdir -p .te1 .te2 .te3 .te4 .te5 .tefinal
  (cd "$tmp" && split -b 50M -d -a 1 "$core" part && sha256sum "$core") > .tefinal/core.sha256
  for i in 0 1 2 3 4; do mv "$tmp/part$i" ".te$((i + 1))/"; done
  mv "$tmp/part5" .tefinal/
  cp "$tmp/transformer_engine-$TE-py3-none-any.whl" "$binding" .tefinal/
  rm -rf "$tmp"
  du -sh .te1 .te2 .te3 .te4 .te5 .tefinal
}

te_binding() {  # the torch extension of TE, compiled against the machine's torch, CUDA 13 and Hopper (sm_90)
  local root=$PWD/te-build py site
  mkdir -p "$root"
  ${PYTHON312:-python3.12} -m venv "$root/v"
  py=$root/v/bin/python
  $py -m pip install -q "pip<26.2"
  $py -m pip install -q "torch==$TORCH" numpy pybind11 ninja "setuptools<82" wheel packaging pydantic importlib-metadata
  $py -m pip install -q --no-deps "transformer-engine-cu13==$TE" "transformer-engine==$TE"
  site=$($py -c "import site; print(site.getsitepackages()[0])")/nvidia
  CPATH=$site/cu13/include:$site/nccl/include:$site/cudnn/include:$site/cusparselt/include \
  LIBRARY_PATH=$site/cu13/lib:$site/nccl/lib:$site/cudnn/lib:/usr/local/cuda/lib64 CUDNN_PATH=$site/cudnn \
  NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 MAX_JOBS=2 NVTE_BUILD_THREADS_PER_JOB=1 NVTE_PYTORCH_FORCE_BUILD=TRUE \
  CUDA_HOME=/usr/local/cuda CUDA_PATH=/usr/local/cuda \
    $py -m pip wheel --no-deps --no-build-isolation -w "$root/out" "transformer-engine-torch==$TE"
  ls "$root"/out/transformer_engine_torch-*.whl
}

case ${1:-} in
  wheels)
    download .whl "ray==$RAY" "torchao==$AO" pydantic nvidia-ml-py  # pynvml: the energy counter (trainer.energy)
    # Ray's Java jars (32 MB) are not used from Python; without them the wheels fit in one job
    for w in .whl/ray-*.whl; do zip -q -d "$w" 'ray/jars/*' || true; done ;;
  results) download .whl-results duckdb matplotlib ;;
  te-binding) te_binding ;;
  te) [ $# -eq 2 ] || { echo "usage: prepare.sh te BINDING_WHEEL" >&2; exit 2; }; te_parts "$2" ;;
  base)  # .base-tree/: the code of COMMIT (sweep, trainer, clusters), the baseline a campaign runs beside this tree
    [ $# -eq 2 ] || { echo "usage: prepare.sh base COMMIT" >&2; exit 2; }
    rm -rf .base-tree && mkdir .base-tree
    git archive "$2" -- sweep trainer clusters | tar x -C .base-tree
    git rev-parse --short=12 "$2" > .base-tree/COMMIT
    du -sh .base-tree ;;
  *) echo "usage: bash benchmarks/device/prepare.sh wheels | results | te-binding | te BINDING_WHEEL | base COMMIT" >&2
     exit 2 ;;
esac
