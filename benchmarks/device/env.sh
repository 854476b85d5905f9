# Sourced by benchmarks/device/job.sh: the environment of the lent H200 machine, run from the project root.
# The packages it lacks (ray, torchao, pydantic, duckdb, Transformer Engine) are installed into /tmp/site,
# which stays while the machine is kept warm between jobs.
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
export SWEEP="python3 -m sweep"            # sweep itself is not installed there: run it from the tree
export PYTHONUNBUFFERED=1 COLUMNS=220      # logs line by line; tables not cut at 80 columns
export SWEEP_DEBUG=1                       # tracebacks and Ray's logs in the job's log
# NVLink multicast (NVLS) off in NCCL, PyTorch symmetric memory and NVSHMEM, as in the profiles' env: on
# these shared hosts a program that creates multicast objects can take the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
