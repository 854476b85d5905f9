"""One rank of one trial: a plain class that the scheduler runs as a Ray actor (one process per rank).

`run(job)` never raises: it returns a dict with `status` ('ok', 'oom' or 'error') and what it measured,
so the driver learns of a failed rank at once and can tear the whole group down (no rank waits for an
NCCL timeout). Timing follows nanoGPT's bench.py: warm up, then time each step between device syncs.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
import traceback
from datetime import timedelta

from trainer.job import RankJob, classify_failure


def learning_rate(d_embd: int) -> float:
    """AdamW lr scaled as 1/width (muP-style, Yang et al. 2022): 1e-3 for the tiny models, ~7.5e-5 for d 4096.
    A fixed 1e-3 made Llama3-8B's loss rise over its first 10 steps; this keeps every model's loss falling."""
    return min(1e-3, 0.3 / d_embd)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out = {"torch_version": torch.__version__}
    for key, distribution in (("te_version", "transformer-engine"), ("torchao_version", "torchao")):
        try:
            out[key] = version(distribution)
        except PackageNotFoundError:
            out[key] = None
    return out


def _device_info(device) -> dict:
    import torch

    if device.type != "cuda":
        return {"gpu_name": None, "driver_version": None, "cuda_version": None}
    driver = None
    try:
        import subprocess

        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.split("\n")[0].strip() or None
    except Exception:
        pass
    runtime = torch.version.hip and f"hip {torch.version.hip}" or f"cuda {torch.version.cuda}"
    return {"gpu_name": torch.cuda.get_device_name(device), "driver_version": driver, "cuda_version": runtime}


def _rendezvous_store(job: RankJob, timeout: timedelta, listener: socket.socket | None = None):
    """The process group's TCPStore, served by rank 0 on MASTER_ADDR only.

    torch's default store listens on every interface; bound to rank 0's node address it is reachable by
    the other ranks and, for the embedded cluster (127.0.0.1), by nothing beyond this machine. Rank 0
    serves on `listener`, the socket `node_info` bound when it chose the port and kept listening since: a
    port picked, released and bound again later could be taken in between by a trial starting beside it.
    """
    import torch.distributed as dist

    if job.rank != 0:
        return dist.TCPStore(job.master_addr, job.master_port, job.world_size, False, timeout=timeout)
    if listener is None or listener.getsockname()[1] != job.master_port:  # a job not placed by node_info
        listener = _listen(job.master_addr, job.master_port)
    return dist.TCPStore(job.master_addr, job.master_port, job.world_size, True, timeout=timeout,
                         master_listen_fd=listener.detach())


def _listen(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen()
    return listener


class RankWorker:
    def __init__(self) -> None:
        self.created_at = time.perf_counter()
        self.listener: socket.socket | None = None  # rank 0's store socket, from node_info to the rendezvous

    def node_info(self) -> dict:
        """Where this rank runs, and a port it holds listening on its address (rank 0's becomes MASTER_PORT)."""
        node_id = None
        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
            ip = ray.util.get_node_ip_address()
        except Exception:
            ip = "127.0.0.1"
        self.listener = _listen(ip, 0)
        port = self.listener.getsockname()[1]
        return {"ip": ip, "port": port, "hostname": socket.gethostname(), "node_id": node_id, "pid": os.getpid()}

    def run(self, job: RankJob) -> dict:
        try:
            result = {"status": "ok", **self._train(job)}
        except BaseException as e:  # noqa: BLE001 - every failure becomes a row, with its class
            message = f"{type(e).__name__}: {e}".strip()
            # Report at once, without destroying a shared process group: peers may be inside a collective,
            # and tearing down a communicator they still use can block. The driver kills every rank now.
            if job.world_size == 1:
                self._teardown()
            return {"status": classify_failure(type(e).__name__, message), "error": message[:2000],
                    "traceback": traceback.format_exc()[-4000:]}
        self._teardown()
        return result

    def _take_listener(self, job: RankJob) -> socket.socket | None:
        """Rank 0 keeps the socket node_info bound for the store; the other ranks close theirs."""
        listener, self.listener = self.listener, None
        if listener is not None and job.rank != 0:
            listener.close()
            listener = None
        return listener

    def _teardown(self) -> None:
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # the result is already measured; a failing teardown must not lose it
            pass

    def _train(self, job: RankJob) -> dict:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule

        from trainer.memory import memory_cap, peak_stats, reset_peak
        from trainer.models import ModelSpec, build_model
        from trainer.parallelize import parallelize
        from trainer.precision import precision_plan

        if job.device_type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())  # Ray set CUDA/HIP_VISIBLE_DEVICES
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            backend = "gloo"
        os.environ.update(MASTER_ADDR=job.master_addr, MASTER_PORT=str(job.master_port), RANK=str(job.rank),
                          WORLD_SIZE=str(job.world_size), LOCAL_RANK=str(job.local_rank))
        timeout = timedelta(seconds=job.pg_timeout_s)
        dist.init_process_group(backend, store=_rendezvous_store(job, timeout, self._take_listener(job)), rank=job.rank,
                                world_size=job.world_size, timeout=timeout,
                                device_id=device if device.type == "cuda" else None)
        mesh = init_device_mesh(device.type, (job.world_size,))
        spec = ModelSpec.model_validate_json(job.trial.model_spec_json)
        if device.type == "cuda":
            # fp32 recipes use TF32 tensor cores: the catalog's NVIDIA fp32 peak (the MFU divisor) is TF32's
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        plan = precision_plan(job.trial.precision, device_type=device.type, sharded=job.world_size > 1,
                              fp8_lm_head=job.trial.options.fp8_lm_head)

        # SWEEP_MEMORY_CAP_RANKS=1,3 caps only those ranks (to rehearse one rank failing alone).
        capped = os.environ.get("SWEEP_MEMORY_CAP_RANKS")
        cap = job.trial.memory_cap_bytes if capped is None or str(job.rank) in capped.split(",") else None
        with memory_cap(cap, device):
            reset_peak(device)
            torch.manual_seed(job.trial.seed)
            with torch.device("meta"):  # build on meta, shard, then materialise only this rank's shard
                model = build_model(spec, backend=plan.model_backend, fp8_lm_head=job.trial.options.fp8_lm_head)
            n_params = sum(p.numel() for p in model.parameters())  # N of the FLOP formula: every parameter
            model = parallelize(model, plan=plan, compile_mode=job.trial.compile, ac=job.trial.ac, mesh=mesh,
                                reduce_dtype=job.trial.options.reduce_dtype)
            model.to_empty(device=device)
            with torch.no_grad():
                model.init_weights()  # a fully compiled model forwards the call to the original
            params_local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
            optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate(spec.d_embd), fused=device.type == "cuda")

            # Synthetic tokens. Labels are a fixed random permutation of the inputs: a mapping the model
            # can learn (loss falls, showing the step really trains) with no shortcut at init (the
            # first loss is ~ln V). The batches are made up front so no data work is timed: 4, or one per
            # micro-batch of a step so that a step's micro-batches are distinct (a token batch is KBs).
            # The permutation is the task, the same on every rank; each rank draws its own tokens.
            perm = torch.randperm(spec.vocab_size, generator=torch.Generator(device=device).manual_seed(job.trial.seed),
                                  device=device)
            gen = torch.Generator(device=device).manual_seed(job.trial.seed + 1 + job.rank)
            n_batches = min(max(4, job.trial.options.grad_accum), (job.trial.warmup_steps + job.trial.measure_steps) * job.trial.options.grad_accum)
            batches = [torch.randint(spec.vocab_size, (job.trial.batch_size, job.trial.seq_len), generator=gen, device=device)
                       for _ in range(n_batches)]

            def sync() -> None:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)

            def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
                return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

            # Compiled with the model: inductor fuses the fp32 upcast into the log-softmax, so the
            # (tokens x vocab) logits are never materialised in fp32 (torchtitan compiles its loss too).
            loss_fn = torch.compile(cross_entropy) if job.trial.compile != "none" else cross_entropy
            # TE caches each layer's FP8 weights on a step's first micro-batch and reuses them for the
            # rest (weights only change at the optimizer step), as seed 000 does.
            weight_cache = plan.model_backend == "te" and job.trial.options.grad_accum > 1
            fsdp_root = getattr(model, "_orig_mod", model)  # `full` compile wraps the sharded model
            sync_once = job.trial.options.grad_sync == "step" and job.trial.options.grad_accum > 1 and isinstance(fsdp_root, FSDPModule)

            def step(i: int) -> torch.Tensor:
                """One optimizer step over grad_accum micro-batches. By default FSDP2 reduce-scatters the
                gradients of each micro-batch as its backward runs (as seed 000's FSDP1 loop without no_sync
                does); with grad_sync "step" only the last micro-batch's backward does."""
                total = torch.zeros((), device=device)
                for micro in range(job.trial.options.grad_accum):
                    if sync_once:
                        # Before the last micro-batch: gradients accumulate unsharded on each rank (FSDP1's
                        # no_sync; + one unsharded gradient copy in memory) and parameters stay gathered
                        # after backward, so the next forward needs no all-gather (FSDP2's documented
                        # trade of memory for communication during accumulation).
                        last = micro == job.trial.options.grad_accum - 1
                        fsdp_root.set_requires_gradient_sync(last)
                        fsdp_root.set_reshard_after_backward(last)
                    tokens = batches[(i * job.trial.options.grad_accum + micro) % len(batches)]
                    kwargs = {"is_first_microbatch": micro == 0} if weight_cache else {}
                    with plan.training_context():
                        logits = model(tokens, **kwargs)
                    loss = loss_fn(logits, perm[tokens]) / job.trial.options.grad_accum
                    loss.backward()
                    total += loss.detach()
                if job.trial.options.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), job.trial.options.grad_clip)  # seed 000: 1.0
                optimizer.step()
                plan.after_optimizer_step(model)
                optimizer.zero_grad(set_to_none=True)
                return total

            dist.barrier()
            init_time_s = time.perf_counter() - self.created_at
            times, losses = [], []
            for i in range(job.trial.warmup_steps + job.trial.measure_steps):
                sync()
                t0 = time.perf_counter()
                loss = step(i)
                sync()
                times.append(time.perf_counter() - t0)
                losses.append(loss.detach())
            dist.barrier()
            memory = peak_stats(device)

        measured = times[job.trial.warmup_steps:]
        steady = statistics.median(measured)
        return {
            "step_times": measured,
            "compile_time_s": max(0.0, times[0] - steady),
            "init_time_s": init_time_s,
            "loss_first": float(losses[0]),
            "loss_last": float(losses[-1]),
            "n_params": n_params,
            "params_local": params_local,
            **memory,
            **_versions(),
            **_device_info(device),
        }
