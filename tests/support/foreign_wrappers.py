"""Wrappers defined in a module other than the wrapped function's, as mutmut's trampolines and
third-party decorators are. Used by test_shapecheck.py."""

import functools
from collections.abc import Callable
from typing import Any


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A plain functools.wraps decorator."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def trampoline(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Like mutmut's trampoline: the call goes through this module's globals."""
    table = {"orig": fn}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return table["orig"](*args, **kwargs)

    return wrapper
