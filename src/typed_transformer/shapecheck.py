"""The project's one shape-checking mechanism: jaxtyping + beartype at every public boundary.

Every public function and every ``forward`` in typed_transformer carries jaxtyping annotations such as
``Float[Tensor, "b h t d"]``. :func:`typechecked` (for functions) and :func:`shape_checked` (for
``nn.Module`` classes) turn those annotations into checks that run at the call, before any computation.

A failed check raises :class:`ShapeError`, a subclass of ``jaxtyping.TypeCheckError``, whose first line
names the function, the argument, the axis and both sizes::

    typed_transformer.scaled_dot_product_attention(): k: axis d is 7, expected 8 (bound by q)

Design decisions (measured in the project notes, ``shared/notes/shape-checking.md``):

* Checks are applied by re-binding (functions) or by a class decorator (modules), never by a decorator
  on the function itself, because mutmut does not mutate decorated functions.
* String annotations (``from __future__ import annotations``) are resolved against the *original*
  function's globals at decoration time; otherwise a ``functools.wraps`` wrapper from another module
  (mutmut's trampoline, say) makes jaxtyping resolve them against the wrong globals and silently
  skip the check.
* While ``torch.compile`` traces, checks are skipped: Dynamo mis-evaluates jaxtyping's ``isinstance``
  (pytorch/pytorch#122093). Eager calls are always checked.
* Each function's annotations are also compiled once into a plan that checks a call in a few
  microseconds instead of jaxtyping + beartype's 30-100; the plan only ever passes what jaxtyping would
  pass, and anything it rejects (or does not model) goes through jaxtyping + beartype, which decide and
  explain. ``property_tests/test_fast_path.py`` compares the two paths on random calls.
* Checks can be switched off for speed with ``JAXTYPING_DISABLE=1`` in the environment, or at run time
  with :func:`set_shape_checks` / the :func:`shape_checks` context manager.
"""

import contextlib
import contextvars
import functools
import inspect
import os
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, ParamSpec, TypeVar, Union

import torch
from beartype import BeartypeConf, beartype
from beartype.door import is_bearable
from jaxtyping import AbstractArray, TypeCheckError, jaxtyped
from jaxtyping import _array_types as jaxtyping_array_types

__all__ = [
    "ShapeError",
    "checks_enabled",
    "is_checked",
    "raise_shape_error",
    "set_shape_checks",
    "shape_checked",
    "shape_checks",
    "shape_trace",
    "typechecked",
]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

_CHECKED_ATTR = "__typed_transformer_checked__"
# `0` is a fine value for a `float` parameter (PEP 484 numeric tower); beartype's default says no.
_TYPECHECKER = beartype(conf=BeartypeConf(is_pep484_tower=True))


def _install_dim_cache() -> None:
    """Let jaxtyping evaluate f-string and symbolic dims (``"{self.d_model}"``, ``"t+1"``) from cached code.

    jaxtyping's ``_check_dims`` calls ``eval`` on the same few strings at every call, compiling them anew
    each time (~13 us each; a GPT forward evaluates about 80). Giving its module an ``eval`` that compiles
    each string once makes the same checks about twice as cheap. The result is identical by construction;
    if a jaxtyping version no longer has that module, nothing is patched.
    """
    try:
        from jaxtyping import _array_types
    except ImportError:  # pragma: no cover - layout of another jaxtyping version
        return
    if not hasattr(_array_types, "_check_dims"):  # pragma: no cover
        return
    compiled: dict[str, types.CodeType] = {}
    builtin_eval = eval

    def cached_eval(source: Any, globals_: Any = None, locals_: Any = None) -> Any:
        if isinstance(source, str):
            code = compiled.get(source)
            if code is None:
                code = compiled[source] = compile(source, "<jaxtyping dim>", "eval")
            return builtin_eval(code, globals_, locals_)
        return builtin_eval(source, globals_, locals_)

    _array_types.eval = cached_eval  # type: ignore[attr-defined]


_install_dim_cache()


def _env_disabled() -> bool:
    return os.environ.get("JAXTYPING_DISABLE", "").strip().lower() in {"1", "true", "yes", "on"}


_enabled: bool = not _env_disabled()
# The compiled fast path (see _Plan); switched off only to compare it with jaxtyping + beartype in tests.
_fast_path: bool = True
# Per-context suspension, for loops inside the library whose shapes the library itself built (generation
# steps after the checked prefill); unlike set_shape_checks it does not affect other threads.
_SUSPENDED: contextvars.ContextVar[bool] = contextvars.ContextVar("typed_transformer_suspended", default=False)


