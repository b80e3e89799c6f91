"""The intra-op thread count that fits the machine as it is: ``--threads auto``.

torch's default is one intra-op thread per core. On a machine where another process keeps a core busy, every
parallel region then waits for a thread the operating system has descheduled, and a small model's step gets
10-20x slower than with one thread. The fastest count depends on the model, the batch and the load of the
moment, so it is measured, not guessed:

* :class:`ThreadTuner` times the caller's own steps (a training step, a generation step) at each candidate
  count ``1 .. usable cores`` (``os.sched_getaffinity``), keeps the fastest, and tunes again when the step time
  drifts away from what it measured (load comes and goes during a run) and ``recheck_seconds`` after the last
  tuning (a periodic re-check that keeps the count doubles the wait before the next one, up to 8x).
  A candidate whose steps are already slower than ``abandon`` times the best one so far is dropped after one
  step, so that a trial under load costs little.
* :func:`resolve_threads` decides who sets the count: an explicit ``threads=N`` (``--threads N``) wins, then
  the user's ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` or a ``torch.set_num_threads`` made after this module was
  imported; only when nobody said anything does ``"auto"`` tune.

Reproducibility: with a fixed seed and a fixed thread count a CPU run gives the same losses bit for bit. The
thread count changes the order of some floating-point sums (matrix products split across threads), so two
counts give losses that differ in the last digits and drift apart slowly. Inside a training run
(:class:`RunThreads`) the counts are therefore part of the run: they are timed on steps that are not kept, every
change is made at an iteration where a checkpoint is written, and the checkpoint holds the tuner's state, so
that a resumed run replays the interrupted one's counts. Two separate runs under different loads may still
choose different counts; pass ``--threads N`` for runs that must repeat each other exactly.
"""

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["AUTO", "RunThreads", "ThreadChoice", "ThreadTuner", "apply_threads", "at_each_count", "candidate_counts",
           "fix_threads", "resolve_threads", "settle_threads", "tune_threads", "usable_cores"]

AUTO = "auto"

#: torch's thread count when this module was imported: a different count later means the user set one.
_THREADS_AT_IMPORT = torch.get_num_threads()
#: Counts this module set itself (not the user's).
_OURS: set[int] = set()

#: The environment variables through which a user fixes the thread count (OpenMP's and MKL's).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def candidate_counts(cores: int | None = None) -> list[int]:
    """The counts to try: every count from 1 to ``cores`` up to 8, then powers of two and ``cores``."""
    cores = usable_cores() if cores is None else cores
    if cores <= 8:
        return list(range(1, cores + 1))
    return sorted({*(2**i for i in range(cores.bit_length()) if 2**i <= cores), cores})


def _set_threads(count: int) -> None:
    _OURS.add(count)
    torch.set_num_threads(count)


@dataclass(frozen=True)
class ThreadChoice:
    """Who decides the thread count: ``count`` fixed (``source`` says by whom), or ``count=None`` to tune."""

    count: int | None
    source: str  # "--threads", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "torch.set_num_threads" or "auto"

    def describe(self) -> str:
        if self.count is None:
            return f"threads auto (the fastest of {', '.join(map(str, candidate_counts()))}, timed on the first " \
                   "steps, re-checked when the step time drifts)"
        return f"threads {self.count} ({self.source})"


def resolve_threads(requested: int | str | None) -> ThreadChoice:
    """Who sets the thread count. ``requested``: a positive int (explicit, wins), ``"auto"`` or None (tune,
    unless the user fixed a count through the environment or ``torch.set_num_threads``).

    Raises:
        ValueError: ``requested`` is neither a positive int nor ``"auto"``/None.
    """
    if isinstance(requested, int) and not isinstance(requested, bool):
        if requested < 1:
            raise ValueError(f"threads must be a positive integer or 'auto', got {requested}")
        return ThreadChoice(requested, "--threads")
    if requested not in (None, AUTO):
        raise ValueError(f"threads must be a positive integer or 'auto', got {requested!r}")
    for name in THREAD_VARIABLES:
        if os.environ.get(name, "").strip():
            return ThreadChoice(torch.get_num_threads(), name)
    current = torch.get_num_threads()
    if current != _THREADS_AT_IMPORT and current not in _OURS:
        return ThreadChoice(current, "torch.set_num_threads")
    return ThreadChoice(None, AUTO)


