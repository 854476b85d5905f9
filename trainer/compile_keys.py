"""What makes one graph one cache key in every process: inductor's FX graph cache and AOTAutograd's cache.

A later trial (or a rank after the side process that compiled its graphs ahead, `trainer.precompile`) finds a graph in
the on-disk caches only if both processes compute the same key for it, and only if torch can compute a key at all.
Three things in torch stood in the way; `install()` mends them, once per process, before anything compiles
(`trainer.parallelize` calls it on import, so every rank and side process has it), and keeps AOTAutograd's cache from
what the third mend would break there (4.):

1. A memory format in the FX graph cache key. The key pickles each graph input's `torch.memory_format`. torch registers
   no reducer for it (it does for `torch.layout`), so pickle names one by the first module in sys.modules through which
   it is reachable: `torch._utils` in a plain process, `cython.cimports.libc` in a Ray worker (on an H200, torch 2.11).
   The same graph had one key in a rank and another in the side process that compiled it, and every trial missed what
   was compiled for it. Reduced by name, the key is the same in every process.

2. torchao's FP8 autograd Functions in the AOTAutograd cache key. torchao marks them `allow_in_graph`, so dynamo puts a
   call to a closure (`trampoline_autograd_apply`) in the graph, and AOTAutograd traces into it. Its cache could key
   neither the closure (a local function: pickling the graph for the key fails) nor the config classes torchao builds
   in the graph, so it bypassed every torchao graph: each trial traced its forward and backward again and ran the
   partitioner, even when inductor's FX cache then had the compiled code (a new batch of a rowwise graph paid 4.2-5.2 s
   on an H200, benchmarks/RESULTS.md "Cold sweep", session 24). On CPU ranks (torch 2.11 and 2.13, emulated FP8) the
   key below makes the second process hit, with the same gradients (tests/test_compile_keys.py).
   The key of such a call names the Function, torchao's version and whether sweep's amax (`trainer.precision.
   symbolic_amax`) replaced torchao's, with its source's hash: what the traced code depends on beyond the graph, whose
   code (with the configs' constant arguments) is in the key already. torch's own switch for this is
   `torch._inductor.config.unsafe_marked_cacheable_functions`: a name in it is cacheable, and its value is part of
   every FX graph's key, so the values here are the same in every process of one install (no state that a trial
   changes). torchao made these Functions cacheable itself in a later release (pytorch/ao#4840: no `allow_in_graph`),
   then put that behind a config flag (pytorch/ao#4879); with it this changes nothing.

3. A device mesh in the FX graph cache key. A regionally compiled block of a tensor-parallel trial takes its DTensors'
   DeviceMesh as graph inputs (opaque objects); the key pickles each whole, with the pickler's memo on (torch 2.13), so
   the key also depends on which strings and tuples inside the meshes happen to be one object in this process. Every
   part of the key was the same in two runs of one TP grid, the key was not, and every TP trial compiled every graph
   again (a CPU TP 2 trial: 4 misses, 33 s of compile, on a cache its own earlier run had filled). Keyed by what the
   mesh is (device type, ranks, dimension names, and its root mesh's), the second run finds all four
   (tests/test_layouts_run.py).

4. AOTAutograd's cache and those meshes. Keyed as in 3. by AOTAutograd's cache too (its key pickler is inductor's),
   the graphs of a TP trial's blocks shared one AOTAutograd key (torch 2.13, CPU: a TP 2 trial's graphs on both ranks,
   one key, four entries) although their entries differ, so with `dynamic_batch: false` the next process loaded another
   graph's entry and failed in its first block (`'Tensor' object has no attribute 'elem'`, or a segfault). With a
   symbolic batch (the default) torch saved no entry anyway (the DTensor spec it would store holds the batch's SymInt).
   So a graph with a mesh input bypasses AOTAutograd's cache: the trial traces its forward and backward again, and
   inductor's FX graph cache, keyed as in 3., still serves the compiled code (tests/test_layouts_run.py).

The mends never fail a trial: where a torch has other internals, the graph is keyed (or bypassed) as torch would.
"""

from __future__ import annotations

import copyreg
import functools
import hashlib
from pathlib import Path
from typing import Any, cast

import torch

# The in-graph calls of a torchao FP8 graph that AOTAutograd's cache refuses by name (torchao 0.18): the config classes
# torchao builds from constants, and dynamo's closure around an allow_in_graph autograd Function (keyed below).
TRAMPOLINE = "torch._dynamo.variables.misc.trampoline_autograd_apply"
TORCHAO_IN_GRAPH = (
    "torchao.float8.float8_training_tensor.ScaledMMConfig",
    "torchao.float8.float8_training_tensor.LinearMMConfig",
    "torchao.float8.config.CastConfig",
    "torchao.float8.config.Float8GemmConfig",
    "torchao.float8.config.Float8LinearConfig",
    TRAMPOLINE,
)