def checks_enabled() -> bool:
    """Whether shape checks run on eager calls (they never run while ``torch.compile`` traces)."""
    return _enabled


def set_shape_checks(enabled: bool) -> bool:
    """Switch shape checks on or off for the whole process; returns the previous setting.

    Off, a checked call costs one flag test (well under a microsecond). ``JAXTYPING_DISABLE=1`` in the
    environment starts the process with checks off.
    """
    global _enabled
    previous = _enabled
    _enabled = bool(enabled)
    return previous


@contextlib.contextmanager
def suspended_checks() -> Iterator[None]:
    """Skip checks in this context (thread, task) only; for library-internal loops, not for users."""
    token = _SUSPENDED.set(True)
    try:
        yield
    finally:
        _SUSPENDED.reset(token)


@contextlib.contextmanager
def shape_checks(enabled: bool) -> Iterator[None]:
    """Context manager: ``with shape_checks(False): model(x)`` runs without checks, then restores."""
    previous = set_shape_checks(enabled)
    try:
        yield
    finally:
        set_shape_checks(previous)


def is_checked(fn: object) -> bool:
    """True when ``fn`` (a function or a bound method) went through :func:`typechecked`."""
    return bool(getattr(inspect.unwrap(fn, stop=lambda f: hasattr(f, _CHECKED_ATTR)),  # type: ignore[arg-type]
                        _CHECKED_ATTR, False))


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------


class ShapeError(TypeCheckError):
    """A tensor argument has the wrong shape or dtype.

    Subclass of ``jaxtyping.TypeCheckError``, so ``except jaxtyping.TypeCheckError`` catches it. The
    attributes say what was wrong; ``str(err)`` starts with a one-line summary.

    Attributes:
        function: qualified name of the checked function.
        argument: the parameter that failed (``"return value"`` for a bad return).
        reason: the one-line reason after ``"<argument>: "``.
        axis: the axis name that disagreed, or None for dtype/rank/type problems.
        actual: the size the argument had on that axis, or None.
        expected: the size that was expected, or None.
        bound_by: the argument that bound the axis first (or the attribute for ``{self.x}`` axes).
    """

    def __init__(
        self,
        function: str,
        argument: str,
        reason: str,
        *,
        axis: str | None = None,
        actual: int | None = None,
        expected: int | None = None,
        bound_by: str | None = None,
        details: str = "",
    ) -> None:
        self.function = function
        self.argument = argument
        self.reason = reason
        self.axis = axis
        self.actual = actual
        self.expected = expected
        self.bound_by = bound_by
        self.summary = f"{function}(): {argument}: {reason}"
        super().__init__(self.summary + (("\n" + details) if details else ""))


def raise_shape_error(function: str, argument: str, reason: str, **kwargs: Any) -> typing.NoReturn:
    """Raise a :class:`ShapeError` for a constraint that annotations cannot express (e.g. h % g)."""
    raise ShapeError(function, argument, reason, **kwargs)


# ----------------------------------------------------------------------------------------------------
# Explaining a failed check (and binding sizes for the trace) with our own walk over the annotations
# ----------------------------------------------------------------------------------------------------

_DTYPE_WORDS = {
    "Bool": "bool",
    "Float": "a floating-point dtype",
    "Int": "a signed integer dtype",
    "Integer": "an integer dtype",
    "UInt": "an unsigned integer dtype",
    "Num": "a numeric dtype",
    "Real": "a real dtype",
    "Inexact": "a floating-point or complex dtype",
    "Complex": "a complex dtype",
}


def _short_dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(value: object) -> str:
    """Compact description of a value: ``f32[2,4,16,8]`` for tensors, the repr otherwise."""
    if isinstance(value, torch.Tensor):
        names = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
                 torch.bool: "bool", torch.int64: "i64", torch.int32: "i32", torch.uint8: "u8"}
        name = names.get(value.dtype, _short_dtype(value.dtype))
        return f"{name}[{','.join(str(s) for s in value.shape)}]"
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _array_alternatives(hint: Any) -> tuple[list[type[AbstractArray]], list[object]]:
    """Split a hint into its jaxtyping array alternatives and the rest (None, int, ...)."""
    origin = typing.get_origin(hint)
    alternatives = typing.get_args(hint) if origin in (Union, types.UnionType) else (hint,)
    arrays = [a for a in alternatives if isinstance(a, type) and issubclass(a, AbstractArray)]
    others = [a for a in alternatives if a not in arrays]
    return arrays, others