@dataclass
class _Trial:
    count: int
    times: list[float] = field(default_factory=list)


class ThreadTuner:
    """Chooses the thread count from the caller's own steps.

    Call :meth:`begin` before and :meth:`end` after each step (or ``observe(seconds)`` with a duration
    measured elsewhere). While tuning, the steps run at each candidate count in turn: ``warmup`` steps after a
    switch are not counted, then ``trial`` steps are timed; the count with the lowest median wins (a count
    within ``tie`` of a smaller count's time loses to the smaller one: fewer threads suffer less from load).
    Once settled, the median of the last ``window`` steps is compared with the winner's time: outside
    ``[1/drift, drift]`` times it, or ``recheck_seconds`` after the last tuning, the tuner tunes again; a
    periodic re-check that keeps the count doubles the wait before the next (up to 8x ``recheck_seconds``),
    any change of count or a drift resets it.

    ``clock`` (seconds, monotonic) and ``set_threads`` are injectable for tests. ``log`` receives one line
    per change of count (the first choice included; a re-check that keeps the count prints nothing).
    """

    def __init__(self, candidates: Sequence[int] | None = None, *, warmup: int = 1, trial: int = 3,
                 window: int = 5, drift: float = 1.5, abandon: float = 1.5, tie: float = 0.03,
                 recheck_seconds: float | None = 30.0, clock: Callable[[], float] = time.perf_counter,
                 set_threads: Callable[[int], None] = _set_threads,
                 log: Callable[[str], None] | None = None) -> None:
        self.candidates = list(candidates) if candidates is not None else candidate_counts()
        if not self.candidates or any(not isinstance(c, int) or c < 1 for c in self.candidates):
            raise ValueError(f"ThreadTuner: candidates must be positive ints, got {self.candidates!r}")
        if warmup < 0 or trial < 1 or window < 1 or drift <= 1 or abandon <= 1:
            raise ValueError("ThreadTuner: need warmup >= 0, trial >= 1, window >= 1, drift > 1, abandon > 1")
        self.warmup, self.trial, self.window = warmup, trial, window
        self.drift, self.abandon, self.tie = drift, abandon, tie
        self.recheck_seconds = recheck_seconds
        self.clock, self._set, self.log = clock, set_threads, log
        #: The chosen count (None while the first tuning runs).
        self.count: int | None = None
        #: The winner's median step time in seconds (None while tuning).
        self.step_time: float | None = None
        #: Every decision: (count, median step seconds per tried count).
        self.decisions: list[tuple[int, dict[int, float]]] = []
        self._started: float | None = None
        self._recent: list[float] = []
        self._settled_at = 0.0
        self._wait = recheck_seconds  # seconds from one settled tuning to the next periodic re-check
        self._periodic = False  # the tuning under way was started by the periodic re-check
        self._queue: list[int] | None = None
        if len(self.candidates) == 1:  # nothing to choose from
            self.count = self.candidates[0]
            self._set(self.count)
        else:
            self._start_tuning()

    @property
    def tuning(self) -> bool:
        return self._queue is not None

    def _start_tuning(self) -> None:
        self._queue = list(self.candidates)
        self._results: dict[int, float] = {}
        self._next_candidate()

    def _next_candidate(self) -> None:
        assert self._queue is not None
        if not self._queue:
            self._finish()
            return
        self._current = _Trial(self._queue.pop(0))
        self._skip = self.warmup
        self._set(self._current.count)

    def _finish(self) -> None:
        best_count = min(self._results, key=self._results.__getitem__)
        best = self._results[best_count]
        # The smallest count within `tie` of the best: as fast, and more robust when load comes.
        chosen = min(c for c, t in self._results.items() if t <= best * (1 + self.tie))
        self._queue = None
        changed = chosen != self.count
        if self.recheck_seconds is not None:
            self._wait = (min(2 * (self._wait or self.recheck_seconds), 8 * self.recheck_seconds)
                          if self._periodic and not changed else self.recheck_seconds)
        self._periodic = False
        self.count, self.step_time = chosen, self._results[chosen]
        self.decisions.append((chosen, dict(self._results)))
        self._set(chosen)
        self._recent = []
        self._settled_at = self.clock()
        if self.log is not None:
            tried = ", ".join(f"{c}: {1e3 * t:.1f} ms" if t != float("inf") else f"{c}: dropped"
                              for c, t in sorted(self._results.items()))
            if changed:  # a re-check that keeps the count is not news: one line per change of count
                self.log(f"threads: {chosen} (median step time {tried})")

    def begin(self) -> None:
        """A step starts now."""
        self._started = self.clock()

    def end(self) -> None:
        """The step begun by :meth:`begin` ended now."""
        if self._started is None:
            raise RuntimeError("ThreadTuner.end() without begin()")
        seconds = self.clock() - self._started
        self._started = None
        self.observe(seconds)

    def observe(self, seconds: float) -> None:
        """One step took ``seconds`` at the current count."""
        if self._queue is not None:
            self._observe_trial(seconds)
            return
        if self.step_time is None:  # a single candidate: never tuned
            return
        self._recent = [*self._recent, seconds][-self.window:]
        if len(self._recent) == self.window:
            typical = statistics.median(self._recent)
            if not self.step_time / self.drift <= typical <= self.step_time * self.drift:
                self._start_tuning()
                return
        if self._wait is not None and self.clock() - self._settled_at >= self._wait:
            self._start_tuning()
            self._periodic = True

    def _observe_trial(self, seconds: float) -> None:
        best = min(self._results.values(), default=float("inf"))
        if seconds > best * self.abandon * 2 and self._results:  # even a warm-up step this slow: drop it
            self._results[self._current.count] = float("inf")
            self._next_candidate()
            return
        if self._skip > 0:
            self._skip -= 1
            return
        self._current.times.append(seconds)
        if seconds > best * self.abandon:
            self._results[self._current.count] = statistics.median(self._current.times) \
                if len(self._current.times) >= self.trial else float("inf")
            self._next_candidate()
            return
        if len(self._current.times) >= self.trial:
            self._results[self._current.count] = statistics.median(self._current.times)
            self._next_candidate()


