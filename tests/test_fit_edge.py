"""The tune fit near memory's edge (sweep.search.fastest.level_fit.LevelFit._below_the_edge), on the simulated machine
of tests/test_tune.py, and the OOM message it reads (sweep.search.oom_demand). Pure logic: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass

from test_tune import GIB, Machine, grid, run

from sweep.search.fastest.plan import TunePlan
from sweep.search.oom_demand import oom_demand_bytes

# A real one (one H200, TE FP8 delayed, Llama3-8B dims, 8 layers, batch 11), the way a row joins its ranks' errors
H200_OOM = (
    "rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 21.53 GiB. GPU 0 has a total capacity of 139.80 "
    "GiB of which 17.29 GiB is free. Including non-PyTorch memory, this process has 122.50 GiB memory in use. Of the "
    "allocated memory 121.24 GiB is allocated by PyTorch, and 103.32 MiB is reserved by PyTorch but unallocated."
)


def test_the_oom_message_says_what_the_step_held_plus_what_it_asked_for():
    assert oom_demand_bytes(H200_OOM) == (21.53 + 121.24) * GIB
    two = (
        H200_OOM
        + "; "
        + H200_OOM.replace("rank 0", "rank 1").replace("Tried to allocate 21.53 GiB", "Tried to allocate 512.00 MiB")
    )
    assert oom_demand_bytes(two) == (21.53 + 121.24) * GIB  # the most any rank needed
    for none in (
        None,
        "",
        "predicted OOM: 147 GiB > 139.7",
        "RuntimeError: DefaultCPUAllocator: can't allocate memory",
    ):
        assert oom_demand_bytes(none) is None


@dataclass
class WordedMachine(Machine):
    """The simulated machine whose OOMs say what PyTorch's do: the step failed allocating its last GiB."""

    def __call__(self, t):
        row, lost = super().__call__(t)
        if row["status"] == "oom":
            peak = self.peak(t)
            row["error"] = (
                "rank 0: CUDA out of memory. Tried to allocate 1.00 GiB. Of the allocated memory "
                f"{peak - 1:.2f} GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."
            )
        return row, lost


def _fit(machine: Machine, predicted: int, budget: int = 8) -> list[int]:
    spec, trials = grid(tune={"vary": ["batch_size"], "budget": budget})
    plan = TunePlan(
        trials, spec, capacity_bytes=machine.capacity_gib * GIB, is_gpu=True, predicted_max=lambda t: predicted
    )
    return [t.batch_size for t in run(plan, machine).asked]


def test_a_prediction_that_fails_near_the_edge_is_followed_by_the_batch_below_not_batch_1():
    """4 GiB + 1 GiB a sample under 40 GiB: 36 fits. The model said 37, one sample (2.5 %) past: 36 next. Said 40,
    four samples (10 %) past: as without the message, batch 1, where the fixed part is measured."""
    near = WordedMachine()
    assert _fit(near, 37)[:2] == [37, 36]
    assert _fit(near, 40)[:2] == [40, 1]
    assert _fit(Machine(), 37)[:2] == [37, 1]  # an OOM that says nothing (a CPU rank's): batch 1


def test_a_batch_that_thrashes_anywhere_in_the_fit_is_followed_by_the_one_below_once():
    """After 1 and 8 fit, the line through them says 36. Peaks past 39.5 GiB fit only with allocator retries: 36
    thrashes and 35, the fit's next probe (not a bisection of 8..36), is the limit. Past 34 GiB (30 and up): 35
    thrashes too, and the fit bisects rather than step down a batch a probe."""
    assert _fit(WordedMachine(thrash_gib=39.5), 40, budget=12)[:5] == [40, 1, 8, 36, 35]
    wide = _fit(WordedMachine(thrash_gib=34.0), 40, budget=12)
    assert wide[:5] == [40, 1, 8, 36, 35] and wide[5] < 34
