"""What an audit returns: one :class:`CheckResult` per check and dtype, the differences from the paper it found,
their causes, and the :class:`AuditReport` that prints and serialises them."""

import dataclasses
import importlib.metadata
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from jaxtyping import Bool, Float, Float64
from torch import Tensor

from .conventions import CHECKS_VERSION, CandidateOutput, Conventions, Inputs, KeepMask, ReferenceOutput, Rows, Status
from .examples import Example

# ----------------------------------------------------------------------------------------------------
# The adapter protocol
# ----------------------------------------------------------------------------------------------------


class Adapter(Protocol):
    """What every check sees of a candidate: functions (:class:`FunctionAdapter`) and modules
    (:class:`ModuleAdapter`) alike. Inputs are float64 (see :meth:`Example.inputs`); ``keep`` is a canonical
    keep-mask ``(b, 1 or h, t, s)``; outputs are ``(b, h, t, dv)`` (functions) or ``(b, t, e)`` (modules),
    the query axis second to last in both."""

    name: str
    conventions: Conventions
    kind: Literal["function", "module"]
    #: sizes fixed by a module: h, g, d, dv and the input widths (None for a function)
    fixed: dict[str, int] | None
    #: the rotary embedding a module applies (base, style), None if none
    rotary: tuple[float, Literal["half", "interleaved"]] | None
    #: why the order of the keys matters (rotary positions, a position bias, a sliding window), None if it does not
    positional: str | None
    #: the longest sequence a module takes (its spec's ``max_length``), None: any
    longest: int | None

    def call(self, ins: Inputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype) -> CandidateOutput: ...

    def reference(self, ins: Inputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
                  ) -> ReferenceOutput: ...

    def logit_bound(self, ins: Inputs) -> float: ...

    def logits(self, ins: Inputs) -> Float64[Tensor, "b h t s"]: ...

    def rows(self, keep: KeepMask, example: Example) -> Rows: ...

    def decode(self, ins: Inputs, dtype: torch.dtype) -> CandidateOutput | None: ...

    def fast_path(self, x: Float[Tensor, "b t e"], padding: Bool[Tensor, "b t"], dtype: torch.dtype
                  ) -> CandidateOutput | None: ...

    def repro(self, example: Example, check: str) -> str: ...


# ----------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    """The outcome of one check in one dtype: status, worst error ratio seen, examples run (shrinking not
    counted) and, on FAIL, the shrunk counterexample, a repro snippet and (when the candidate raised) the
    full traceback."""

    name: str
    status: Status
    dtype: str = ""
    ratio: float | None = None
    message: str = ""
    counterexample: dict[str, Any] | None = None
    repro: str | None = None
    examples: int = 0
    traceback: str | None = None


#: What the paper's attention (and this library's API) does, for each inferred field that changes what the
#: attention computes: an inferred value other than this is a *difference*, listed first in the report.
PAPER: dict[str, tuple[Any, str]] = {
    "scale": (None, "1/sqrt(d), d the head size"),
    "mask_polarity": ("keep", "True = may attend"),
    "causal_alignment": ("bottom-right", "with t != s, query i sees keys j <= i + s - t"),
    "fully_masked": ("zero", "a query row without any allowed key gives zeros"),
    "decode_sees_all": (False, "one query sees the keys the causal alignment gives it"),
    "always_causal": (False, "causal only when told is_causal=True"),
    "grouping": ("g r", "query head i uses key/value head i // (h/g), as torch's enable_gqa and Hugging Face's "
                        "repeat_kv"),
}


def expect_value(value: Any) -> str:
    """How ``--expect NAME=VALUE`` spells ``value`` (``1``, ``top-left``, ``true``; ``'r g'`` quoted for the
    shell)."""
    if isinstance(value, str) and " " in value:
        return f"'{value}'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class Difference:
    """An inferred convention that differs from the paper's attention (:data:`PAPER`): ``field`` behaves as
    ``value`` (``seen`` says on which input), where the paper has ``paper``. ``declared``: the user said so
    (``known=`` / ``--expect``), or a module's spec does; an undeclared difference fails the audit's
    :attr:`AuditReport.passed` (exit status 3 on the command line when every check passed)."""

    field: str
    value: Any
    paper: str
    seen: str
    declared: bool

    def declaration(self) -> str:
        """What to declare when the difference is intended."""
        return (f"known={{{self.field!r}: {self.value!r}}} (command line: --expect "
                f"{self.field}={expect_value(self.value)})")

    def line(self) -> str:
        head = f"{self.field} = {self.value!r} (the paper: {self.paper}): {self.seen}"
        if self.declared:
            return f"{head}; declared"
        return f"{head}; NOT DECLARED: if intended, declare {self.declaration()}"


@dataclass
class Cause:
    """One root cause: the rows it explains (references to the report's rows), the row whose counterexample and
    repro are printed, what is wrong in one line, and what a module's diagnosis found."""

    check: str
    rows: list[CheckResult]
    shown: CheckResult
    summary: str
    diagnosis: str | None = None

    def explains(self) -> str:
        """``"reference, causality [float32, float64]; gradients [float64]"``: checks grouped by their dtypes."""
        dtypes: dict[str, list[str]] = {}
        for row in self.rows:
            dtypes.setdefault(row.name, []).append(row.dtype or "-")
        groups: dict[tuple[str, ...], list[str]] = {}
        for name, seen in dtypes.items():
            groups.setdefault(tuple(seen), []).append(name)
        return "; ".join(f"{', '.join(names)} [{', '.join(d)}]" for d, names in groups.items())

    def lines(self, index: int, total: int) -> list[str]:
        row = self.shown
        title = self.summary + (f"; {self.diagnosis}" if self.diagnosis else "")
        lines = [f"root cause {index} of {total}: {title}", f"  explains {self.explains()}",
                 f"  {row.name} [{row.dtype or '-'}]: {row.message.splitlines()[0] if row.message else ''}",
                 f"  counterexample {json.dumps(row.counterexample)}"]
        if row.traceback:
            lines.append(row.traceback.rstrip())
        if row.repro:
            lines.append(row.repro)
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "summary": self.summary, "diagnosis": self.diagnosis,
                "explains": [[r.name, r.dtype] for r in self.rows], "shown": [self.shown.name, self.shown.dtype]}


