"""The functions the reference and the comparison compute with, held as they were when the audit was imported.

A candidate runs in the audit's own process, so it can replace any of them: ``math.sqrt`` answering 1.0 for the
scale, ``torch.einsum`` answering zeros for the logits, the library's own ``attention._reference``. The reference
would then compute what the candidate computes, and a wrong candidate would pass. :func:`check_trusted` is called
before an audit and after every call of the candidate: a function that is no longer the one imported is put back
and named (the audit refuses, or the check fails). A function replaced before the audit was imported is found by
where its code lives: a trusted function's code is in its own package (torch, einops, typed_transformer) or built in.
No library does this for a Python process (one written here: the audit's trust in its own reference).
"""

import importlib
import inspect
from pathlib import Path
from typing import Any

from .conventions import AuditUsageError
from .known_answers import self_test

#: What the reference and the comparison call, by dotted name (module path, then attributes).
TRUSTED = (
    "math.sqrt", "math.isfinite",
    "torch.einsum", "torch.softmax", "torch.matmul", "torch.where", "torch.isfinite", "torch.equal",
    "torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.softmax",
    "torch.Tensor.softmax", "torch.Tensor.masked_fill", "torch.Tensor.nan_to_num", "torch.Tensor.repeat_interleave",
    "torch.Tensor.__sub__", "torch.Tensor.__mul__", "torch.Tensor.__matmul__", "torch.Tensor.abs", "torch.Tensor.max",
    "torch.Tensor.double", "torch.Tensor.to", "torch.Tensor.detach",
    "einops.einsum", "einops.rearrange", "einops.repeat",
    "typed_transformer.attention._reference", "typed_transformer.attention._sdpa",
    "typed_transformer.attention.scaled_dot_product_attention",
    "typed_transformer.audit.core.reference.reference_attention",
    "typed_transformer.audit.core.examples.error", "typed_transformer.audit.core.examples.bound",
)


def _split(name: str) -> tuple[Any, str]:
    """The object that holds ``name``'s last attribute, and that attribute."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1]
    raise ImportError(name)


def _get(name: str) -> Any:
    owner, attr = _OWNERS[name]
    return inspect.getattr_static(owner, attr) if isinstance(owner, type) else getattr(owner, attr)


def _home(name: str) -> Path | None:
    """The folder a trusted function's code must live in (None for ``math``: built in)."""
    root = name.split(".")[0]
    if root == "math":
        return None
    file = importlib.import_module(root).__file__
    return None if file is None else Path(file).resolve().parent


def _where(obj: Any) -> str:
    code = getattr(inspect.unwrap(obj) if callable(obj) else obj, "__code__", None)
    return "built in" if code is None else f"{code.co_filename}:{code.co_firstlineno}"


def _genuine(name: str, obj: Any) -> bool:
    """Built in (a C function or a tensor method), or Python code inside the package the name belongs to."""
    code = getattr(inspect.unwrap(obj) if callable(obj) else obj, "__code__", None)
    if code is None:  # built in: math's functions, torch's C functions and tensor methods
        return name.split(".")[0] != "typed_transformer"
    home = _home(name)
    return home is not None and Path(code.co_filename).resolve().is_relative_to(home)


#: where each trusted function is held (its module or class, and the attribute), found once
_OWNERS: dict[str, tuple[Any, str]] = {name: _split(name) for name in TRUSTED}
#: each trusted function as the audit's import found it
ORIGINALS: dict[str, Any] = {name: _get(name) for name in TRUSTED}


def replaced() -> list[str]:
    """The trusted functions that are no longer the ones imported, each put back; ``name (now: where its code
    is)`` for each."""
    found = []
    for name, original in ORIGINALS.items():
        now = _get(name)
        if now is not original:
            owner, attr = _OWNERS[name]
            setattr(owner, attr, original)
            found.append(f"{name} (replaced by {_where(now)})")
    return found


def untrusted() -> list[str]:
    """The trusted functions whose code is not where it belongs (replaced before the audit was imported)."""
    return [f"{name} (its code: {_where(obj)})" for name, obj in ORIGINALS.items() if not _genuine(name, obj)]



def check_trusted() -> None:
    """Before an audit: every trusted function genuine and as imported (a replaced one is put back), and the
    reference's known-answer self-test passed (:mod:`.known_answers`: what the trusted functions reach), else
    :class:`AuditUsageError` naming what changed: the reference cannot be trusted, and the audit does not run."""
    bad = untrusted() + replaced()
    if bad:
        raise AuditUsageError(f"functions the reference computes with were replaced: {'; '.join(bad)}. A candidate "
                              f"(or code imported with it) changed them, so the reference would compute what it "
                              f"computes; the audit refuses to run (the replaced ones are put back)")
    differ = self_test()
    if differ:
        raise AuditUsageError(f"the reference's known-answer self-test failed: {'; '.join(differ)}. Something the "
                              f"reference computes with was changed (by a candidate, or code imported with it), so "
                              f"it no longer gives the values stored for fixed inputs; the audit refuses to run")