def _axis_label(elem: str) -> str:
    """``{self.d_model}`` -> ``d_model``; symbolic expressions are shown as written."""
    if elem.startswith("{") and elem.endswith("}") and elem.count("{") == 1:
        return elem[1:-1].split(".")[-1]
    return elem


@dataclass
class _Memo:
    """Axis sizes bound so far in one call, with the argument that bound each."""

    sizes: dict[str, int] = field(default_factory=dict)
    binders: dict[str, str] = field(default_factory=dict)


@dataclass
class _Problem:
    reason: str
    axis: str | None = None
    actual: int | None = None
    expected: int | None = None
    bound_by: str | None = None
    score: int = 0  # how far the value got before failing; used to pick the alternative to report


def _check_array(hint: type[AbstractArray], value: torch.Tensor, memo: _Memo, argname: str,
                 arguments: dict[str, Any]) -> _Problem | None:
    dtype_name = repr(value.dtype).rsplit(".", 1)[-1]
    dtypes = getattr(hint, "dtypes", None)
    category = getattr(getattr(hint, "dtype", None), "__name__", "")
    if isinstance(dtypes, list | tuple) and dtype_name not in dtypes:
        wanted = _DTYPE_WORDS.get(category, f"one of {', '.join(map(str, dtypes))}")
        return _Problem(f"dtype is {dtype_name}, expected {wanted}", score=0)
    dims: list[Any] = list(hint.dims)
    variadic = [d for d in dims if not hasattr(d, "broadcastable") or type(d).__name__ == "_NamedVariadicDim"]
    if variadic:
        if value.ndim < len(dims) - 1:
            return _Problem(f"has {value.ndim} axes {tuple(value.shape)}, expected at least {len(dims) - 1} "
                            f"'{hint.dim_str}'", score=1)
        return None  # variadic shapes are left to jaxtyping itself
    if value.ndim != len(dims):
        return _Problem(f"has {value.ndim} axes {tuple(value.shape)}, expected {len(dims)} '{hint.dim_str}'",
                        score=1)
    for index, (dim, size) in enumerate(zip(dims, value.shape, strict=True)):
        kind = type(dim).__name__
        if kind == "_AnonymousDim" or (getattr(dim, "broadcastable", False) and size == 1):
            continue
        if kind == "_FixedDim":
            if dim.size != size:
                return _Problem(f"axis {index} is {size}, expected {dim.size} ('{hint.dim_str}')",
                                axis=str(index), actual=size, expected=dim.size, score=2 + index)
        elif kind == "_SymbolicDim":
            try:
                expr = eval(f"f'{dim.elem}'", dict(arguments))
                expected = eval(expr, dict(memo.sizes))
            except Exception:
                continue
            if expected != size:
                label = _axis_label(dim.elem)
                source = dim.elem.strip("{}") if label != dim.elem else f"{expr}"
                return _Problem(f"axis {label} is {size}, expected {expected} ({source})",
                                axis=label, actual=size, expected=int(expected), bound_by=source,
                                score=2 + index)
        elif kind == "_NamedDim":
            if dim.name in memo.sizes:
                if memo.sizes[dim.name] != size:
                    binder = memo.binders[dim.name]
                    return _Problem(
                        f"axis {dim.name} is {size}, expected {memo.sizes[dim.name]} (bound by {binder})",
                        axis=dim.name, actual=size, expected=memo.sizes[dim.name], bound_by=binder,
                        score=2 + index)
            else:
                memo.sizes[dim.name] = size
                memo.binders[dim.name] = argname
    return None