def closing_line(results: Sequence[CheckResult], causes: Sequence[Cause], dtypes: Sequence[str],
                 undeclared: Sequence[str] = ()) -> str:
    """What was run, per dtype: ``float32: 12 passed; float64: 1 passed, 11 failed; 2 checks skipped; 1 root
    cause`` (the inferred ``conventions`` row first when there is one; the undeclared differences last)."""
    parts = []
    conventions = [r for r in results if r.name == "conventions"]
    if conventions:
        findings = sum(r.status == "FAIL" for r in conventions)
        said = f"FAIL ({findings} finding{'s' if findings != 1 else ''})" if findings else "PASS"
        parts.append(f"conventions {said}")
    rows = [r for r in results if r.name != "conventions"]
    for dtype in [d for d in dtypes if any(r.dtype == d for r in rows)]:
        passed = sum(r.dtype == dtype and r.status == "PASS" for r in rows)
        failed = sum(r.dtype == dtype and r.status == "FAIL" for r in rows)
        parts.append(f"{dtype}: {passed} passed" + (f", {failed} failed" if failed else ""))
    skipped = len({r.name for r in rows if r.status == "SKIP"})
    if skipped:
        parts.append(f"{skipped} check{'s' if skipped != 1 else ''} skipped")
    if causes:
        parts.append(f"{len(causes)} root cause{'s' if len(causes) != 1 else ''}")
    if undeclared:
        parts.append(f"not passed: undeclared difference{'s' if len(undeclared) != 1 else ''} from the paper's "
                     f"attention ({', '.join(undeclared)})")
    return "; ".join(parts)


