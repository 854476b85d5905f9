"""The candidates of one `search: fastest` group as its probes so far see them (sweep.search.fastest.search): where
each is placed in memory, which are pruned, and what each option value measurably does. Pure: no torch, no Ray."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sweep.search.fastest.ledger import Learned, Ledger, Row, Rung
from sweep.search.fastest.memory import Memory, fitted, measured, rebatched, unthrashed, with_headroom
from sweep.search.fastest.space import Config, Space, at_least_as_heavy, one_option_effects
from sweep.spec.grid import Trial


class Candidates:
    """The configs a group's search may still probe, placed and ranked from its ledger."""

    def __init__(
        self,
        space: Space,
        ledger: Ledger,
        learned: Learned,
        *,
        capacity_bytes: float | None,
        predicted_max: Callable[[Trial], int | None] | None,
    ):
        self.space, self.ledger, self.learned, self.capacity = space, ledger, learned, capacity_bytes
        self.predicted_max = predicted_max
        self.batches: dict[str, list[int]] = {}  # per ac level: the batches its fit found (or the fixed batch)
        self.center: Config | None = None  # the baseline (else any candidate): effects are measured from it

    def _center(self) -> Config:
        assert self.center is not None, "explore sets the center before any candidate is seen"
        return self.center

    def diff(self, c: Config) -> list[tuple[str, Any]]:
        """The options in which `c` differs from the center (explore sets it before any candidate is seen)."""
        center = self.space.coords(self._center())
        return [(k, v) for k, v in self.space.coords(c).items() if v != center[k]]

    def distance(self, c: Config) -> int:
        return len(self.diff(c))

    def changes(self, c: Config) -> list[tuple[str, Any]]:
        """`diff`, less the batch if memory alone moved `c` off the center's (`placed`)."""
        d, center = self.diff(c), self._center()
        moved = d and d[0][0] == "ac_batch" and c.ac == center.ac and c.batch_size < center.batch_size
        return d[1:] if moved and self.placed(self.space.at_batch(c, center.batch_size), first=True) == c else d

    def placed(self, c: Config, first: bool = False, memory: Memory | None = None) -> Config | None:
        """`c` where sweep.search.fastest.memory predicts it fits in memory (`fitted`: lower if it would not); as
        a neighbour (`first`) that changes the compile mode, whose memory is unmeasured, where the fit left room;
        and never past the batch the memory model predicts to fit (`under_prediction`; None: not even batch 1).
        `memory`: what `memory` says, for a caller placing many."""
        params, effects, peaks, room = memory or self.memory()
        ref = self.space.baseline(c.ac, c.batch_size)
        c = fitted(
            self.space,
            c,
            ref,
            peaks.get(c.ac, {}),
            effects,
            capacity=room.get(c.ac, self.capacity),
            params_local=params,
            snap=first,
        )
        center = self._center()
        center_peaks = peaks.get(center.ac, {})
        c = with_headroom(self.space, c, center, center_peaks, capacity=self.capacity) if first else c
        return self.under_prediction(c)

    def memory(self) -> Memory:
        """What the clean short probes say of memory (sweep.search.fastest.memory.measured)."""
        return measured(
            self.space, self.ledger.clean(), self.ledger.results.values(), self.learned.ooms, capacity=self.capacity
        )

    def ranked(self) -> list[Config]:
        """Configs not yet probed nor pruned, the likely fastest first (then the fewest changes)."""
        probed = set(self.ledger.probed(Rung.SHORT))
        effects = self.effects()
        todo = [c for c in self.configs() if c not in probed and not self.pruned(c)]
        return sorted(todo, key=lambda c: (-sum(effects.get(d, 0.0) for d in self.diff(c)), self.distance(c)))

    def configs(self) -> list[Config]:
        """The candidates: every config at its ac level's batches (or where its heavy class is known to
        fit), and the smaller batches of OOMs; each below the batch where one needing its memory thrashed."""
        # in the order their OOMs were asked, not the order those came back in (a wave's runs end in any order)
        fallbacks = [self.learned.fallbacks[c] for c in self.ledger.probed(Rung.SHORT) if c in self.learned.fallbacks]
        memory = self.memory()
        fits = [f for f, _ in self.ledger.measured(Rung.SHORT)]
        configs = [
            self.placed(rebatched(c, self.learned.ooms, fits, self.space), memory=memory)
            for c in self.space.configs(self.batches)
        ]
        # configs are placed under the prediction already (placed), and unthrashed only lowers a batch
        lowered = [self.under_prediction(c) for c in fallbacks]
        return list(
            dict.fromkeys(
                unthrashed(c, self.ledger.thrashed, self._center(), self.space)
                for c in [*configs, *lowered]
                if c is not None
            )
        )

    def predicted(self, c: Config) -> int | None:
        """The largest batch of `c`'s configuration the memory model predicts to fit (None: no prediction)."""
        return self.predicted_max(self.space.as_trial(c)) if self.predicted_max else None

    def under_prediction(self, c: Config) -> Config | None:
        """`c` at most at the batch the memory model predicts to fit (the runner would record a larger one
        unsupported, without running it): lowered to that batch, or None if not even batch 1 is predicted to."""
        limit = self.predicted(c)
        if limit is None or c.batch_size <= limit:
            return c
        allowed = self.space.batch_choices()  # a fixed batch or the splits of G: the largest of those under it
        batch = limit if allowed is None else max((b for b in allowed if b <= limit), default=0)
        return self.space.at_batch(c, batch) if batch >= 1 else None

    def pruned(self, c: Config) -> bool:
        learned = self.learned
        return (
            any(at_least_as_heavy(c, o) for o in learned.ooms)
            or any(d in learned.broken for d in self.diff(c))
            or c in learned.unaffordable
        )

    def effects(self) -> dict[tuple[str, Any], float]:
        """Each option value's measured effect against the center's value (mean log speed ratio), from
        pairs of short probes that differ in that option alone (e.g. grad_sync: step at 8 micro-batches
        against micro_batch at 8: with one micro-batch it folds away and says nothing)."""
        # a probe that thrashed measured the memory's limit, not its option: it rates no option
        points = [
            (self.space.coords(c), math.log(tf)) for c, tf in self.ledger.measured(Rung.SHORT, clean=True) if tf > 0
        ]
        return one_option_effects(points, self.space.coords(self._center()))

    def center_row(self) -> Row | None:
        """The center's short probe, if it ran ok."""
        return self.ledger.ok_row(self.center, Rung.SHORT)
