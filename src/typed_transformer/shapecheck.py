"""The project's one shape-checking mechanism: jaxtyping + beartype at the boundary the user calls.

Every public function and every ``forward`` in typed_transformer carries jaxtyping annotations such as
``Float[Tensor, "b h t d"]``. :func:`typechecked` (for functions) and :func:`shape_checked` (for
``nn.Module`` classes) check those annotations at the call, before any computation, with
``jaxtyping.jaxtyped(typechecker=beartype)``: jaxtyping and beartype decide, and only they.

A rejected call raises :class:`ShapeError`, a subclass of ``jaxtyping.TypeCheckError``, whose first line
names the function, the argument, the axis and both sizes::

    typed_transformer.attention.scaled_dot_product_attention(): k: axis d is 7, expected 8 (bound by q)

The explanation is written by this module *after* jaxtyping has rejected the call (it costs nothing on the
happy path). It reads the annotation's own text (``dim_str``) to say which axis disagreed; when it cannot
explain a rejection, or would name another argument than jaxtyping did, the ``ShapeError`` carries
jaxtyping's own words instead, never a wrong explanation.

Where checks run (the two modes):

* **Default**: a checked function called from user code is checked. Calls the library makes to itself
  while inside a checked call (``GPT`` -> blocks -> attention -> core) are not checked again: their shapes
  follow from the outer check. Checks written in a body (``raise_shape_error``, e.g. a cache whose sizes
  do not match) run in both modes, so what a user hands in is checked where it enters.
* **Strict**: every nested call is checked too. ``TYPED_TRANSFORMER_STRICT=1`` in the environment,
  :func:`set_strict_checks` or the :func:`strict_checks` context manager. The project's test suite runs
  in strict mode, so an internal shape bug is still caught by our tests.

:func:`shape_trace` prints (and checks) every nested call whatever the mode.

The one switch: ``jaxtyping.config`` (``JAXTYPING_DISABLE=1`` in the environment, or
``jaxtyping.config.update("jaxtyping_disable", True)``) is the single source of truth;
:func:`set_shape_checks` and :func:`shape_checks` read and write that same setting, so the two can never
disagree.

Design decisions (measured when the checks were designed):

* Checks are applied by re-binding (functions) or by a class decorator (modules), never by a decorator
  on the function itself, because mutmut does not mutate decorated functions.
* String annotations (``from __future__ import annotations``) are resolved against the *original*
  function's globals at decoration time; otherwise a ``functools.wraps`` wrapper from another module
  (mutmut's trampoline, say) makes jaxtyping resolve them against the wrong globals and silently
  skip the check.
* While ``torch.compile`` traces, checks are skipped: Dynamo mis-evaluates jaxtyping's ``isinstance``
  (pytorch/pytorch#122093). Eager calls are checked as described above.
"""

import contextlib
import contextvars
import functools
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar, Union

import jaxtyping
import torch
from beartype import BeartypeConf, beartype
from beartype.door import is_bearable
from jaxtyping import AbstractArray, TypeCheckError, jaxtyped

__all__ = [
    "ShapeError",
    "checks_enabled",
    "is_checked",
    "raise_shape_error",
    "set_shape_checks",
    "set_strict_checks",
    "shape_checked",
    "shape_checks",
    "shape_trace",
    "strict_checks",
    "strict_checks_enabled",
    "typechecked",
]

C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])

_CHECKED_ATTR = "__typed_transformer_checked__"
# `0` is a fine value for a `float` parameter (PEP 484 numeric tower); beartype's default says no.
_TYPECHECKER = beartype(conf=BeartypeConf(is_pep484_tower=True))
STRICT_ENV = "TYPED_TRANSFORMER_STRICT"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


_strict: bool = _env_flag(STRICT_ENV)
# True while a checked call of this context (thread, task) is running: nested library calls skip the check.
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("typed_transformer_inside", default=False)


def checks_enabled() -> bool:
    """Whether shape checks run on eager calls: ``not jaxtyping.config.jaxtyping_disable``.

    They never run while ``torch.compile`` traces.
    """
    return not jaxtyping.config.jaxtyping_disable


def set_shape_checks(enabled: bool) -> bool:
    """Switch shape checks on or off for the whole process; returns the previous setting.

    This writes jaxtyping's own switch (``jaxtyping.config.update("jaxtyping_disable", not enabled)``), the
    one ``JAXTYPING_DISABLE=1`` sets at start-up, so it also switches any other jaxtyping checks in the
    process. Off, a checked call costs one flag test (well under a microsecond).
    """
    previous = checks_enabled()
    jaxtyping.config.update("jaxtyping_disable", not enabled)
    return previous


