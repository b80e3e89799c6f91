"""Old public names that keep working, with a ``DeprecationWarning`` naming the new one.

The naming rule (docs/conventions.md#names): classes that mirror a torch module take torch's spelling
(``num_heads`` for ``MultiHeadAttention``, ``nhead``/``src``/``tgt`` for the ``Transformer`` family and the
models built on it), :class:`~typed_transformer.GPTConfig` takes nanoGPT's (``n_head``, ``n_embd``). A name
that broke the rule was renamed and its old spelling is routed here.

Renames are applied by re-binding after the class is defined (not as decorators on the methods), so the
methods themselves stay undecorated: mutation testing still mutates them, and shape checks stay inside.
"""

import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["deprecated_alias", "renamed_keywords", "warn_deprecated"]

_INSIDE = ("typed_transformer", "torch")


def warn_deprecated(message: str) -> None:
    """A ``DeprecationWarning`` attributed to the user's line: the first caller outside this package and
    torch (``nn.Module.__call__`` sits between a user's ``model(...)`` and ``forward``)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _INSIDE:
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def renamed_keywords(cls: type, method: str, **renames: str) -> None:
    """Make ``cls.method`` accept each old keyword (``old="new"``) as its new name, with a warning.

    Raises (at call time):
        TypeError: both the old and the new keyword were given.
    """
    original: Callable[..., Any] = cls.__dict__[method]
    owner = cls.__name__ if method == "__init__" else f"{cls.__name__}.{method}"

    @functools.wraps(original)
    def accepting_old_names(*args: Any, **kwargs: Any) -> Any:
        for old, new in renames.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{owner}: got both {old}= and {new}= ({old} is the deprecated name of {new})")
                warn_deprecated(f"{owner}: the keyword {old}= is deprecated, use {new}=")
                kwargs[new] = kwargs.pop(old)
        return original(*args, **kwargs)

    setattr(cls, method, accepting_old_names)


def deprecated_alias(cls: type, old: str, new: str) -> None:
    """Make the attribute ``cls.old`` read (and write) ``new``, with a warning."""

    def get(self: Any) -> Any:
        warn_deprecated(f"{cls.__name__}.{old} is deprecated, use {cls.__name__}.{new}")
        return getattr(self, new)

    def set_(self: Any, value: Any) -> None:
        warn_deprecated(f"{cls.__name__}.{old} is deprecated, use {cls.__name__}.{new}")
        setattr(self, new, value)

    setattr(cls, old, property(get, set_, doc=f"Deprecated name of ``{new}``."))
