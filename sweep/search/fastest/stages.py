"""The stages of one `search: fastest` group (sweep.search.fastest.search, whose docstring says what each does):
fit (the batches of each ac level, and the baseline), explore (the screening short probes), rung (successive
halving), final (full measurements) and profile (the best's trace). Each stage's `next()` returns its next
probes, [] when it is over; it is called only once every probe issued has answered. Pure: no torch, no Ray."""

from __future__ import annotations

import math
from typing import Protocol

from sweep.search.fastest.candidates import Candidates
from sweep.search.fastest.ledger import Prober, Row, Rung
from sweep.search.fastest.level_fit import LevelFit
from sweep.search.fastest.space import AC_MEMORY, Config, Space, at_least_as_heavy
from sweep.search.fastest.verdict import best_final
from sweep.spec.grid import Trial

KEEP = 3  # the rung keeps the fastest third of the short probes (successive halving's eta)...
RUNG_MAX = 6  # ...but at most this many: a rung probe of 8 micro-batches costs a dozen long steps
WAVE = 4  # explore probes issued together after the neighbours: a cluster can run them side by side
STALE_WAVES = 2  # explore stops after this many waves in a row without a faster probe
NOISE = 0.01  # a short probe's speed is this close to another's: no faster
# A runner-up slower than the fastest by more than this is not measured in full: on 2xH200 short probes read
# within 0.4 % of their finals (827.8/831.1, 820.8/822.5, 608.2/606.1, 561.2/562.6, 544.8/544.5; RESULTS.md,
# sessions 9-10), and the GPT-1.5B torchao search spent 96 s on a runner-up 2.9 % behind.
FINAL_MARGIN = 0.02


class Stage(Protocol):
    name: str

    def next(self) -> list[Trial]:
        """The stage's next probes, [] when it is over."""
        ...


class FitStage:
    """Per ac level, the batches that fit with the grid's other options; the baseline at the grid's level."""

    name = "fit"

    def __init__(self, space: Space, prober: Prober, candidates: Candidates, *, capacity_bytes: float | None):
        self.space, self.prober, self.candidates, self.capacity = space, prober, candidates, capacity_bytes
        allowed = space.batch_choices()
        fixed = allowed is not None and len(allowed) == 1
        self.levels = [] if fixed else space.levels()
        if allowed is not None and fixed:
            candidates.batches.update({ac: list(allowed) for ac in space.values["ac"]})
        self.baseline: Config | None = space.baseline(space.grid.ac, allowed[0]) if allowed and fixed else None
        self.fit: LevelFit | None = None  # the level being fitted
        self.fits: dict[str, LevelFit] = {}  # the levels fitted

    def next(self) -> list[Trial]:
        grid_ac = self.space.grid.ac
        while self.levels:
            ac = self.levels[0]
            self.fit = fit = self.fit or self._new_fit(ac)
            # the baseline's level may use the whole exploring share; the others half of it
            cap = self.prober.caps[Rung.SHORT] if ac == grid_ac else self.prober.caps[Rung.SHORT] // 2
            batch = fit.next_batch() if self.prober.ledger.attempts < cap else None
            if batch is not None:
                return self.prober.ask(self.space.baseline(ac, batch), Rung.SHORT)
            self._close_level(fit)
            self.levels.pop(0)
            if fit.ac == grid_ac and fit.search.aborted and not fit.tflops:
                self.levels = []  # the grid's own options fail (not for memory): other ac levels would too
            self.fit = None
        return []

    def record(self, batch: int, status: str, row: Row) -> None:
        """A fit probe's answer (its probes are all short ones)."""
        if self.fit is not None:
            self.fit.record(batch, status, row)

    def _new_fit(self, ac: str) -> LevelFit:
        """A level starts where a heavier one fitted, and stays under a lighter one's OOM. Started where a
        heavier one fitted, it goes past its first probe only if that probe, sped up by the most a larger
        batch could gain on a level fitted (batch_gain), would beat the fastest level so far."""
        ooms = self.prober.learned.ooms
        heavier = [max(b) for a, b in self.candidates.batches.items() if b and AC_MEMORY[a] > AC_MEMORY[ac]]
        ceiling = [o.batch_size for o in ooms if at_least_as_heavy(self.space.baseline(ac, o.batch_size), o)]
        # nothing fitted with more memory: from batch 1 (the seed's batch failed there: likely here too)
        start = max(heavier, default=1 if self.fits else self.space.grid.batch_size)
        gains = [g for f in self.fits.values() if (g := f.batch_gain()) is not None]
        gain = max(gains) if heavier and gains else None  # the most any level's batch could still gain
        fastest = max((tf for f in self.fits.values() for tf in f.tflops.values()), default=None)
        need = fastest / (1 + gain) if gain is not None and fastest else None
        # the memory model's limit for this level, where nothing measured says more (no heavier level fitted)
        predicted = self.candidates.predicted(self.space.baseline(ac, start)) if not heavier else None
        fit = LevelFit(
            ac,
            start=start,
            allowed=self.space.batch_choices(),
            ceiling=min(ceiling, default=None),
            capacity_bytes=self.capacity,
            need=need,
            predicted=predicted,
        )
        if heavier and not ooms:  # no level met the memory's limit (no capacity, e.g. a CPU): more
            fit.search.max_batch = max(heavier)  # checkpointing only buys a batch nobody needed; check it fits
        return fit

    def _close_level(self, fit: LevelFit) -> None:
        self.fits[fit.ac] = fit
        batches = self.candidates.batches
        batches[fit.ac] = fit.choices()
        if fit.ac == self.space.grid.ac and batches[fit.ac]:
            batch = batches[fit.ac][0] if self.space.samples else fit.fastest()
            assert batch is not None  # the level has batches: one ran ok
            self.baseline = self.space.baseline(fit.ac, batch)


