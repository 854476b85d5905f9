"""The explore stage of one `search: fastest` group (sweep.search.fastest.search's docstring): short probes of the
baseline's neighbours, then waves of the candidates the measured effects rate fastest, until waves stop finding
anything faster. Pure: no torch, no Ray."""

from __future__ import annotations

import math
from typing import Any

from sweep.search.fastest.candidates import Candidates
from sweep.search.fastest.ledger import Prober, Rung
from sweep.search.fastest.space import Config, Space, heavy_class
from sweep.search.fastest.stages import NOISE, STALE_WAVES, WAVE, FitStage
from sweep.spec.grid import Trial


class Screening:
    """Short probes that screen the candidates: the neighbours of the center, then waves."""

    name = "explore"

    def __init__(self, space: Space, prober: Prober, candidates: Candidates, fit: FitStage):
        self.space, self.prober, self.candidates, self.fit = space, prober, candidates, fit
        self.explored = False
        self.stale, self.fastest_before = 0, 0.0  # waves in a row without a faster probe; the fastest before

    def next(self) -> list[Trial]:
        room = self.prober.room(Rung.SHORT)
        cands = self.candidates
        if not self.explored:  # the fits are known: the point every effect is measured from
            cands.center = self.fit.baseline or next(iter(cands.configs()), None)
        live = room > 0 and cands.center is not None
        todo = cands.ranked() if live else []
        # stale waves end the ranked ones, not the probes of option values whose gain is still unknown
        stale = live and self._stale()
        first = [] if self.explored else self._neighbours(todo)
        self.explored = True
        while True:  # a wave the cost cap empties is followed by the next candidates'
            wave = first[:room] or self._wave(todo, min(WAVE, room), ranked=not stale)
            kept = self.prober.affordable(wave, Rung.SHORT)
            if kept or not wave:
                return self.prober.ask_all(kept, Rung.SHORT)
            first, todo = [], [c for c in todo if c not in self.prober.learned.unaffordable]

    def _neighbours(self, todo: list[Config]) -> list[Config]:
        """The center and its one-option changes, but of accumulation only the most micro-batches: every count
        above one holds the same gradient memory (at_least_as_heavy) and more amortise the step's fixed work
        (2xH200, Llama3-8B torchao: 2 / 4 / 8 read 835.4 / 839.6 / 849.3 TFLOP/s/GPU), so the counts between
        would cost two probes of a small budget to confirm the order. Each where memory places it (placed)."""
        cands = self.candidates
        most = max((c.grad_accum for c in todo), default=1)
        center = cands.center
        if center is None:  # nothing to explore from: no candidates either
            return []
        at_center = dict.fromkeys(self.space.at_batch(c, center.batch_size) for c in todo if c.ac == center.ac)
        near = [
            c
            for c in at_center
            if not cands.pruned(c)
            and (not (d := cands.diff(c)) or len(d) == 1 and (d[0][0] != "grad_accum" or c.grad_accum == most))
        ]
        placed = (cands.placed(c, first=True) for c in sorted(near, key=cands.distance))
        return list(dict.fromkeys(c for c in placed if c is not None))

    def _stale(self) -> bool:
        """Whether the last STALE_WAVES waves found nothing faster than what was known before them (by more
        than a short probe's noise): the effects have been combined; more probes would cost, not find."""
        fastest = max((tf for _, tf in self.prober.ledger.measured(Rung.SHORT)), default=0.0)
        if self.explored:
            self.stale = 0 if fastest > self.fastest_before * (1 + NOISE) else self.stale + 1
        self.fastest_before = max(fastest, self.fastest_before)
        return self.stale >= STALE_WAVES

    def _wave(self, todo: list[Config], n: int, ranked: bool = True) -> list[Config]:
        """The first n candidates, led by the likeliest of each option value not yet run clean (_untried), then
        (if `ranked`) the promising ones, but only one per heavy class whose batch is not yet known to fit there:
        should it run out of memory, the others learn its limit (rebatched) rather than fail with it."""
        fits = [(heavy_class(c), c.ac, c.batch_size) for c, _ in self.prober.ledger.measured(Rung.SHORT)]
        lead = list(
            dict.fromkeys(
                c for k, v in self._untried() if (c := next((c for c in todo if self.space.coords(c)[k] == v), None))
            )
        )
        todo = lead + [c for c in self._promising(todo) if c not in lead] if ranked else lead
        wave: list[Config] = []
        unsure: set[tuple[Any, ...]] = set()
        for c in todo:
            sure = any(k == heavy_class(c) and ac == c.ac and b >= c.batch_size for k, ac, b in fits)
            if sure or heavy_class(c) not in unsure:
                wave.append(c)
                unsure |= set() if sure else {heavy_class(c)}
            if len(wave) == n:
                break
        return wave

    def _promising(self, todo: list[Config]) -> list[Config]:
        """The candidates that the measured effects (an unmeasured one as none) put within a short probe's noise
        of the fastest clean probe: one they put below it would spend the budget on the certainty of a loss."""
        cands = self.candidates
        center = cands.center_row()
        best = max((tf for _, tf in self.prober.ledger.measured(Rung.SHORT, clean=True)), default=0.0)
        if center is None or not center["tflops_per_gpu"] or not best:
            return todo
        effects, floor = cands.effects(), math.log(best * (1 - NOISE) / center["tflops_per_gpu"])
        return [c for c in todo if sum(effects.get(d, 0.0) for d in cands.diff(c)) >= floor]

    def _untried(self) -> list[tuple[str, Any]]:
        """Option values (besides ac and batch) that no clean short probe ran: known to need memory (their
        probes thrashed or ran out of it) or folded away so far (grad_sync: step at one micro-batch), but not
        what they gain, which the measured effects would count as nothing and never rank first."""
        seen = {
            kv for c, _ in self.prober.ledger.measured(Rung.SHORT, clean=True) for kv in self.space.coords(c).items()
        }
        # (accumulation's counts between those run are in their order: _neighbours)
        values = (
            kv
            for c in self.candidates.configs()
            for kv in self.space.coords(c).items()
            if kv[0] not in ("ac_batch", "grad_accum")
        )
        return [kv for kv in dict.fromkeys(values) if kv not in seen and kv not in self.prober.learned.broken]