def memory_format(name: str) -> torch.memory_format:
    """torch.contiguous_format for 'contiguous_format': how a pickled memory format is rebuilt (1. above)."""
    return cast(torch.memory_format, getattr(torch, name))


@functools.cache
def torchao_fingerprint() -> str:
    """torchao's version and the hash of sweep's amax (what a torchao Function's trace depends on); '' without it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torchao = version("torchao")
    except PackageNotFoundError:
        return ""
    amax = Path(__file__).parent / "precision" / "symbolic_amax.py"
    return f"torchao {torchao}, sweep amax {hashlib.sha256(amax.read_bytes()).hexdigest()[:16]}"


def function_key(name: str, obj: Any) -> str | None:
    """The cache key's line for global `name` of a graph when it is dynamo's closure around one of torchao's autograd
    Functions; None for anything else (torch formats it)."""
    origin = getattr(obj, "_origin", None)
    if getattr(origin, "__name__", None) != "produce_trampoline_autograd_apply" or not obj.__closure__:
        return None
    function = obj.__closure__[0].cell_contents  # the closure's one free variable: the Function's class
    module = getattr(function, "__module__", "")
    if not isinstance(function, type) or not module.startswith("torchao."):
        return None
    from trainer.precision import symbolic_amax

    amax = "sweep's amax" if symbolic_amax.installed() else "torchao's amax"
    return f"# {name} = {module}.{function.__qualname__}.apply ({torchao_fingerprint()}; {amax})"


def _keyed_imports(original: Any) -> Any:
    def format_import(name: str, obj: Any, importer: Any) -> str:
        return function_key(name, obj) or original(name, obj, importer)

    format_import.sweep_original = original  # type: ignore[attr-defined]
    return format_import


def mesh_key(mesh: Any) -> str:
    """What a DeviceMesh graph input is, as one new string (3. above): nothing in it for the pickler's memo to share."""
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    parts = [(m.device_type, m.mesh.tolist(), m.mesh_dim_names) for m in (mesh, root)]
    return "".join(["DeviceMesh ", repr(parts)])


def _keyed_meshes(original: Any, ident: Any, mesh_type: type, aot: tuple[type, type[Exception]] | None) -> Any:
    """`aot`: AOTAutograd's key pickler and its bypass exception, where this torch has them (4. above)."""

    def reduce_fake_script_object(pickler: Any, obj: Any) -> Any:
        real = getattr(obj, "real_obj", None)
        if not isinstance(real, mesh_type):
            return original(pickler, obj)
        if aot is not None and isinstance(pickler, aot[0]):  # AOTAutograd's cache computes no key, so it bypasses
            raise aot[1]("a DeviceMesh graph input: its entries are not keyed apart (sweep's trainer/compile_keys.py)")
        return (ident, (mesh_key(real),))

    reduce_fake_script_object.sweep_original = original  # type: ignore[attr-defined]
    return reduce_fake_script_object


def _key_meshes() -> None:
    try:
        from torch._inductor.codecache import FxGraphCachePickler, _ident
        from torch.distributed.device_mesh import DeviceMesh

        original = FxGraphCachePickler._reduce_fake_script_object
    except (ImportError, AttributeError):  # another torch: it keys (or bypasses) these graphs itself
        return
    try:
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCachePickler, BypassAOTAutogradCache

        aot: tuple[type, type[Exception]] | None = (AOTAutogradCachePickler, BypassAOTAutogradCache)
    except (ImportError, AttributeError):  # no AOTAutograd cache of this kind: nothing to keep it from
        aot = None
    if not hasattr(original, "sweep_original"):
        keyed = _keyed_meshes(original, _ident, DeviceMesh, aot)
        FxGraphCachePickler._reduce_fake_script_object = keyed  # type: ignore[method-assign]


def install() -> None:
    """The mends, once per process (idempotent)."""
    copyreg.pickle(torch.memory_format, lambda f: (memory_format, (str(f).removeprefix("torch."),)))
    _key_meshes()
    fingerprint = torchao_fingerprint()
    if not fingerprint:  # no torchao: none of its graphs to key
        return
    try:
        import torch._inductor.config as inductor_config
        import torch.fx.graph_module as graph_module

        original = graph_module._format_import_statement  # how a graph's globals are written for its key
    except (ImportError, AttributeError):  # another torch: its caches key (or bypass) these graphs themselves
        return
    if not hasattr(original, "sweep_original"):
        graph_module._format_import_statement = _keyed_imports(original)
    marked = dict(getattr(inductor_config, "unsafe_marked_cacheable_functions", {}))
    marked.update(dict.fromkeys(TORCHAO_IN_GRAPH, fingerprint))
    inductor_config.unsafe_marked_cacheable_functions = marked