def _check_value(hint: Any, value: Any, memo: _Memo, argname: str,
                 arguments: dict[str, Any]) -> _Problem | None:
    arrays, others = _array_alternatives(hint)
    if not arrays:
        if is_bearable(value, hint):
            return None
        return _Problem(f"expected {_hint_text(hint)}, got {type(value).__name__} {describe(value)}")
    if value is None and type(None) in others:
        return None
    if not isinstance(value, torch.Tensor):
        fits_other: bool = bool(others) and is_bearable(value, Union[tuple(others)])  # type: ignore[arg-type]  # noqa: UP007
        if fits_other:
            return None
        return _Problem(f"expected a tensor {' or '.join(repr(a.dim_str) for a in arrays)}, "
                        f"got {type(value).__name__} {describe(value)}")
    problems: list[_Problem] = []
    for alternative in arrays:
        trial = _Memo(dict(memo.sizes), dict(memo.binders))
        problem = _check_array(alternative, value, trial, argname, arguments)
        if problem is None:
            memo.sizes, memo.binders = trial.sizes, trial.binders
            return None
        problems.append(problem)
    if len(arrays) > 1 and all(p.score <= 1 for p in problems):
        # None of the alternatives has the right rank/dtype: list them all.
        shapes = " or ".join(dict.fromkeys(repr(a.dim_str) for a in arrays))
        kinds = " or ".join(dict.fromkeys(_DTYPE_WORDS.get(a.dtype.__name__, a.dtype.__name__) for a in arrays))
        return _Problem(f"is {describe(value)}, expected {shapes} of {kinds}")
    return max(problems, key=lambda p: p.score)


def _hint_text(hint: object) -> str:
    return getattr(hint, "__name__", None) or repr(hint).replace("typing.", "")