@contextlib.contextmanager
def shape_checks(enabled: bool) -> Iterator[None]:
    """Context manager: ``with shape_checks(False): model(x)`` runs without checks, then restores."""
    previous = set_shape_checks(enabled)
    try:
        yield
    finally:
        set_shape_checks(previous)


def strict_checks_enabled() -> bool:
    """Whether nested library calls are checked too (strict mode); see the module docstring."""
    return _strict


def set_strict_checks(enabled: bool) -> bool:
    """Switch strict mode on or off for the whole process; returns the previous setting.

    ``TYPED_TRANSFORMER_STRICT=1`` in the environment starts the process in strict mode.
    """
    global _strict
    previous = _strict
    _strict = bool(enabled)
    return previous


@contextlib.contextmanager
def strict_checks(enabled: bool = True) -> Iterator[None]:
    """Context manager: ``with strict_checks(): model(x)`` checks every nested call, then restores."""
    previous = set_strict_checks(enabled)
    try:
        yield
    finally:
        set_strict_checks(previous)


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


def raise_shape_error(function: Callable[..., Any] | str, argument: str, reason: str, **kwargs: Any
                      ) -> typing.NoReturn:
    """Raise a :class:`ShapeError` for a constraint that annotations cannot express (e.g. h % g).

    ``function`` is the function (or method) being called, whose qualified name the error carries, so
    that the name follows a rename; a string is taken as the name itself.
    """
    raise ShapeError(function if isinstance(function, str) else _qualname(function), argument, reason, **kwargs)


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


_Token = tuple[str, Any, bool]  # (kind, payload, broadcastable); kinds below


@functools.lru_cache(maxsize=1024)
def _tokens(dim_str: str) -> tuple[_Token, ...] | None:
    """The axes of an annotation's shape string, for explaining a rejection; None when it has a variadic axis.

    Reads the text as jaxtyping documents it: ``name``, ``#name`` (may be 1), ``_``/``_name`` (anything),
    an integer or ``name=4`` (fixed), anything else an expression (``t+1``, ``{self.d_model}``).
    """
    tokens: list[_Token] = []
    for elem in dim_str.split():
        if "..." in elem or "*" in elem:
            return None
        broadcastable = elem.startswith("#")
        elem = elem.lstrip("#?")
        if elem.startswith("_"):
            tokens.append(("anonymous", None, False))
            continue
        if elem.count("=") == 1:
            elem = elem.split("=")[1]
        if elem.isidentifier():
            tokens.append(("named", elem, broadcastable))
        elif re.fullmatch(r"-?\d+", elem):
            tokens.append(("fixed", int(elem), broadcastable))
        else:
            tokens.append(("expression", elem, broadcastable))
    return tuple(tokens)


def _dtype_names(hint: type[AbstractArray]) -> list[str] | None:
    """The dtype names a jaxtyping array type accepts (``Float`` -> float16, ...), None for any dtype."""
    names = getattr(hint.dtype, "dtypes", None)
    if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def _check_array(hint: type[AbstractArray], value: torch.Tensor, memo: _Memo, argname: str,
                 arguments: dict[str, Any]) -> _Problem | None:
    dtype_name = repr(value.dtype).rsplit(".", 1)[-1]  # jaxtyping's spelling of a torch dtype
    dtypes = _dtype_names(hint)
    if dtypes is not None and dtype_name not in dtypes:
        category = hint.dtype.__name__
        wanted = _DTYPE_WORDS.get(category, f"one of {', '.join(dtypes)}")
        return _Problem(f"dtype is {dtype_name}, expected {wanted}", score=0)
    tokens = _tokens(hint.dim_str)
    if tokens is None:
        minimum = len(hint.dim_str.split()) - 1
        if value.ndim < minimum:
            return _Problem(f"has {value.ndim} axes {tuple(value.shape)}, expected at least {minimum} "
                            f"'{hint.dim_str}'", score=1)
        return None  # variadic shapes: no explanation; jaxtyping's own words are used
    if value.ndim != len(tokens):
        return _Problem(f"has {value.ndim} axes {tuple(value.shape)}, expected {len(tokens)} '{hint.dim_str}'",
                        score=1)
    for index, ((kind, payload, broadcastable), size) in enumerate(zip(tokens, value.shape, strict=True)):
        if kind == "anonymous" or (broadcastable and size == 1):
            continue
        if kind == "fixed":
            if payload != size:
                return _Problem(f"axis {index} is {size}, expected {payload} ('{hint.dim_str}')",
                                axis=str(index), actual=size, expected=payload, score=2 + index)
        elif kind == "expression":
            try:
                expr = eval(f"f'{payload}'", dict(arguments))
                expected = eval(expr, dict(memo.sizes))
            except Exception:
                continue
            if expected != size:
                label = _axis_label(payload)
                source = payload.strip("{}") if label != payload else f"{expr}"
                return _Problem(f"axis {label} is {size}, expected {expected} ({source})",
                                axis=label, actual=size, expected=int(expected), bound_by=source,
                                score=2 + index)
        elif payload in memo.sizes:
            if memo.sizes[payload] != size:
                binder = memo.binders[payload]
                return _Problem(
                    f"axis {payload} is {size}, expected {memo.sizes[payload]} (bound by {binder})"
                    f"{_sequence_first(payload, size, arguments.get(binder), binder)}",
                    axis=payload, actual=size, expected=memo.sizes[payload], bound_by=binder, score=2 + index)
        else:
            memo.sizes[payload] = size
            memo.binders[payload] = argname
    return None


