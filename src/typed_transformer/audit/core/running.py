"""Running a check: the registry of checks, the budget of sizes each draws from, the call of the candidate under a
time limit, and the shrinking of a failure to its smallest example."""

import dataclasses
import math
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal, TypeAlias

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from torch import Tensor

from .conventions import _PHASES, DTYPE_NAMES
from .examples import Example, example_fields
from .report import Adapter, CheckResult
from .trusted import replaced

# ----------------------------------------------------------------------------------------------------
# Check machinery
# ----------------------------------------------------------------------------------------------------


@contextmanager
def audit_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` while an audit runs, then restored (None: left as it is).
    The audit's tensors are small: one thread is fastest for them, and on a busy machine torch's default of one
    thread per core was measured 10-20x slower (docs/testing.md)."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        if threads < 1:
            raise ValueError(f"threads must be a positive count or None, got {threads}")
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


class CheckFailure(AssertionError):
    """A check found the candidate wrong on ``example``."""

    def __init__(self, message: str, example: Example | None = None, ratio: float | None = None) -> None:
        super().__init__(message)
        self.example = example
        self.ratio = ratio


class Skip(Exception):
    """The check does not apply to this candidate (the message says why)."""


class CandidateRaised(Exception):
    """The candidate's own code raised (the exception is the ``__cause__``), or modified one of its inputs in
    place: a failure of the check. Any other exception inside a check is a bug of the audit and propagates."""


class CandidateStopped(BaseException):
    """A call of the candidate ended the interpreter (``sys.exit``) or did not return within the time limit
    (:func:`call_time_limit`): the audit stops there, its report unfinished, and this names the call (the check,
    the dtype and the example, when the call was a check's; an inference probe's has none). A ``BaseException``,
    as the ``SystemExit`` it reports: nothing that catches ``Exception`` (the candidate, Hypothesis) swallows it,
    and Hypothesis does not rerun a hung call to shrink it."""

    def __init__(self, what: str, check: str | None = None, dtype: str | None = None,
                 example: "Example | None" = None) -> None:
        super().__init__(what)
        self.what, self.check, self.dtype, self.example = what, check, dtype, example

    def line(self) -> str:
        """One line: which call, and what it did."""
        where = (" probing its conventions (--infer)" if self.check is None
                 else f" in check {self.check} [{self.dtype or '-'}]")
        shapes = "" if self.example is None else (f" (b={self.example.b} h={self.example.h} g={self.example.g} "
                                                  f"t={self.example.t} s={self.example.s} d={self.example.d} "
                                                  f"dv={self.example.dv}, seed {self.example.seed})")
        return f"FAIL: a call of the candidate{where}{shapes} {self.what}; the audit stopped there"

    def __str__(self) -> str:
        return self.line()


#: The default time limit of one call of the candidate, in seconds: the audit's inputs are small (a correct
#: candidate answers in milliseconds), so this is only ever reached by a call that hangs.
DEFAULT_CALL_TIME_LIMIT = 60.0
_CALL_TIME_LIMIT: ContextVar[float | None] = ContextVar("call_time_limit", default=DEFAULT_CALL_TIME_LIMIT)


@contextmanager
def call_time_limit(seconds: float | None) -> Iterator[None]:
    """Audits run inside give each call of the candidate ``seconds`` (``None``: no limit; default
    :data:`DEFAULT_CALL_TIME_LIMIT`); a call past it stops the audit with :class:`CandidateStopped`. The limit is
    a ``SIGALRM`` timer that raises in the candidate's Python code, so it holds in the main thread of a POSIX
    process only (elsewhere calls run unlimited), and a single C call that never returns (a torch kernel) is
    out of its reach: run the audit in a child process with a timeout for that."""
    if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"call_time_limit: seconds must be positive and finite or None, got {seconds!r}")
    token = _CALL_TIME_LIMIT.set(seconds)
    try:
        yield
    finally:
        _CALL_TIME_LIMIT.reset(token)


class _TimedOut(BaseException):
    """Raised in the candidate's code by the call's timer (a BaseException: ``except Exception`` lets it by)."""


class _Alarm:
    """The call's timer: SIGALRM after ``seconds``, then every second until the call is over (a candidate that
    swallows one gets the next); the previous handler and timer are restored after. Hand-written: no library
    interrupts a call in the running thread."""

    def __init__(self, seconds: float | None) -> None:
        usable = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
        self.seconds = seconds if usable else None
        self.armed = self.fired = False

    def _ring(self, signum: int, frame: FrameType | None) -> None:
        self.fired = True
        if self.armed:
            raise _TimedOut

    def __enter__(self) -> None:
        if self.seconds is None:
            return
        self.started = time.monotonic()
        self.previous = signal.signal(signal.SIGALRM, self._ring)
        self.previous_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, 1.0)
        self.armed = True

    def __exit__(self, *exc: object) -> None:
        if self.seconds is None:
            return
        self.armed = False
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, self.previous)
            left, interval = self.previous_timer
            if left > 0:  # an enclosing timer keeps running (nested calls)
                signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - self.started), 1e-3), interval)


def modified(before: Tensor, after: Tensor) -> bool:
    """Whether ``after`` no longer holds ``before``'s values (shape, dtype or data; NaN where NaN was is no change)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return True
    return not torch.equal(torch.nan_to_num(before), torch.nan_to_num(after.detach())) or not torch.equal(
        before.isnan(), after.detach().isnan())


def _denormals_flushed() -> bool:
    """Whether the CPU flushes denormal floats to zero (``torch.set_flush_denormal``, which has no getter: a float64
    denormal times one reads back as zero)."""
    return bool(torch.tensor([1e-310], dtype=torch.float64).mul(1.0)[0] == 0)


def _cpu_autocast() -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")


def _set_cpu_autocast(state: tuple[bool, torch.dtype]) -> None:
    torch.set_autocast_enabled("cpu", state[0])
    torch.set_autocast_dtype("cpu", state[1])


class _RngState(bytes):
    """torch's CPU generator state, compared by value (and named without its 5 KB of bytes)."""


def _rng_state() -> _RngState:
    return _RngState(torch.get_rng_state().numpy().tobytes())


def _set_rng_state(state: _RngState) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


#: torch's global settings a candidate's call must leave as it found them: (name, getter, setter)
_GLOBAL_STATE: tuple[tuple[str, Callable[[], Any], Callable[[Any], Any]], ...] = (
    ("gradients enabled", torch.is_grad_enabled, torch.set_grad_enabled),
    ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("deterministic algorithms", torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    ("intra-op threads", torch.get_num_threads, torch.set_num_threads),
    ("denormals flushed to zero", _denormals_flushed, torch.set_flush_denormal),
    ("CPU autocast (enabled, dtype)", _cpu_autocast, _set_cpu_autocast),
    ("torch's CPU random generator", _rng_state, _set_rng_state),
)


def global_state() -> list[Any]:
    """torch's global settings a call must leave as it found them, in :data:`_GLOBAL_STATE`'s order."""
    return [get() for _, get, _ in _GLOBAL_STATE]


def restore_global_state(before: list[Any]) -> list[str]:
    """Puts back each global setting that differs from ``before``; returns what had changed, as ``name: a -> b``
    (the random generator's: drawn from or reseeded)."""
    changed = []
    for (name, get, put), was in zip(_GLOBAL_STATE, before, strict=True):
        now = get()
        if now != was:
            changed.append(f"{name}: drawn from or reseeded" if isinstance(was, _RngState)
                           else f"{name}: {was} -> {now}")
            put(was)
    return changed


#: the changes to torch's global settings the candidate's calls made, for the audit that collects them
_STATE_CHANGES: ContextVar[list[str] | None] = ContextVar("state_changes", default=None)


def subclass_note(name: str) -> str:
    """What the report says of an output of a tensor subclass."""
    return (f"its output is a {name}, a tensor subclass: judged as the plain tensor it holds (the subclass's own "
            f"methods are never asked)")


def note_change(change: str) -> None:
    """Name a change the candidate made outside its output (one that is no wrong verdict) in the report of the audit
    that collects them (:func:`collect_state_changes`); each named once."""
    if (noted := _STATE_CHANGES.get()) is not None and change not in noted:
        noted.append(change)


@contextmanager
def collect_state_changes() -> Iterator[list[str]]:
    """The changes to torch's global settings the candidate's calls make inside the block (each put back after its
    call), as ``name: before -> after``; an enclosing collection keeps collecting."""
    if (outer := _STATE_CHANGES.get()) is not None:
        yield outer
        return
    found: list[str] = []
    token = _STATE_CHANGES.set(found)
    try:
        yield found
    finally:
        _STATE_CHANGES.reset(token)


@contextmanager
def candidate_code(**inputs: Tensor | None) -> Iterator[None]:
    """Run the candidate's code: its exceptions become :class:`CandidateRaised`, and so does a change it made
    to one of the named ``inputs`` (compared with copies after the call); torch's global settings it changes
    (gradients, default dtype, deterministic mode, thread count, denormal flushing, CPU autocast, the CPU random
    generator's state) are put back after the call and named in the report
    (:func:`collect_state_changes`), not failed: a correct candidate stays correct; ``sys.exit`` or a call past the time
    limit (:func:`call_time_limit`) raises :class:`CandidateStopped`. ``KeyboardInterrupt`` (Ctrl-C, and the
    command line's SIGTERM) passes through."""
    copies = {name: x.detach().clone() for name, x in inputs.items() if isinstance(x, Tensor)}
    limit = _CALL_TIME_LIMIT.get()
    alarm = _Alarm(limit)
    state = global_state()
    swapped: list[str] = []
    try:
        with alarm:
            try:
                yield
            finally:
                changed = restore_global_state(state)
                swapped = replaced()  # put back even when the candidate raised after replacing them
    except (CandidateStopped, KeyboardInterrupt):
        raise
    except (CheckFailure, Skip, CandidateRaised) as err:  # the audit's own exceptions, raised by the candidate
        raise CandidateRaised(f"{type(err).__name__}: {err} (the audit's own exception, raised by the candidate's "
                              f"code: a candidate cannot skip or fail a check for the audit)") from err
    except _TimedOut:
        pass  # the flag says it below
    except SystemExit as exit_:
        raise CandidateStopped(f"called sys.exit({exit_.code!r})") from None
    except BaseException as err:
        raise CandidateRaised(f"{type(err).__name__}: {err}") from err
    if alarm.fired:
        raise CandidateStopped(f"did not return within the time limit of {limit:g} s per call")
    if swapped:
        raise CandidateRaised(f"the candidate replaced functions the reference computes with: {'; '.join(swapped)} "
                              f"(put back by the audit: the reference would have computed what the candidate "
                              f"computes)")
    for change in changed:  # put back already: named in the report
        note_change(change)
    for name, before in copies.items():
        after = inputs[name]
        if isinstance(after, Tensor) and modified(before, after):
            raise CandidateRaised(f"the candidate modified its input {name} in place during the call (the "
                                  f"counterexample's): inputs must be left as given")


#: Which deep examples a search draws (see :class:`Budget`).
Deep: TypeAlias = Literal["lengths", "sizes", "widest", "longest"]

#: Past this many keys an example has one batch element and at most two query heads: the float64 reference of
#: 4096 x 4096 logits is 128 MiB a head.
LONG = 512


@dataclass(frozen=True)
class Budget:
    """How deep the audit looks. Beside ``max_examples`` small examples per check and dtype (sizes 1..6, which
    shrink well), ``deep_examples`` more are drawn at the sizes kernels get wrong: key and query lengths on both
    sides of the tiles kernels use (``lengths``), the head sizes kernels specialise with small lengths
    (``head_sizes``), batches and head counts above 4 with small lengths (``batches``, ``heads``: past 8 too, where
    kernels launch one program per batch and head and index them), each with the check's masks and causal setting;
    then one example at the widest batch and head count listed, and one at the longest length (``t = s``), so that
    the largest listed sizes are always reached. Past :data:`LONG` keys an example has one batch element and at
    most two query heads. Each list is ordered small to large and drawn with ``sampled_from``, which
    shrinks towards its first element: a bug first seen at 129 keys is reported at the smallest listed length that
    still fails (17 for a kernel whose 16-key blocks forget to rescale). The lengths run as their own search of
    ``deep_examples`` examples, head sizes and batches as one more of half as many; when a deep example fails,
    each listed size below the failing one is searched alone (as many examples), smallest first, and the first
    that fails is reported: a failure Hypothesis could not shrink past its seed is still reported at the smallest
    failing size.
    ``half_precision``: a function is audited in float16 and bfloat16 too when it accepts them and ``dtypes`` is
    not given. ``quick`` (the audit before budgets: its sizes, float32 and float64) has no deep examples and no
    half precision by default."""

    name: str = "default"
    lengths: tuple[int, ...] = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
    head_sizes: tuple[int, ...] = (64, 65, 80, 96, 127, 128, 256)
    batches: tuple[int, ...] = (5, 8, 9, 12, 16)
    heads: tuple[int, ...] = (5, 6, 8, 12, 16)
    deep_examples: int = 6
    half_precision: bool = True

    def __post_init__(self) -> None:
        for name in ("lengths", "head_sizes", "batches", "heads"):
            values = getattr(self, name)
            if any(not isinstance(v, int) or v < 1 for v in values) or list(values) != sorted(set(values)):
                raise ValueError(f"Budget: {name} must be positive integers in increasing order; got {values}")
        if self.deep_examples < 0:
            raise ValueError(f"Budget: deep_examples must be >= 0; got {self.deep_examples}")


#: The budgets by name: ``quick`` draws only the small examples, ``default`` reaches the tiles too, ``ci`` (for a
#: suite run on every change: every check and dtype of ``default``) reaches one length on each side of the tiles of
#: 16 and 64 keys, two specialised head sizes, one batch and two head counts above 8, two deep examples each;
#: ``thorough`` adds key lengths 512 to 4096 (where a half-precision running sum drifts) and 32 and 64 heads.
BUDGETS = {"quick": Budget("quick", (), (), (), (), 0, half_precision=False), "default": Budget(),
           "ci": Budget("ci", lengths=(16, 17, 64, 65), head_sizes=(64, 128), batches=(9,), heads=(8, 12),
                        deep_examples=2),
           "thorough": Budget("thorough", lengths=(*Budget().lengths, 512, 1024, 2048, 4096),
                              heads=(*Budget().heads, 32, 64))}


def resolve_budget(budget: "Budget | str") -> Budget:
    """A :class:`Budget` or the name of one in :data:`BUDGETS`."""
    if isinstance(budget, Budget):
        return budget
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; choose {', '.join(BUDGETS)} or pass a Budget")
    return BUDGETS[budget]


@dataclass
class Run:
    """State shared by the examples of one check: worst passing ratio, examples run before the first failure,
    the example being run, the budget and whether its deep examples (tile-crossing sizes) are being drawn."""

    adapter: Adapter
    dtype: torch.dtype
    tolerance: float
    worst: float = 0.0
    examples: int = 0
    failing: bool = False
    current: Example | None = None
    budget: Budget = field(default_factory=Budget)
    #: None: the small examples; "lengths": the budget's lengths; "sizes": its head sizes, batches and heads;
    #: "widest": its largest batch and head count; "longest": its longest length
    deep: "Deep | None" = None

    def note(self, ratio: float) -> None:
        if math.isfinite(ratio):
            self.worst = max(self.worst, ratio)


CheckBody: TypeAlias = Callable[[Run, st.DataObject], None]


@dataclass(frozen=True)
class Check:
    """A registered check: its body, and whether it applies to functions, modules or both."""

    name: str
    body: CheckBody
    kinds: tuple[str, ...] = ("function", "module")
    doc: str = ""
    #: whether the budget's deep examples apply (False: the check draws its own sizes)
    deep: bool = True


REGISTRY: dict[str, Check] = {}


def register(name: str, *, kinds: tuple[str, ...] = ("function", "module"), deep: bool = True
             ) -> Callable[[CheckBody], CheckBody]:
    """Register a check body under ``name`` (the order of registration is the order of the report)."""

    def wrap(body: CheckBody) -> CheckBody:
        REGISTRY[name] = Check(name, body, kinds, (body.__doc__ or "").strip(), deep)
        return body

    return wrap


def run_check(check: Check, adapter: Adapter, dtype: torch.dtype, *, max_examples: int, seed: int,
              tolerance: float, budget: Budget | None = None) -> CheckResult:
    """Run ``check`` on ``adapter`` for inputs in ``dtype`` as Hypothesis tests (shrinking on): the small
    examples, then (when they pass) the budget's deep examples; the row counts both."""
    budget = BUDGETS["quick"] if budget is None else budget
    result = _run_phase(check, Run(adapter, dtype, tolerance, budget=budget), max_examples, seed)
    if not check.deep or not budget.deep_examples:
        return result
    # the lengths (where tiled kernels fail) in their own search, then head sizes and batches in half as many, then
    # one example at the widest batch and head count and one at the longest length (each list's largest)
    deep_examples = budget.deep_examples
    phases: list[tuple[Deep, int]] = [("lengths", deep_examples), ("sizes", -(-deep_examples // 2)),
                                      ("widest", 1), ("longest", 1)]
    for deep, examples in phases:
        if result.status != "PASS":
            break
        more = _run_phase(check, Run(adapter, dtype, tolerance, budget=budget, deep=deep), examples, seed)
        more.examples += result.examples
        if more.status == "PASS":
            more.ratio = max(result.ratio or 0.0, more.ratio or 0.0)
        else:
            more = _smallest(check, Run(adapter, dtype, tolerance, budget=budget, deep=deep), more, deep_examples,
                             seed)
        result = more
    return result


def _smallest(check: Check, run: Run, failed: CheckResult, examples: int, seed: int) -> CheckResult:
    """``failed`` (a deep example's failure), or the failure of a search at the smallest listed size below its
    size that fails, axis by axis (the key length; or the batch, then the head count with the batch held; or the
    head size): one search per size, smallest first. Hypothesis lowers a listed size only while the rest of the
    example (its seed, shrunk to 0 first) still fails, which can leave it at 127 keys when 65 fail too, and the
    widest and longest examples are drawn at the largest sizes."""
    found = failed
    deep: Deep = "lengths" if run.deep in ("lengths", "longest") else "sizes"
    for axis in ("s",) if deep == "lengths" else ("b", "h", "d"):
        if found.counterexample is None:
            break
        for below in _below(run.budget, axis, found.counterexample):
            retry = _run_phase(check, dataclasses.replace(run, budget=below, deep=deep), examples, seed)
            failed.examples += retry.examples
            if retry.status == "FAIL":
                found = retry
                break
    found.examples = failed.examples
    return found


def _below(budget: Budget, axis: str, example: dict[str, Any]) -> list[Budget]:
    """One budget per listed size below ``example``'s on ``axis`` (``s``: the key length; ``b``: the batch, the head
    count held; ``h``: the head count, the batch held; ``d``: the head size), smallest first, each drawing that size
    alone on that axis. Empty where the example's size is not a listed one (the axis was not the deep one)."""
    b, h, d = example["b"], example["h"], example.get("d")
    if axis == "s":
        return [dataclasses.replace(budget, lengths=(n,)) for n in budget.lengths if n < example["s"]]
    if axis == "b" and b in budget.batches:
        held = (h,) if h in budget.heads else budget.heads
        return [dataclasses.replace(budget, head_sizes=(), batches=(n,), heads=held) for n in budget.batches if n < b]
    if axis == "h" and b in budget.batches and h in budget.heads:
        return [dataclasses.replace(budget, head_sizes=(), batches=(b,), heads=(n,)) for n in budget.heads if n < h]
    if axis == "d" and d in budget.head_sizes and b not in budget.batches:
        return [dataclasses.replace(budget, head_sizes=(n,), batches=()) for n in budget.head_sizes if n < d]
    return []


def _first_failure(error: BaseException) -> "CheckFailure | None":
    """The first :class:`CheckFailure` inside ``error`` (an exception group of Hypothesis's), or None."""
    if isinstance(error, CheckFailure):
        return error
    for inner in getattr(error, "exceptions", ()):
        if (found := _first_failure(inner)) is not None:
            return found
    return None


def _run_phase(check: Check, run: Run, max_examples: int, seed: int) -> CheckResult:
    """One Hypothesis test of ``check`` (``run.deep``: at the budget's deep sizes)."""
    adapter, dtype_name = run.adapter, DTYPE_NAMES[run.dtype]

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=False, phases=_PHASES,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False)
    @hypothesis_seed(seed)
    @given(st.data())
    def test(data: st.DataObject) -> None:
        if not run.failing:
            run.examples += 1
        run.current = None
        try:
            check.body(run, data)
        except CheckFailure as failure:
            run.failing = True
            if failure.example is None:
                failure.example = run.current
            raise
        except Skip:
            raise
        except CandidateRaised as raised:  # the candidate raised: that is a failure of this check
            run.failing = True
            err = raised.__cause__
            if err is None:  # the wrapper's own finding about the call (an input modified in place)
                raise CheckFailure(str(raised), run.current) from raised
            first_line = str(err).splitlines()[0] if str(err) else ""
            raise CheckFailure(f"candidate raised {type(err).__name__}: {first_line}", run.current) from err

    try:
        try:
            test()
        except Flaky as flaky:  # a failure that did not come back when replayed: the candidate is nondeterministic
            first = _first_failure(flaky)
            if first is None:
                raise
            raise CheckFailure(f"nondeterministic: an example failed, then passed when Hypothesis replayed it "
                               f"(the same inputs, another output); the first failure: {first}", first.example,
                               first.ratio) from first
    except CandidateStopped as stopped:  # the call that ended or hung: named, then the audit stops
        if stopped.check is None:
            stopped.check, stopped.dtype, stopped.example = check.name, dtype_name, run.current
        raise
    except Skip as skip:
        return CheckResult(check.name, "SKIP", dtype_name, message=str(skip))
    except CheckFailure as failure:
        example = failure.example
        cause = failure.__cause__
        trace = None if cause is None else "".join(traceback.format_exception(cause)).rstrip()
        return CheckResult(check.name, "FAIL", dtype_name, ratio=failure.ratio, message=str(failure),
                           counterexample=None if example is None else example_fields(example),
                           repro=None if example is None else adapter.repro(example, check.name),
                           examples=run.examples, traceback=trace)
    return CheckResult(check.name, "PASS", dtype_name, ratio=run.worst, examples=run.examples)