class RungStage:
    """Successive halving: the fastest third of the clean short probes again, with longer steps."""

    name = "rung"

    def __init__(self, prober: Prober, *, size: int, finalists: int):
        self.prober, self.size, self.finalists = prober, size, finalists
        self.asked: list[Config] | None = None

    def next(self) -> list[Trial]:
        if self.asked is not None:
            return []
        pool = [c for c, _ in self.prober.ledger.measured(Rung.SHORT, clean=True)]
        n = min(self.size, max(self.finalists + 1, math.ceil(len(pool) / KEEP)), self.prober.room(Rung.LONGER))
        rung = self.prober.affordable(pool[:n], Rung.LONGER)
        self.asked = rung if len(rung) > self.finalists else []
        return self.prober.ask_all(self.asked, Rung.LONGER)


class FinalStage:
    """The finalists of the rung (or of the short probes) and the baseline, at the grid's own steps."""

    name = "final"

    def __init__(self, prober: Prober, fit: FitStage, rung: RungStage, *, finalists: int):
        self.prober, self.fit, self.rung, self.finalists = prober, fit, rung, finalists
        self.asked: list[Config] | None = None

    def next(self) -> list[Trial]:
        if self.asked is not None:
            return []
        ledger, baseline = self.prober.ledger, self.fit.baseline
        # none that thrashed (RESULTS.md session 12: one read 841.6 short, then 794.0 in a 105 s final)
        measured = ledger.measured(Rung.LONGER if self.rung.asked else Rung.SHORT, clean=True)[: self.finalists]
        close = [c for c, tf in measured if tf >= measured[0][1] * (1 - FINAL_MARGIN)]
        finalists = close[:1] + self.prober.affordable(close[1:], Rung.FINAL)
        ran = {c for c, _ in ledger.measured(Rung.SHORT)}  # a baseline that failed its short probe would fail again
        extra = [baseline] if baseline is not None and baseline in ran and baseline not in finalists else []
        self.asked = finalists + extra
        return self.prober.ask_all(self.asked, Rung.FINAL)


class ProfileStage:
    """The best final, profiled, with a short probe's steps: the verdict's trace."""

    name = "profile"

    def __init__(self, prober: Prober, final: FinalStage):
        self.prober, self.final = prober, final

    def next(self) -> list[Trial]:
        best, _ = best_final(self.prober.ledger, self.final.asked)  # every final has answered: the verdict's best
        # once: asked again, ask would point it back at an attempt an infrastructure retry replaced
        if best is None or (best, Rung.PROFILE) in self.prober.ledger.asked:
            return []
        return self.prober.ask(best, Rung.PROFILE)