def _sequence_first(axis: str, size: int, binder: Any, name: str) -> str:
    """A hint when the tensor that bound the batch axis looks sequence-first: its second axis is the batch size
    another argument has (a ``(t, b, e)`` input beside a ``(b, s)`` mask), else ``""``."""
    if axis != "b" or not isinstance(binder, torch.Tensor) or binder.ndim < 3 or binder.shape[1] != size:
        return ""
    return (f"; {name} {tuple(binder.shape)} looks sequence-first (its axis 1 is {size}): ours is batch-first, "
            f"(b, t, e); rearrange(x, 't b e -> b t e') converts it")


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
    # The parameter jaxtyping rejected; an explanation that names another one is not given.
    argument = "return value"
    marker = "typechecking parameter '"
    if marker in text:
        argument = text.split(marker, 1)[1].split("'", 1)[0]
    if "checking the return value" not in text:
        memo = _Memo()
        for argname, value in arguments.items():
            if argname not in hints:
                continue
            problem = _check_value(hints[argname], value, memo, argname, arguments)
            if problem is not None:
                if argname != argument:
                    break
                return ShapeError(name, argname, problem.reason, axis=problem.axis, actual=problem.actual,
                                  expected=problem.expected, bound_by=problem.bound_by, details=details)
    # Fall back on jaxtyping's own words: the innermost beartype violation carries the reason.
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

    Every nested call is traced and checked, in default and in strict mode alike, and checks are switched
    on for the block if they were off.
    """
    token = _TRACE.set(_Tracer(file if file is not None else sys.stdout))
    previous = set_shape_checks(True)  # jaxtyping's own switch: jaxtyped must check inside the block
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
            tokens = _tokens(alternative.dim_str)
            if tokens is None or len(tokens) != value.ndim:
                continue
            for (kind, payload, _), size in zip(tokens, value.shape, strict=True):
                if kind == "expression" and _axis_label(payload) != payload:
                    sizes.setdefault(_axis_label(payload), size)
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


def typechecked(fn: F, *, same_dtype: tuple[str, ...] = ()) -> F:
    """Return ``fn`` with its jaxtyping annotations checked by ``jaxtyped(typechecker=beartype)``.

    Checked at every eager call from outside the library, and at every call in strict mode (see the module
    docstring); a rejection is raised as a :class:`ShapeError`. Beyond the annotations, a checked call
    requires every tensor argument on one device (that of the module's parameters, for a method of a module
    that has some), and the floating-point arguments named in ``same_dtype`` in the dtype of the module's
    parameters: annotations cannot say either, and torch would otherwise fail deep inside (or, with the meta
    device, silently return a meta tensor).

    Use it as a decorator or by re-binding (the library re-binds its own functions, so that mutation testing, which
    skips decorated functions, reaches them)::

        @typechecked
        def pool(x: Float[Tensor, "b t e"], keep: Bool[Tensor, "b t"]) -> Float[Tensor, "b e"]: ...

        def scaled_dot_product_attention(q: Float[Tensor, "b h t d"], ...) -> Float[Tensor, "b h t dv"]: ...
        scaled_dot_product_attention = typechecked(scaled_dot_product_attention)

    The result has ``fn``'s own type, overloads included.
    """
    if getattr(fn, _CHECKED_ATTR, False):
        return fn
    hints = _resolve_annotations(fn)
    sig = inspect.signature(fn)
    positions = {name: index for index, name in enumerate(sig.parameters)}
    unknown = [name for name in same_dtype if name not in positions]
    if unknown:
        raise TypeError(f"typechecked: {fn.__qualname__} has no parameter {unknown[0]!r} (same_dtype)")
    own_prefix = f"{fn.__module__}.{fn.__qualname__}."
    returns = hints.get("return", inspect.Signature.empty)

    # jaxtyping re-checks every parameter together with the return value, doubling the cost of a call.
    # Instead the return value is checked here, inside the body that jaxtyping calls: its memo of axis
    # sizes (bound by the parameters) is still the current one, so the return shares the parameters' axes.
    def body(*args: Any, **kwargs: Any) -> Any:
        problem = _disagreement(fn, positions, same_dtype, args, kwargs)
        if problem is not None:
            raise problem
        out = fn(*args, **kwargs)
        if returns is not inspect.Signature.empty and not is_bearable(out, returns):
            raise _return_error(fn, sig, hints, args, kwargs, out)
        return out

    body.__signature__ = sig.replace(return_annotation=inspect.Signature.empty)  # type: ignore[attr-defined]
    body.__annotations__ = {k: v for k, v in hints.items() if k != "return"}
    body.__name__, body.__qualname__, body.__module__ = fn.__name__, fn.__qualname__, fn.__module__
    checked = jaxtyped(typechecker=_TYPECHECKER)(body)
    config = jaxtyping.config

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or config.jaxtyping_disable:
            return fn(*args, **kwargs)
        tracer = _TRACE.get()
        if tracer is None and not _strict and _INSIDE.get():
            return fn(*args, **kwargs)  # a call the library makes to itself: the outer check covers it
        token = _INSIDE.set(True)
        try:
            if tracer is not None:
                return _traced_call(tracer, fn, checked, sig, hints, args, kwargs)
            return checked(*args, **kwargs)
        except ShapeError:
            raise
        except TypeCheckError as err:
            if own_prefix not in str(err).split("\n", 1)[0] + ".":
                raise  # a check inside the body, not ours
            raise _explain(fn, sig, hints, args, kwargs, err) from err
        finally:
            _INSIDE.reset(token)

    setattr(wrapper, _CHECKED_ATTR, True)
    return typing.cast(F, wrapper)


def shape_checked(cls: C) -> C:
    """Class decorator: check ``forward`` (for ``nn.Module`` subclasses) and any other method listed in
    the class attribute ``__shape_checked__``.

    ``__same_dtype__`` (a tuple of ``forward``'s parameter names) lists the floating-point inputs that must have
    the dtype of the module's parameters (see :func:`typechecked`). A class decorator keeps the methods
    themselves undecorated, so mutation testing still mutates them.
    """
    names = ("forward", *getattr(cls, "__shape_checked__", ()))
    for name in names:
        method = cls.__dict__.get(name)
        if method is None:
            continue
        if isinstance(method, staticmethod | classmethod):
            raise TypeError(f"shape_checked: {cls.__name__}.{name} must be a plain method")
        same_dtype = tuple(getattr(cls, "__same_dtype__", ())) if name == "forward" else ()
        setattr(cls, name, typechecked(method, same_dtype=same_dtype))
    return cls


def _disagreement(fn: Callable[..., Any], positions: dict[str, int], same_dtype: tuple[str, ...],
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> ShapeError | None:
    """A tensor argument on another device, or a ``same_dtype`` argument in another dtype than the module's
    parameters; None when all agree. Costs a few microseconds, so it runs only where the call is checked."""
    owner = args[0] if args and isinstance(args[0], torch.nn.Module) else None
    reference = next(owner.parameters(), None) if owner is not None else None
    named = [(name, args[index] if index < len(args) else kwargs.get(name)) for name, index in positions.items()]
    tensors = [(name, value) for name, value in named if isinstance(value, torch.Tensor)]
    if reference is not None:
        device, source = reference.device, "the device of the module's parameters"
    elif tensors:
        device, source = tensors[0][1].device, f"the device of {tensors[0][0]}"
    for name, value in tensors:
        if value.device != device:
            return ShapeError(_qualname(fn), name, f"device is {value.device}, expected {device} ({source})")
    if reference is not None and reference.is_floating_point():
        given = dict(tensors)
        first: str | None = None  # the first input is compared with the parameters, later ones with it
        for name in same_dtype:
            tensor = given.get(name)
            if tensor is None or not tensor.is_floating_point():
                continue
            if tensor.dtype != reference.dtype:
                source = "the module's parameters" if first is None else first
                return ShapeError(_qualname(fn), name, f"dtype is {_short_dtype(tensor.dtype)}, expected "
                                  f"{_short_dtype(reference.dtype)} (the dtype of {source})")
            first = first or name
    return None