def _qualname(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", "") or ""
    qual = getattr(fn, "__qualname__", getattr(fn, "__name__", "<function>"))
    return f"{module}.{qual}" if module and module != "__main__" else qual


def _call_details(hints: dict[str, Any], arguments: dict[str, Any]) -> str:
    lines = []
    for name, value in arguments.items():
        if name == "self" or name not in hints or value is None:
            continue
        arrays, _ = _array_alternatives(hints[name])
        if not arrays and not isinstance(value, torch.Tensor):
            continue
        spec = " | ".join(dict.fromkeys(repr(a.dim_str) for a in arrays))
        lines.append(f"  {name}: {describe(value)}" + (f"  as {spec}" if spec else ""))
    return "\n".join(lines)


def _explain(fn: Callable[..., Any], sig: inspect.Signature, hints: dict[str, Any], args: Any, kwargs: Any,
             err: TypeCheckError) -> ShapeError:
    name = _qualname(fn)
    text = str(err)
    try:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
    except TypeError:
        arguments = {}
    details = _call_details(hints, arguments)
    if "checking the return value" not in text:
        memo = _Memo()
        for argname, value in arguments.items():
            if argname not in hints:
                continue
            problem = _check_value(hints[argname], value, memo, argname, arguments)
            if problem is not None:
                return ShapeError(name, argname, problem.reason, axis=problem.axis, actual=problem.actual,
                                  expected=problem.expected, bound_by=problem.bound_by, details=details)
    # Fall back on jaxtyping's own words: the innermost beartype violation carries the reason.
    argument = "return value"
    marker = "typechecking parameter '"
    if marker in text:
        argument = text.split(marker, 1)[1].split("'", 1)[0]
    reason = ""
    cause: BaseException | None = err
    while cause is not None:
        message = str(cause)
        if ", as " in message and "violates type hint" in message:
            reason = message.rsplit(", as ", 1)[1].strip().rstrip(".")
        cause = cause.__cause__ or cause.__context__
    return ShapeError(name, argument, reason or text.splitlines()[0], details=details)


def _return_error(fn: Callable[..., Any], sig: inspect.Signature, hints: dict[str, Any], args: Any, kwargs: Any,
                  out: Any) -> ShapeError:
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    memo = _Memo()
    for argname, value in arguments.items():
        if argname in hints and argname != "return":
            _check_value(hints[argname], value, memo, argname, arguments)
    problem = _check_return(hints["return"], out, memo, arguments)
    details = _call_details(hints, arguments) + f"\n  return value: {describe(out)}"
    if problem is None:
        return ShapeError(_qualname(fn), "return value", f"is {describe(out)}, expected {_hint_text(hints['return'])}",
                          details=details)
    return ShapeError(_qualname(fn), "return value", problem.reason, axis=problem.axis, actual=problem.actual,
                      expected=problem.expected, bound_by=problem.bound_by, details=details)


def _check_return(hint: Any, out: Any, memo: _Memo, arguments: dict[str, Any]) -> _Problem | None:
    """Explain a bad return value, looking into fixed-length tuples element by element."""
    if typing.get_origin(hint) is tuple and isinstance(out, tuple):
        parts = typing.get_args(hint)
        if len(parts) != len(out):
            return _Problem(f"is a tuple of {len(out)}, expected {len(parts)}")
        for index, (part, value) in enumerate(zip(parts, out, strict=True)):
            problem = _check_value(part, value, memo, f"return value[{index}]", arguments)
            if problem is not None:
                problem.reason = f"element {index}: {problem.reason}"
                return problem
        return None
    return _check_value(hint, out, memo, "return value", arguments)


# ----------------------------------------------------------------------------------------------------
# Shape trace
# ----------------------------------------------------------------------------------------------------


@dataclass
class _Tracer:
    stream: IO[str]
    depth: int = 0


_TRACE: contextvars.ContextVar[_Tracer | None] = contextvars.ContextVar("typed_transformer_trace",
                                                                       default=None)


@contextlib.contextmanager
def shape_trace(file: IO[str] | None = None) -> Iterator[None]:
    """Print every checked call made inside the block, with the sizes its axes were bound to.

    Calls are nested by depth; each call's line is followed by the shape of what it returned::

        >>> with shape_trace():
        ...     mha(x)
        MultiHeadAttention.forward(query=f32[30,5,1024])  b=30 t=5 input_dim=1024
          scaled_dot_product_attention(q=f32[30,8,5,64], k=f32[30,8,5,64], v=f32[30,8,5,64])  b=30 h=8 ...
          -> f32[30,8,5,64]
        -> (f32[30,5,512], None)

    Checks still run while tracing (and are switched on for the block if they were off).
    """
    token = _TRACE.set(_Tracer(file if file is not None else sys.stdout))
    previous = set_shape_checks(True)
    try:
        yield
    finally:
        set_shape_checks(previous)
        _TRACE.reset(token)


def _bound_sizes(hints: dict[str, Any], arguments: dict[str, Any]) -> dict[str, int]:
    memo = _Memo()
    for argname, value in arguments.items():
        if argname in hints and isinstance(value, torch.Tensor):
            _check_value(hints[argname], value, memo, argname, arguments)
    sizes = dict(memo.sizes)
    # f-string axes ({self.d_model}) are not in the memo: show them by their attribute name.
    for argname, value in arguments.items():
        if argname not in hints or not isinstance(value, torch.Tensor):
            continue
        for alternative in _array_alternatives(hints[argname])[0]:
            if len(alternative.dims) != value.ndim:
                continue
            for dim, size in zip(alternative.dims, value.shape, strict=True):
                elem = getattr(dim, "elem", None)
                if isinstance(elem, str) and _axis_label(elem) != elem:
                    sizes.setdefault(_axis_label(elem), size)
            break
    return sizes


def _traced_call(tracer: _Tracer, fn: Callable[..., Any], checked: Callable[..., Any], sig: inspect.Signature,
                 hints: dict[str, Any], args: Any, kwargs: Any) -> Any:
    bound = sig.bind(*args, **kwargs)
    tensors = {k: v for k, v in bound.arguments.items() if k != "self" and isinstance(v, torch.Tensor)}
    bound.apply_defaults()
    sizes = _bound_sizes(hints, dict(bound.arguments))
    label = getattr(fn, "__qualname__", getattr(fn, "__name__", "?"))
    call = ", ".join(f"{k}={describe(v)}" for k, v in tensors.items())
    axes = " ".join(f"{k}={v}" for k, v in sizes.items())
    indent = "  " * tracer.depth
    print(f"{indent}{label}({call})" + (f"  {axes}" if axes else ""), file=tracer.stream)
    tracer.depth += 1
    try:
        out = checked(*args, **kwargs)
    finally:
        tracer.depth -= 1
    print(f"{indent}-> {describe(out)}", file=tracer.stream)
    return out


# ----------------------------------------------------------------------------------------------------
# Applying the checks
# ----------------------------------------------------------------------------------------------------


def _resolve_annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolve string annotations against the original function's globals, in place.

    With ``from __future__ import annotations`` the annotations are strings; jaxtyping resolves them
    against the globals of whatever wrapper it is handed, which is wrong for wrappers defined in another
    module and silently turns the check off. Resolving here makes the check independent of wrappers.
    """
    original = inspect.unwrap(fn)
    annotations: dict[str, Any] = getattr(fn, "__annotations__", {})
    if any(isinstance(v, str) for v in annotations.values()):
        resolved = typing.get_type_hints(original, include_extras=True)
        for key in list(annotations):
            if key in resolved:
                annotations[key] = resolved[key]
    return dict(annotations)


# ----------------------------------------------------------------------------------------------------
# The fast path: the same rules, compiled once per function
# ----------------------------------------------------------------------------------------------------
#
# jaxtyping + beartype cost 30-100 us per call (signature binding, a memo stack, isinstance on array
# types, beartype's checker lookup), which adds up to ~2 ms over the ~18 checked calls of a small GPT
# forward. A plan compiles a function's annotations once into tuples and checks a call in a few
# microseconds. It only ever says "passes" when jaxtyping would: anything it does not model exactly
# (variadic dims, tree paths, mixed unions, unusual hints) disables the plan for that function, and
# any failure it finds is re-checked by jaxtyping + beartype, whose verdict and error are the ones
# raised. property_tests/test_fast_path.py calls the same functions with random arguments through both
# paths and requires the same verdict and message.

_ANON, _FIXED, _NAMED, _ATTR, _SYMBOLIC = range(5)
# jaxtyping's marker for "any dtype" (Shaped); with another jaxtyping layout such hints take the full check.
_ANY_DTYPE = getattr(jaxtyping_array_types, "_any_dtype", object())
_NOT_GIVEN = object()
_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = repr(dtype).rsplit(".", 1)[-1]  # jaxtyping's spelling
    return name


_Dim = tuple[int, Any, bool]  # (kind, payload, broadcastable)
_Alternative = tuple[frozenset[str] | None, tuple[_Dim, ...]]  # (dtype names or None = any, dims)


class _Unsupported(Exception):
    """An annotation the fast path does not model; the function keeps the full check only."""


def _compile_dim(dim: Any) -> _Dim:
    kind = type(dim).__name__
    broadcastable = bool(getattr(dim, "broadcastable", False))
    if kind == "_AnonymousDim":
        return (_ANON, None, False)
    if kind == "_FixedDim":
        return (_FIXED, dim.size, broadcastable)
    if kind == "_NamedDim" and not dim.treepath:
        return (_NAMED, dim.name, broadcastable)
    if kind == "_SymbolicDim" and isinstance(dim.elem, str):
        elem = dim.elem
        inner = elem[1:-1]
        if elem.startswith("{self.") and elem.endswith("}") and inner[5:].isidentifier():
            return (_ATTR, inner[5:], broadcastable)  # "{self.d_model}": one getattr, no eval
        return (_SYMBOLIC, compile(f"f'{elem}'", "<jaxtyping dim>", "eval"), broadcastable)
    raise _Unsupported(kind)


def _compile_array_hint(hint: Any) -> tuple[tuple[_Alternative, ...], bool] | None:
    """``(alternatives, None allowed)`` for a hint made of jaxtyping tensor types (and None); None if the
    hint has no array alternative. Raises _Unsupported for what the fast path does not model."""
    arrays, others = _array_alternatives(hint)
    if not arrays:
        return None
    if any(other is not type(None) for other in others):
        raise _Unsupported("array or something else")
    alternatives = []
    for array in arrays:
        if array.array_type is not torch.Tensor or array.index_variadic is not None:
            raise _Unsupported("not a plain tensor shape")
        dtypes: Any = array.dtypes  # a sequence of names, or jaxtyping's "any dtype" marker
        names: frozenset[str] | None
        if dtypes is _ANY_DTYPE:
            names = None
        elif isinstance(dtypes, list | tuple) and all(isinstance(d, str) for d in dtypes):
            names = frozenset(dtypes)
        else:
            raise _Unsupported("dtype pattern")
        alternatives.append((names, tuple(_compile_dim(d) for d in array.dims)))
    return tuple(alternatives), type(None) in others


def _compile_simple_hint(hint: Any) -> Callable[[Any], bool]:
    """A predicate at least as strict as beartype's for the plain hints the library uses."""
    if hint is Any:
        return lambda value: True
    if hint is float:  # PEP 484 tower, as configured for beartype: int is a float
        return lambda value: isinstance(value, int | float)
    if hint is complex:
        raise _Unsupported("complex")
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        return lambda value: any(value is a or (type(value) is type(a) and value == a) for a in allowed)
    if origin in (Union, types.UnionType):
        parts = [_compile_simple_hint(a) for a in typing.get_args(hint)]
        return lambda value: any(part(value) for part in parts)
    if isinstance(hint, type) and origin is None:
        return lambda value: isinstance(value, hint)
    if origin in (list, tuple) and isinstance(hint, types.GenericAlias):
        args = typing.get_args(hint)
        if origin is list and len(args) == 1:
            item = _compile_simple_hint(args[0])
            return lambda value: isinstance(value, list) and all(item(v) for v in value)
    raise _Unsupported(repr(hint))


@dataclass
class _Plan:
    positional: tuple[str, ...]  # names of the parameters that can be passed by position, in order
    names: frozenset[str]
    defaults: dict[str, Any]
    arrays: tuple[tuple[str, tuple[_Alternative, ...], bool], ...]
    simple: tuple[tuple[str, Callable[[Any], bool]], ...]
    returns: Any  # None: no check; ("array", alternatives, none_ok) or ("tuple", [parts])

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        if len(args) > len(self.positional):
            return None
        values = dict(zip(self.positional, args, strict=False))
        for name, value in kwargs.items():
            if name in values or name not in self.names:
                return None  # let the full path raise Python's own TypeError
            values[name] = value
        return values

    def check_params(self, values: dict[str, Any]) -> dict[str, int] | None:
        """The axis sizes bound by the arguments, or None when anything is (or might be) wrong."""
        memo: dict[str, int] = {}
        for name, test in self.simple:
            if name in values and not test(values[name]):
                return None
        for name, alternatives, none_ok in self.arrays:
            value = values.get(name, _NOT_GIVEN)
            if value is _NOT_GIVEN:
                value = self.defaults.get(name)
            if value is None:
                if none_ok:
                    continue
                return None
            if not _fits(value, alternatives, memo, values, self.defaults):
                return None
        return memo

    def check_return(self, out: Any, memo: dict[str, int], values: dict[str, Any]) -> bool:
        if self.returns is None:
            return True
        if self.returns[0] == "none":
            return out is None
        if self.returns[0] == "array":
            return _fits_or_none(out, self.returns[1], self.returns[2], memo, values, self.defaults)
        parts = self.returns[1]
        if not isinstance(out, tuple) or len(out) != len(parts):
            return False
        return all(_fits_or_none(o, alts, none_ok, memo, values, self.defaults)
                   for o, (alts, none_ok) in zip(out, parts, strict=True))


def _fits_or_none(value: Any, alternatives: tuple[_Alternative, ...], none_ok: bool, memo: dict[str, int],
                  values: dict[str, Any], defaults: dict[str, Any]) -> bool:
    if value is None:
        return none_ok
    return _fits(value, alternatives, memo, values, defaults)


def _fits(value: Any, alternatives: tuple[_Alternative, ...], memo: dict[str, int], values: dict[str, Any],
          defaults: dict[str, Any]) -> bool:
    """jaxtyping's isinstance over a union of tensor types: the first alternative that fits binds its
    axes into ``memo``; a failed alternative binds nothing."""
    if not isinstance(value, torch.Tensor):
        return False
    shape = value.shape
    dtype = _DTYPE_NAMES.get(value.dtype) or _dtype_name(value.dtype)
    for dtypes, dims in alternatives:
        if (dtypes is not None and dtype not in dtypes) or len(dims) != len(shape):
            continue
        added: list[str] = []  # axes this alternative bound: unbound again if it fails
        for (kind, payload, broadcastable), size in zip(dims, shape, strict=True):
            if kind == _ANON or (broadcastable and size == 1):
                continue
            if kind == _NAMED:
                bound = memo.get(payload)
                if bound is None:
                    memo[payload] = size
                    added.append(payload)
                elif bound != size:
                    break
            elif kind == _FIXED:
                if payload != size:
                    break
            elif kind == _ATTR:
                owner = values.get("self")
                if owner is None or getattr(owner, payload, None) != size:
                    break
            else:
                try:
                    text = eval(payload, {**defaults, **values})  # the f-string, as jaxtyping does
                    expected = eval(_compiled_expression(text), dict(memo))
                except Exception:
                    break
                if expected != size:
                    break
        else:
            return True
        for name in added:
            del memo[name]
    return False


@functools.lru_cache(maxsize=1024)
def _compiled_expression(text: str) -> types.CodeType:
    return compile(text, "<jaxtyping dim>", "eval")


def _make_plan(sig: inspect.Signature, hints: dict[str, Any]) -> _Plan | None:
    """The fast-path plan of a function, or None when it must always take the full check."""
    try:
        positional: list[str] = []
        defaults: dict[str, Any] = {}
        arrays = []
        simple = []
        for name, param in sig.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise _Unsupported("*args/**kwargs")
            if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                positional.append(name)
            if param.default is not param.empty:
                defaults[name] = param.default
            if name not in hints:
                continue
            compiled = _compile_array_hint(hints[name])
            if compiled is None:
                simple.append((name, _compile_simple_hint(hints[name])))
            else:
                arrays.append((name, *compiled))
        returns: Any = None
        hint = hints.get("return", inspect.Signature.empty)
        if hint is None or hint is type(None):
            returns = ("none",)
        elif hint is not inspect.Signature.empty:
            if typing.get_origin(hint) is tuple and ... not in typing.get_args(hint):
                parts = []
                for part in typing.get_args(hint):
                    compiled = _compile_array_hint(part)
                    if compiled is None:
                        raise _Unsupported("non-tensor tuple element")
                    parts.append(compiled)
                returns = ("tuple", tuple(parts))
            else:
                compiled = _compile_array_hint(hint)
                if compiled is None:
                    raise _Unsupported("non-tensor return")
                returns = ("array", *compiled)
        return _Plan(tuple(positional), frozenset(sig.parameters), defaults, tuple(arrays), tuple(simple), returns)
    except _Unsupported:
        return None


def typechecked(fn: Callable[P, R]) -> Callable[P, R]:
    """Return ``fn`` with its jaxtyping annotations checked at every eager call.

    Apply it by re-binding, not as a decorator (mutmut skips decorated functions)::

        def scaled_dot_product_attention(q: Float[Tensor, "b h t d"], ...) -> Float[Tensor, "b h t dv"]: ...
        scaled_dot_product_attention = typechecked(scaled_dot_product_attention)
    """
    if getattr(fn, _CHECKED_ATTR, False):
        return fn
    hints = _resolve_annotations(fn)
    sig = inspect.signature(fn)
    own_prefix = f"{fn.__module__}.{fn.__qualname__}."
    returns = hints.get("return", inspect.Signature.empty)

    # jaxtyping re-checks every parameter together with the return value, doubling the cost of a call.
    # Instead the return value is checked here, inside the body that jaxtyping calls: its memo of axis
    # sizes (bound by the parameters) is still the current one, so the return shares the parameters' axes.
    def body(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if returns is not inspect.Signature.empty and not is_bearable(out, returns):
            raise _return_error(fn, sig, hints, args, kwargs, out)
        return out

    body.__signature__ = sig.replace(return_annotation=inspect.Signature.empty)  # type: ignore[attr-defined]
    body.__annotations__ = {k: v for k, v in hints.items() if k != "return"}
    body.__name__, body.__qualname__, body.__module__ = fn.__name__, fn.__qualname__, fn.__module__
    checked = jaxtyped(typechecker=_TYPECHECKER)(body)
    plan = _make_plan(sig, hints)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if torch.compiler.is_compiling() or not _enabled:
            return fn(*args, **kwargs)
        tracer = _TRACE.get()
        if tracer is None:
            if _SUSPENDED.get():
                return fn(*args, **kwargs)
            if plan is not None and _fast_path:
                values = plan.arguments(args, kwargs)
                memo = None if values is None else plan.check_params(values)
                if values is not None and memo is not None:
                    out = fn(*args, **kwargs)
                    if plan.check_return(out, memo, values):
                        return out
                    # A wrong return is a bug in the function, not in the call; it cannot be re-run (side
                    # effects), so it is explained by the same walk the full path uses for its errors.
                    raise _return_error(fn, sig, hints, args, kwargs, out)
                # Otherwise something is, or might be, wrong: jaxtyping and beartype decide and explain.
        try:
            if tracer is not None:
                return typing.cast(R, _traced_call(tracer, fn, checked, sig, hints, args, kwargs))
            return typing.cast(R, checked(*args, **kwargs))
        except ShapeError:
            raise
        except TypeCheckError as err:
            if own_prefix not in str(err).split("\n", 1)[0] + ".":
                raise  # a check inside the body, not ours
            raise _explain(fn, sig, hints, args, kwargs, err) from err

    setattr(wrapper, _CHECKED_ATTR, True)
    return wrapper


def shape_checked(cls: C) -> C:
    """Class decorator: check ``forward`` (for ``nn.Module`` subclasses) and any other method listed in
    the class attribute ``__shape_checked__``.

    A class decorator keeps the methods themselves undecorated, so mutation testing still mutates them.
    """
    names = ("forward", *getattr(cls, "__shape_checked__", ()))
    for name in names:
        method = cls.__dict__.get(name)
        if method is None:
            continue
        if isinstance(method, staticmethod | classmethod):
            raise TypeError(f"shape_checked: {cls.__name__}.{name} must be a plain method")
        setattr(cls, name, typechecked(method))
    return cls
