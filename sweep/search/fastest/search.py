"""`search: fastest`: the fastest configuration of each (model, precision, seq_len, ranks) group, within a
budget of probes. Pure: no torch, no Ray (tests/test_tune.py drives it with a simulated runner).

The candidates are the configurations of `sweep.search.fastest.space.Space`. Each group's search has five stages;
a stage decides only once every probe it issued has answered, from results it sorts itself, so the order
in which answers arrive (concurrent trials, or rows reused by --resume) does not change the search:

  fit      per ac level (the grid's first, then from most memory to least), the batches that fit with the
           grid's other options (tune_space.LevelFit: a MaxBatchSearch of short probes, under
           global_batch_tokens on the batches of valid splits). A level starts at the largest batch a
           heavier level fitted (it fits: less is kept) and stays under the smallest batch a lighter level
           ran out of memory at; it goes on from there only if some batch could make up its recomputation
           (LevelFit.batch_gain). Its candidates run its largest fitting batch and the fastest one found
           (under G: the two largest splits that fit). A fixed batch needs no probes here.
  explore  short probes (SHORT steps, counted in micro-batches: probe_steps): first every neighbour of the
           baseline (one option changed; of accumulation only the most micro-batches), then waves of the
           candidates the measured one-option effects, added in log speed, rate fastest (none rated below the
           fastest clean probe: _promising), each led by a candidate for every option value not yet run clean
           (_untried), until STALE_WAVES waves in a row find nothing faster; then only those leads, while the
           budget lasts. Each candidate runs where its memory is predicted to fit (_placed, sweep.search.fastest.memory),
           and never past the batch the memory model predicts to fit (sweep.memory.predictor: the runner would record it
           unsupported); a level's fit starts at that model's limit.
           Never probed: a candidate as heavy as a known OOM (tune_space.at_least_as_heavy), or with an option
           value that failed on its own. One that runs out of memory, or thrashes (allocator retries: its speed
           measures the memory's limit, so it rates no option), is tried at a smaller batch, and so is every
           candidate that needs its memory (tune_memory: rebatched, unthrashed, needs). A probe predicted to take
           the search past `max_cost` one-trial costs, its finals' included, is skipped for good (_affordable,
           sweep.search.fastest.cost).
  rung     successive halving: the fastest third of the short probes (at most the rung size) again,
           with LONGER steps; no rung where it would keep only the finalists (budgets under 19).
  final    the `finalists` fastest of the rung (without one: of the short probes; none that thrashed, as the
           rung takes none; a runner-up only within
           FINAL_MARGIN of the fastest, a probe reads within 0.4 % of its final, and within the cost cap, which
           keeps room for two finals: the best's and the baseline's), and the baseline (the grid's
           options at the fastest batch their fit found; under G the split with the largest micro-batch that
           fits) unless its short probe failed, with the grid's own steps (`auto`: at most final_auto_max, as the
           cost cap reserves). The best is the fastest of these.
  profile  the best (if a final ran ok) with a short probe's steps and profile=True: the verdict's trace. A profiled
           trial retires its warm group (the profiler's hooks stay in it): only the best, last, costs no group start.

Budget bound: a stage issues a trial only while the trials issued so far (OOMs, errors, infrastructure
retries, everything) are under its cap: budget - (finalists + 2) - rung size for fit and explore,
budget - (finalists + 2) for the rung, budget - 1 for the finals (at most finalists + 1), budget for the
profile. So a group never makes more than `budget` attempts; a retry past its stage's cap is not made (the
attempt stays failed). A budget without room for one short probe, two finals and the profile is refused.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from sweep.errors import UserError
from sweep.spec.grid import Trial
from sweep.search.policy import infra_retry, is_predicted_oom
from sweep.text import plural
from sweep.search.fastest.cost import affordable, final_auto_max, time_limit_s
from sweep.search.fastest.memory import fitted, measured, rebatched, unthrashed, with_headroom
from sweep.search.fastest.verdict import best_final, fastest_verdict
from sweep.search.fastest.space import (AC_MEMORY, LONGER, SHORT, Config, LevelFit, Space, at_least_as_heavy, heavy_class,
                              one_option_effects, probe_steps, thrashes)

KEEP = 3  # the rung keeps the fastest third of the short probes (successive halving's eta)...
RUNG_MAX = 6  # ...but at most this many: a rung probe of 8 micro-batches costs a dozen long steps
WAVE = 4  # explore probes issued together after the neighbours: a cluster can run them side by side
STALE_WAVES = 2  # explore stops after this many waves in a row without a faster probe
NOISE = 0.01  # a short probe's speed is this close to another's: no faster
# A runner-up slower than the fastest by more than this is not measured in full: on 2xH200 short probes read
# within 0.4 % of their finals (827.8/831.1, 820.8/822.5, 608.2/606.1, 561.2/562.6, 544.8/544.5; RESULTS.md,
# sessions 9-10), and the GPT-1.5B torchao search spent 96 s on a runner-up 2.9 % behind.
FINAL_MARGIN = 0.02


class GroupSearch:
    """The search of one group: stages fit, explore, rung, final, profile (module docstring)."""

    def __init__(self, space: Space, *, budget: int, capacity_bytes: float | None, sid: str, final_steps: tuple,
                 max_cost: float | None = None, predicted_max: Callable[[Trial], int | None] | None = None):
        """`predicted_max`: the largest batch of a trial's config the memory model predicts to fit (sweep.memory.predictor;
        None: nothing predicted): where each level's fit starts, and a ceiling on every candidate's batch."""
        self.space, self.budget, self.capacity, self.sid, self.max_cost = space, budget, capacity_bytes, sid, max_cost
        self.predicted_max = predicted_max
        self.finalists = 2 if budget >= 8 else 1
        reserve = self.finalists + 2  # the finalists, the baseline and the best's profile
        rung = min(RUNG_MAX, (budget - reserve) // 5)  # a fifth of the rest at most: most of it explores
        self.rung_size = rung if rung > self.finalists else 0  # a rung that keeps only the finalists is moot
        self.caps = {0: budget - reserve - self.rung_size, 1: budget - reserve, 2: budget - 1, 3: budget}
        t = space.template
        if self.caps[0] < 1:  # budgets under 8 have one finalist: reserve 3
            raise UserError(f"tune.budget: {plural(budget, 'probe')} cannot find and fully measure a baseline and one "
                            f"finalist for {t.model.label} {t.precision} (one short probe, two full measurements "
                            f"and the best's profile); give budget: 4 or more")
        self.steps = {0: SHORT, 1: LONGER, 2: final_steps, 3: SHORT}  # 3: the best's profile (a short probe's)
        self.stage = "fit"
        allowed = space.batch_choices()
        fixed = allowed is not None and len(allowed) == 1
        self.levels = [] if fixed else space.levels()
        self.batches: dict[str, list[int]] = {ac: list(allowed) for ac in space.values["ac"]} if fixed else {}
        self.baseline: Config | None = space.baseline(space.grid.ac, allowed[0]) if fixed else None
        self.fit: LevelFit | None = None  # the level being fitted
        self.fits: dict[str, LevelFit] = {}  # the levels fitted
        self.asked: dict[tuple[Config, int], str] = {}  # (config, rung; 3: profile) -> trial_id of its latest attempt
        self.owner: dict[str, tuple[Config, int]] = {}  # every trial issued -> (config, rung)
        self.results: dict[str, dict] = {}  # trial_id -> its row: one per attempt (a retry has its own id)
        self.pending: set[str] = set()
        self.ooms: list[Config] = []
        self.broken: set[tuple[str, Any]] = set()  # option values that failed on their own
        self.fallbacks: dict[Config, Config] = {}  # a config that ran out of memory -> it at a smaller batch
        self.thrashed: set[Config] = set()  # probes that fit only by the allocator freeing its cache (retries)
        self.unaffordable: list[Config] = []  # skipped: predicted past max_cost (_affordable)
        self.explored = False
        self.stale, self.fastest_before = 0, 0.0  # waves in a row without a faster probe; the fastest before
        self.center: Config | None = None  # the baseline (else any candidate): effects are measured from it
        self.rung_asked: list[Config] | None = None
        self.final_asked: list[Config] | None = None

    # --- the plan protocol, for one group ---

    def start(self) -> list[Trial]:
        return self._advance()

    def on_result(self, trial: Trial, status: str, infrastructure: bool, row: dict) -> list[Trial]:
        self.pending.discard(trial.trial_id)
        if status == "unsupported" and is_predicted_oom(row):  # the model said it fails, without GPU time: an OOM
            status = "oom"
        self.results[trial.trial_id] = {**row, "status": status}
        c, rung = self.owner[trial.trial_id]
        retry = infra_retry(trial, status, infrastructure)
        if retry is not None and len(self.owner) < self.caps[rung]:
            return self._issue(retry, c, rung)
        self._learn(c, status, row)
        return self._advance()

    def _advance(self) -> list[Trial]:
        """The next stage's probes, once none is out."""
        stages = {"fit": self._fit_stage, "explore": self._explore_stage, "rung": self._rung_stage,
                  "final": self._final_stage, "profile": self._profile_stage}
        order = [*stages, "done"]
        while not self.pending and self.stage != "done":
            out = stages[self.stage]()
            if out:
                return out
            self.stage = order[order.index(self.stage) + 1]
        return []

    def _issue(self, trial: Trial, c: Config, rung: int) -> list[Trial]:
        self.owner[trial.trial_id] = (c, rung)
        self.asked[(c, rung)] = trial.trial_id
        self.pending.add(trial.trial_id)
        return [trial]

    def _ask(self, c: Config, rung: int) -> list[Trial]:
        """Issue `c` at `rung`'s steps (rung 3: profiled, its own trial id), unless the same trial was issued before
        (two rungs with the same steps: its row serves both; the runner runs a trial once) or its cap is reached."""
        steps = self.steps[rung] if rung == 2 else probe_steps(self.steps[rung], c.grad_accum)
        most = final_auto_max(c.grad_accum) if rung == 2 and "auto" in steps else None  # as the cost cap reserved
        limit = time_limit_s(c, steps, *self._spent(), final_steps=self.steps[2])  # a hang costs this, not 30 min
        trial = self.space.trial(c, steps, profile=rung == 3, search_id=self.sid, auto_max=most, time_limit_s=limit)
        if trial.trial_id in self.owner:
            self.asked[(c, rung)] = trial.trial_id
            return []
        return self._issue(trial, c, rung) if len(self.owner) < self.caps[rung] else []

    def _learn(self, c: Config, status: str, row: dict) -> None:
        if thrashes(status, row):  # the candidates that need its memory shrink below it (_space, unthrashed)
            self.thrashed.add(c)
        elif status == "oom":
            self.ooms.append(c)
            smaller = self.space.smaller_batch(c) if self.stage == "explore" else None
            if smaller is not None:  # e.g. grad_sync: step keeps whole gradients: its own, smaller batch
                self.fallbacks[c] = smaller
        elif status != "ok" and self.stage == "explore" and len(self._changes(c)) == 1:
            self.broken.update(self._changes(c))  # e.g. compile: full fails for this model: not tried again
        if self.stage == "fit":  # its probes are all short ones
            self.fit.record(c.batch_size, status, row)

    def _ok_row(self, c: Config | None, rung: int) -> dict | None:
        """The row of `c`'s latest attempt at `rung` if it ran ok."""
        row = self.results.get(self.asked.get((c, rung)))
        return row if row and row["status"] == "ok" else None

    def _clean(self) -> list[tuple[Config, dict]]:
        """The short probes that ran ok without thrashing, fastest first, with their rows."""
        return [(c, self._ok_row(c, 0)) for c, _ in self._measured(0, clean=True)]

    def _measured(self, rung: int, clean: bool = False) -> list[tuple[Config, float]]:
        """The configs measured at `rung`, fastest first (a tie: the one asked first); `clean`: not those that
        thrashed (their speed measured the allocator, not their options)."""
        out = [(c, row["tflops_per_gpu"] or 0.0) for (c, r) in self.asked
               if r == rung and (row := self._ok_row(c, r)) and not (clean and c in self.thrashed)]
        return sorted(out, key=lambda x: -x[1])

    # --- stages: each returns its next probes, [] when it is over ---

    def _fit_stage(self) -> list[Trial]:
        while self.levels:
            ac = self.levels[0]
            self.fit = self.fit or self._new_fit(ac)
            # the baseline's level may use the whole exploring share; the others half of it
            cap = self.caps[0] if ac == self.space.grid.ac else self.caps[0] // 2
            batch = self.fit.next_batch() if len(self.owner) < cap else None
            if batch is not None:
                return self._ask(self.space.baseline(ac, batch), 0)
            self._close_level(self.fit)
            self.levels.pop(0)
            if self.fit.ac == self.space.grid.ac and self.fit.search.aborted and not self.fit.tflops:
                self.levels = []  # the grid's own options fail (not for memory): other ac levels would too
            self.fit = None
        return []

    def _new_fit(self, ac: str) -> LevelFit:
        """A level starts where a heavier one fitted, and stays under a lighter one's OOM. Started where a
        heavier one fitted, it goes past its first probe only if that probe, sped up by the most a larger
        batch could gain on a level fitted (batch_gain), would beat the fastest level so far."""
        heavier = [max(b) for a, b in self.batches.items() if b and AC_MEMORY[a] > AC_MEMORY[ac]]
        ceiling = [o.batch_size for o in self.ooms
                   if at_least_as_heavy(self.space.baseline(ac, o.batch_size), o)]
        # nothing fitted with more memory: from batch 1 (the seed's batch failed there: likely here too)
        start = max(heavier, default=1 if self.fits else self.space.grid.batch_size)
        gains = [g for f in self.fits.values() if (g := f.batch_gain()) is not None]
        gain = max(gains) if heavier and gains else None  # the most any level's batch could still gain
        fastest = max((tf for f in self.fits.values() for tf in f.tflops.values()), default=None)
        need = fastest / (1 + gain) if gain is not None and fastest else None
        # the memory model's limit for this level, where nothing measured says more (no heavier level fitted)
        predicted = self._predicted(self.space.baseline(ac, start)) if not heavier else None
        fit = LevelFit(ac, start=start, allowed=self.space.batch_choices(), ceiling=min(ceiling, default=None),
                       capacity_bytes=self.capacity, need=need, predicted=predicted)
        if heavier and not self.ooms:  # no level met the memory's limit (no capacity, e.g. a CPU): more
            fit.search.max_batch = max(heavier)  # checkpointing only buys a batch nobody needed; check it fits
        return fit

    def _close_level(self, fit: LevelFit) -> None:
        self.fits[fit.ac] = fit
        self.batches[fit.ac] = fit.choices()
        if fit.ac == self.space.grid.ac and self.batches[fit.ac]:
            batch = self.batches[fit.ac][0] if self.space.samples else fit.fastest()
            self.baseline = self.space.baseline(fit.ac, batch)

    def _explore_stage(self) -> list[Trial]:
        room = self.caps[0] - len(self.owner)
        if not self.explored:  # the fits are known: the point every effect is measured from
            self.center = self.baseline or next(iter(self._space()), None)
        live = room > 0 and self.center is not None
        todo = self._candidates() if live else []
        # stale waves end the ranked ones, not the probes of option values whose gain is still unknown
        stale = live and self._stale()
        first = [] if self.explored else self._neighbours(todo)
        self.explored = True
        while True:  # a wave the cost cap empties is followed by the next candidates'
            wave = first[:room] or self._wave(todo, min(WAVE, room), ranked=not stale)
            kept = self._affordable(wave, 0)
            if kept or not wave:
                return [t for c in kept for t in self._ask(c, 0)]
            first, todo = [], [c for c in todo if c not in self.unaffordable]

    def _affordable(self, wave: list[Config], rung: int) -> list[Config]:
        """The probes of `wave` the cost cap allows (sweep.search.fastest.cost.affordable); the others are skipped for good."""
        steps = [self.steps[2] if rung == 2 else probe_steps(self.steps[rung], c.grad_accum) for c in wave]
        leader, probes = self._spent()
        # the room kept is the best's and the baseline's finals': a runner-up's final is made only if it fits then
        kept, skipped = affordable(wave, steps, leader=leader, finals=2, max_cost=self.max_cost, probes=probes,
                                   final_steps=self.steps[2])
        self.unaffordable += skipped
        return kept

    def _spent(self) -> tuple[tuple[Config, dict] | None, list[tuple[Config, dict]]]:
        """What the cost model reads: the leader (the fastest clean short probe, with its row) and every attempt."""
        return next(iter(self._clean()), None), [(self.owner[t][0], r) for t, r in self.results.items()]

    def _neighbours(self, todo: list[Config]) -> list[Config]:
        """The center and its one-option changes, but of accumulation only the most micro-batches: every count
        above one holds the same gradient memory (at_least_as_heavy) and more amortise the step's fixed work
        (2xH200, Llama3-8B torchao: 2 / 4 / 8 read 835.4 / 839.6 / 849.3 TFLOP/s/GPU), so the counts between
        would cost two probes of a small budget to confirm the order. Each where memory places it (_placed)."""
        most = max((c.grad_accum for c in todo), default=1)
        center = self.center
        at_center = dict.fromkeys(self.space.at_batch(c, center.batch_size) for c in todo if c.ac == center.ac)
        near = [c for c in at_center if not self._pruned(c) and (not (d := self._diff(c)) or len(d) == 1 and (
            d[0][0] != "grad_accum" or c.grad_accum == most))]
        placed = (self._placed(c, first=True) for c in sorted(near, key=self._distance))
        return list(dict.fromkeys(c for c in placed if c is not None))

    def _stale(self) -> bool:
        """Whether the last STALE_WAVES waves found nothing faster than what was known before them (by more
        than a short probe's noise): the effects have been combined; more probes would cost, not find."""
        fastest = max((tf for _, tf in self._measured(0)), default=0.0)
        if self.explored:
            self.stale = 0 if fastest > self.fastest_before * (1 + NOISE) else self.stale + 1
        self.fastest_before = max(fastest, self.fastest_before)
        return self.stale >= STALE_WAVES

    def _wave(self, todo: list[Config], n: int, ranked: bool = True) -> list[Config]:
        """The first n candidates, led by the likeliest of each option value not yet run clean (_untried), then
        (if `ranked`) the promising ones, but only one per heavy class whose batch is not yet known to fit there:
        should it run out of memory, the others learn its limit (rebatched) rather than fail with it."""
        fits = [(heavy_class(c), c.ac, c.batch_size) for c, _ in self._measured(0)]
        lead = list(dict.fromkeys(c for k, v in self._untried()
                                  if (c := next((c for c in todo if self.space.coords(c)[k] == v), None))))
        todo = lead + [c for c in self._promising(todo) if c not in lead] if ranked else lead
        wave, unsure = [], set()
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
        center = self._ok_row(self.center, 0)
        best = max((tf for _, tf in self._measured(0, clean=True)), default=0.0)
        if center is None or not center["tflops_per_gpu"] or not best:
            return todo
        effects, floor = self._effects(), math.log(best * (1 - NOISE) / center["tflops_per_gpu"])
        return [c for c in todo if sum(effects.get(d, 0.0) for d in self._diff(c)) >= floor]

    def _untried(self) -> list[tuple[str, Any]]:
        """Option values (besides ac and batch) that no clean short probe ran: known to need memory (their
        probes thrashed or ran out of it) or folded away so far (grad_sync: step at one micro-batch), but not
        what they gain, which the measured effects would count as nothing and never rank first."""
        seen = {kv for c, _ in self._measured(0, clean=True) for kv in self.space.coords(c).items()}
        # (accumulation's counts between those run are in their order: _neighbours)
        values = (kv for c in self._space() for kv in self.space.coords(c).items() if kv[0] not in ("ac_batch",
                                                                                                    "grad_accum"))
        return [kv for kv in dict.fromkeys(values) if kv not in seen and kv not in self.broken]

    def _rung_stage(self) -> list[Trial]:
        if self.rung_asked is not None:
            return []
        pool = [c for c, _ in self._measured(0, clean=True)]
        n = min(self.rung_size, max(self.finalists + 1, math.ceil(len(pool) / KEEP)), self.caps[1] - len(self.owner))
        rung = self._affordable(pool[:n], 1)
        self.rung_asked = rung if len(rung) > self.finalists else []
        return [t for c in self.rung_asked for t in self._ask(c, 1)]

    def _final_stage(self) -> list[Trial]:
        if self.final_asked is not None:
            return []
        # none that thrashed (RESULTS.md session 12: one read 841.6 short, then 794.0 in a 105 s final)
        measured = self._measured(1 if self.rung_asked else 0, clean=True)[:self.finalists]
        close = [c for c, tf in measured if tf >= measured[0][1] * (1 - FINAL_MARGIN)]
        finalists = close[:1] + self._affordable(close[1:], 2)
        ran = {c for c, _ in self._measured(0)}  # a baseline that failed its short probe would fail again
        extra = [self.baseline] if self.baseline in ran and self.baseline not in finalists else []
        self.final_asked = finalists + extra
        return [t for c in self.final_asked for t in self._ask(c, 2)]

    def _profile_stage(self) -> list[Trial]:
        best, _ = best_final(self)  # every final has answered: the verdict's best
        # once: asked again, _ask would point it back at an attempt an infrastructure retry replaced
        return [] if best is None or (best, 3) in self.asked else self._ask(best, 3)

    # --- the candidates, and what the short probes say about them ---

    def _diff(self, c: Config) -> list[tuple[str, Any]]:
        """The options in which `c` differs from the center (explore sets it before any candidate is seen)."""
        center = self.space.coords(self.center)
        return [(k, v) for k, v in self.space.coords(c).items() if v != center[k]]

    def _distance(self, c: Config) -> int:
        return len(self._diff(c))

    def _changes(self, c: Config) -> list[tuple[str, Any]]:
        """`_diff`, less the batch if memory alone moved `c` off the center's (`_placed`)."""
        d, center = self._diff(c), self.center
        moved = d and d[0][0] == "ac_batch" and c.ac == center.ac and c.batch_size < center.batch_size
        return d[1:] if moved and self._placed(self.space.at_batch(c, center.batch_size), first=True) == c else d

    def _placed(self, c: Config, first: bool = False, memory: tuple | None = None) -> Config | None:
        """`c` where sweep.search.fastest.memory predicts it fits in memory (`fitted`: lower if it would not); as a
        neighbour (`first`) that changes the compile mode, whose memory is unmeasured, where the fit left room;
        and never past the batch the memory model predicts to fit (`_under_prediction`; None: not even batch 1).
        `memory`: what `_memory` says, for a caller placing many."""
        params, effects, peaks, room = memory or self._memory()
        ref = self.space.baseline(c.ac, c.batch_size)
        c = fitted(self.space, c, ref, peaks.get(c.ac, {}), effects, capacity=room.get(c.ac, self.capacity),
                   params_local=params, snap=first)
        center_peaks = peaks.get(self.center.ac, {})
        c = with_headroom(self.space, c, self.center, center_peaks, capacity=self.capacity) if first else c
        return self._under_prediction(c)

    def _memory(self) -> tuple[float | None, dict, dict[str, dict[int, float]], dict[str, float | None]]:
        """What the clean short probes say of memory (sweep.search.fastest.memory.measured)."""
        return measured(self.space, self._clean(), self.results.values(), self.ooms, capacity=self.capacity)

    def _candidates(self) -> list[Config]:
        """Configs not yet probed nor pruned, the likely fastest first (then the fewest changes)."""
        probed = {c for c, r in self.asked if r == 0}
        effects = self._effects()
        todo = [c for c in self._space() if c not in probed and not self._pruned(c)]
        return sorted(todo, key=lambda c: (-sum(effects.get(d, 0.0) for d in self._diff(c)), self._distance(c)))

    def _space(self) -> list[Config]:
        """The candidates: every config at its ac level's batches (or where its heavy class is known to
        fit), and the smaller batches of OOMs; each below the batch where one needing its memory thrashed."""
        # in the order their OOMs were asked, not the order those came back in (a wave's runs end in any order)
        fallbacks = [self.fallbacks[c] for c, r in self.asked if r == 0 and c in self.fallbacks]
        memory = self._memory()
        fits = [f for f, _ in self._measured(0)]
        configs = [self._placed(rebatched(c, self.ooms, fits, self.space), memory=memory)
                   for c in self.space.configs(self.batches)]
        # configs are placed under the prediction already (_placed), and unthrashed only lowers a batch
        fallbacks = [self._under_prediction(c) for c in fallbacks]
        return list(dict.fromkeys(unthrashed(c, self.thrashed, self.center, self.space)
                                  for c in [*configs, *fallbacks] if c is not None))

    def _predicted(self, c: Config) -> int | None:
        """The largest batch of `c`'s configuration the memory model predicts to fit (None: no prediction)."""
        return self.predicted_max(self.space.as_trial(c)) if self.predicted_max else None

    def _under_prediction(self, c: Config) -> Config | None:
        """`c` at most at the batch the memory model predicts to fit (the runner would record a larger one
        unsupported, without running it): lowered to that batch, or None if not even batch 1 is predicted to."""
        limit = self._predicted(c)
        if limit is None or c.batch_size <= limit:
            return c
        allowed = self.space.batch_choices()  # a fixed batch or the splits of G: the largest of those under it
        batch = limit if allowed is None else max((b for b in allowed if b <= limit), default=0)
        return self.space.at_batch(c, batch) if batch >= 1 else None

    def _pruned(self, c: Config) -> bool:
        return (any(at_least_as_heavy(c, o) for o in self.ooms) or any(d in self.broken for d in self._diff(c))
                or c in self.unaffordable)

    def _effects(self) -> dict[tuple[str, Any], float]:
        """Each option value's measured effect against the center's value (mean log speed ratio), from
        pairs of short probes that differ in that option alone (e.g. grad_sync: step at 8 micro-batches
        against micro_batch at 8: with one micro-batch it folds away and says nothing)."""
        # a probe that thrashed measured the memory's limit, not its option: it rates no option
        points = [(self.space.coords(c), math.log(tf)) for c, tf in self._measured(0, clean=True) if tf > 0]
        return one_option_effects(points, self.space.coords(self.center))

    def verdict(self) -> dict:
        return fastest_verdict(self)
