"""Old public names that keep working, with a ``DeprecationWarning`` naming the new one.

The naming rule (docs/conventions.md#names): classes that mirror a torch module take torch's spelling
(``num_heads`` for ``MultiHeadAttention``, ``nhead``/``src``/``tgt`` for the ``Transformer`` family and the
models built on it), :class:`~typed_transformer.GPTConfig` takes nanoGPT's (``n_head``, ``n_embd``). A name
that broke the rule was renamed and its old spelling is routed here.

Renames are applied by re-binding after the class is defined (not as decorators on the methods), so the
methods themselves stay undecorated: mutation testing still mutates them, and shape checks stay inside.
"""

import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["deprecated_alias", "renamed_keywords", "warn_deprecated"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_deprecated(message: str) -> None:
    """A ``DeprecationWarning`` attributed to the user's line: the first frame outside this library, the checks'
    wrappers (jaxtyping, beartype, generated code, however many of those the call went through) and
    ``nn.Module.__call__`` (which sits between ``model(...)`` and ``forward``). ``warn_explicit`` at that frame
    stays exact under any number of wrappers (mutmut's trampolines wrap this function itself)."""
    frame = sys._getframe(1)
    while frame.f_back is not None:
        module = frame.f_globals.get("__name__", "") or ""
        filename = frame.f_code.co_filename
        inside = (module.startswith(("typed_transformer.", "jaxtyping", "beartype"))
                  or module == "torch.nn.modules.module" or filename.startswith((_PACKAGE_DIR, "<"))
                  or any(f"{os.sep}{name}{os.sep}" in filename for name in ("jaxtyping", "beartype")))
        if not inside:
            break
        frame = frame.f_back
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, DeprecationWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"), registry=registry)


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