class RunThreads:
    """``--threads auto`` inside a training run, where a resumed run must be bit-identical to the run it resumes.

    The count changes the order of floating-point sums, so the counts the kept steps ran at are part of the run.
    Here the candidates are timed on ``trial`` steps that are not kept (the caller's: a forward and backward
    whose gradients and random draws are thrown away; ``trial()`` returns its seconds), the kept steps run at the
    chosen count only, and a change of count happens in :meth:`tune`, which the caller calls before a step and
    follows with a checkpoint when the count changed: every change is a point both the interrupted and the
    resumed run share. :meth:`state` (JSON) goes into each checkpoint and ``state=`` restores it, the re-check's
    window and clock included, so a resumed run makes the decisions the interrupted one would have made from
    the same step times.

    Re-check (:attr:`due`): the median of the last ``window`` kept steps is outside ``[1/drift, drift]`` times
    the first ``window`` kept steps' after the last tuning (the load changed), or ``recheck_seconds`` of kept
    step time have passed since it (doubling while the count is kept, up to 8x). Step time, not the wall
    clock, so that the decisions depend on the steps' timings only (and a test can give them).
    """

    def __init__(self, trial: Callable[[], float], candidates: Sequence[int] | None = None, *, window: int = 5,
                 drift: float = 1.5, recheck_seconds: float = 30.0, state: dict[str, Any] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.trial, self.window, self.drift, self.recheck_seconds, self.log = trial, window, drift, recheck_seconds, log
        self.candidates = list(candidates) if candidates is not None else candidate_counts()
        #: The count the kept steps run at (None before the first tuning).
        self.count: int | None = None
        #: Every change of count: ``[iteration, count]``.
        self.changes: list[list[int]] = []
        self.reference: float | None = None  # the median kept step after the last tuning
        self.recent: list[float] = []
        self.since = 0.0  # kept step seconds since the last tuning
        self.wait = recheck_seconds
        self.due = True
        if state is not None:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        try:
            count, changes = state["count"], [[int(i), int(c)] for i, c in state["changes"]]
            reference = None if state["reference"] is None else float(state["reference"])
            recent, since = [float(s) for s in state["recent"]], float(state["since"])
            wait, due = float(state["wait"]), bool(state["due"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"the checkpoint's thread state is not valid ({err!r})") from None
        if count is not None:
            if not isinstance(count, int) or count < 1:
                raise ValueError(f"the checkpoint's thread count must be a positive integer, got {count!r}")
            self.count = count
            _set_threads(count)
        self.changes, self.reference, self.recent, self.since, self.wait, self.due = (
            changes, reference, recent, since, wait, due)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to resume the schedule (JSON)."""
        return {"count": self.count, "changes": self.changes, "reference": self.reference, "recent": self.recent,
                "since": self.since, "wait": self.wait, "due": self.due}

    def observe(self, seconds: float) -> None:
        """A kept step took ``seconds`` at :attr:`count`."""
        self.since += seconds
        self.recent = [*self.recent, seconds][-self.window:]
        if len(self.recent) < self.window:
            return
        typical = statistics.median(self.recent)
        if self.reference is None:
            self.reference = typical
        elif not self.reference / self.drift <= typical <= self.reference * self.drift:
            self.due = True
        if self.since >= self.wait:
            self.due = True

    def tune(self, iteration: int) -> bool:
        """Before the step at ``iteration``, when :attr:`due`: time every candidate on trial steps, set the
        fastest; returns whether the count changed (the caller then writes a checkpoint at ``iteration``)."""
        if not self.due:
            return False
        tuner = ThreadTuner(self.candidates, recheck_seconds=None)
        while tuner.tuning:
            tuner.observe(self.trial())
        chosen, tried = tuner.count, tuner.decisions[-1][1]
        assert chosen is not None
        changed = chosen != self.count
        self.wait = self.recheck_seconds if changed else min(2 * self.wait, 8 * self.recheck_seconds)
        self.reference, self.recent, self.since, self.due = None, [], 0.0, False
        _set_threads(chosen)
        if changed:
            self.count = chosen
            self.changes.append([iteration, chosen])
            if self.log is not None:
                times = ", ".join(f"{c}: {1e3 * t:.1f} ms" if t != float("inf") else f"{c}: dropped"
                                  for c, t in sorted(tried.items()))
                self.log(f"threads: {chosen} at iteration {iteration} (median trial step {times})")
        return changed


def tune_threads(step: Callable[[], object], candidates: Sequence[int] | None = None, *,
                 log: Callable[[str], None] | None = None, **options: Any) -> int:
    """Run ``step`` (one real unit of the work to come: a generation step, a benchmark call) under a
    :class:`ThreadTuner` until it has chosen, set that count and return it."""
    tuner = ThreadTuner(candidates, recheck_seconds=None, log=log, **options)
    while tuner.tuning:
        tuner.begin()
        step()
        tuner.end()
    assert tuner.count is not None
    return tuner.count


def at_each_count(measure: Callable[[], float], counts: Sequence[int] | None = None) -> dict[int, float]:
    """``measure()`` at each thread count of ``counts`` (default :func:`candidate_counts`), then torch's count as it
    was (so a later ``"auto"`` still tunes: the counts set here are not the user's)."""
    before = torch.get_num_threads()
    results: dict[int, float] = {}
    try:
        for count in candidate_counts() if counts is None else counts:
            _set_threads(count)
            results[count] = measure()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
    return results


def apply_threads(requested: int | str | None, *, log: Callable[[str], None] | None = None
                  ) -> tuple[ThreadChoice, "ThreadTuner | None"]:
    """Resolve ``requested`` (:func:`resolve_threads`); a fixed count is set now, ``auto`` gets a tuner to
    drive with the steps to come."""
    choice = fix_threads(requested)
    return choice, None if choice.count is not None else ThreadTuner(log=log)


def fix_threads(requested: int | str | None) -> ThreadChoice:
    """Resolve ``requested`` (:func:`resolve_threads`) and set a count given by ``--threads N`` now."""
    choice = resolve_threads(requested)
    if choice.count is not None and choice.source == "--threads":
        _set_threads(choice.count)
    return choice


def settle_threads(requested: int | str | None, step: Callable[[], object], *,
                   log: Callable[[str], None] | None = None) -> ThreadChoice:
    """For a command that is not a training loop (generation, a benchmark): resolve ``requested``; a fixed
    count is set, ``auto`` is tuned now on ``step`` (:func:`tune_threads`) and stays for the command."""
    choice, tuner = apply_threads(requested)
    if tuner is not None:
        tune_threads(step, tuner.candidates, log=log)
    return choice