@dataclass
class AuditReport:
    """Per-check, per-dtype results; ``str(report)`` is :meth:`table`."""

    candidate: str
    conventions: dict[str, Any]
    results: list[CheckResult]
    seed: int
    max_examples: int
    dtypes: list[str]
    tolerance: float
    environment: dict[str, Any] = field(default_factory=dict)
    untested: list[str] = field(default_factory=list)
    #: the inferred conventions and their evidence (``conventions="infer"``), or where declared conventions
    #: contradict the behaviour; printed at the top of the table
    inferred: list[str] = field(default_factory=list)
    #: declared conventions the behaviour contradicts, each with its witness (printed after the rows)
    contradictions: list[str] = field(default_factory=list)
    #: the failing rows grouped by root cause, each printed once with one counterexample and its repro
    causes: list[Cause] = field(default_factory=list)
    #: inferred conventions that differ from the paper's attention (``conventions="infer"`` only), printed first
    differences: list[Difference] = field(default_factory=list)
    #: torch's global settings the candidate's calls changed (each put back after its call), ``name: a -> b``, and
    #: what a later call changed in an earlier call's output or inputs
    state_changes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No check failed, at least one passed (SKIPs are allowed beside it: a report in which every check
        skipped tested nothing), and every difference from the paper's attention that inference found was declared
        (``known=``, ``--expect``, or a module's spec). :attr:`failed` names the failed checks, :attr:`undeclared`
        the undeclared differences."""
        tested = any(r.status == "PASS" for r in self.results)
        return tested and not self.failed and not self.undeclared

    @property
    def undeclared(self) -> list[str]:
        """The fields whose inferred value differs from the paper's attention and was not declared."""
        return [d.field for d in self.differences if not d.declared]

    @property
    def failed(self) -> list[str]:
        """Names of the checks that failed in at least one dtype, in check order."""
        return list(dict.fromkeys(r.name for r in self.results if r.status == "FAIL"))

    def status(self, name: str) -> Status:
        """FAIL if the check failed in any dtype, SKIP if skipped in all, else PASS."""
        statuses = {r.status for r in self.results if r.name == name}
        if not statuses:
            raise KeyError(name)
        return "FAIL" if "FAIL" in statuses else "PASS" if "PASS" in statuses else "SKIP"

    def __getitem__(self, name: str) -> CheckResult:
        """The failing row of check ``name`` if any, else its first row."""
        rows = [r for r in self.results if r.name == name]
        if not rows:
            raise KeyError(name)
        return next((r for r in rows if r.status == "FAIL"), rows[0])

    def table(self) -> str:
        """A plain-text table, one row per check and dtype, then the counterexample of every failure and what
        was not tested."""
        rows = [("check", "dtype", "status", "ratio", "detail")]
        for r in self.results:
            ratio = "-" if r.ratio is None else f"{r.ratio:.3g}"
            rows.append((r.name, r.dtype or "-", r.status, ratio, r.message.splitlines()[0] if r.message else ""))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [f"audit of {self.candidate} (seed {self.seed}, {self.max_examples} examples per check and dtype, "
                 f"dtypes {', '.join(self.dtypes)}, tolerance {self.tolerance:g}x reference error)"]
        if self.inferred:
            lines += [*self.inferred, ""]
        for index, row in enumerate(rows):
            lines.append(("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]).rstrip())
            if index == 0:
                lines.append("  ".join("-" * w for w in widths) + "  ------")
        if self.contradictions:
            lines += ["", *self.contradictions]
        if self.state_changes:
            lines += ["", "the candidate changed state outside its output (torch's global settings: the audit put each "
                          "back after the call; a caller's later code would have run under it or seen it):",
                      *(f"  - {c}" for c in self.state_changes)]
        grouped = {id(r) for cause in self.causes for r in cause.rows}
        for r in self.results:  # failures outside every cause (the inferred conventions' findings)
            if r.status == "FAIL" and id(r) not in grouped:
                lines += ["", f"{r.name} [{r.dtype or '-'}]: counterexample {json.dumps(r.counterexample)}"]
                if r.traceback:
                    lines.append(r.traceback.rstrip())
                if r.repro:
                    lines.append(r.repro)
        for index, cause in enumerate(self.causes, start=1):
            lines += ["", *cause.lines(index, len(self.causes))]
        if self.untested:
            how = "inferred" if any(line.startswith("inferred") for line in self.inferred) else "declared"
            lines += ["", f"not tested ({how} unsupported):"] + [f"  - {note}" for note in self.untested]
        lines += ["", closing_line(self.results, self.causes, self.dtypes, self.undeclared)]
        return "\n".join(lines)

    __str__ = table

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "checks_version": CHECKS_VERSION, "passed": self.passed,
                "undeclared": self.undeclared, "differences": [dataclasses.asdict(d) for d in self.differences],
                "conventions": self.conventions, "seed": self.seed, "max_examples": self.max_examples,
                "dtypes": self.dtypes, "tolerance": self.tolerance, "environment": self.environment,
                "untested": self.untested, "inferred": self.inferred, "contradictions": self.contradictions,
                "state_changes": self.state_changes,
                "results": [dataclasses.asdict(r) for r in self.results],
                "causes": [cause.to_dict() for cause in self.causes]}

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON (written to ``path`` too when given)."""
        text = json.dumps(self.to_dict(), indent=2, default=str)
        if path is not None:
            with open(path, "w", encoding="utf-8") as file:
                file.write(text + "\n")
        return text


def environment(device: torch.device | None = None) -> dict[str, Any]:
    """What the report was measured on: torch's and this library's versions, deterministic mode, and the device the
    candidate ran on (``"cpu"`` by default) with its name and the CUDA or ROCm version of torch's build."""
    import platform

    where = torch.device("cpu") if device is None else device
    env: dict[str, Any] = {"torch": torch.__version__, "typed_transformer": importlib.metadata.version(
        "typed-transformer"), "deterministic": torch.are_deterministic_algorithms_enabled(), "device": str(where)}
    if where.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(where)
        env["cuda"], env["rocm"] = torch.version.cuda, getattr(torch.version, "hip", None)
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env
