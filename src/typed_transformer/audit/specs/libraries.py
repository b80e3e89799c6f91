"""The library specs' registry: which library a module comes from, its spec and version, and the options each shipped
spec takes."""

import functools
from collections.abc import Callable
from typing import Any

from ..core.conventions import AuditUsageError
from ..modules.spec import LIBRARY_READERS, SHIPPED_SPECS, ModuleSpec, Options
from .diffusers import DIFFUSERS, DIFFUSERS_OPTIONS, diffusers_spec
from .litgpt import LITGPT, LITGPT_OPTIONS, litgpt_spec
from .open_clip import OPEN_CLIP, OPEN_CLIP_OPTIONS, open_clip_spec
from .shared import import_without_torchvision
from .timm import TIMM, TIMM_OPTIONS, timm_spec
from .torchtune import TORCHTUNE_OPTIONS, torchtune_decode, torchtune_spec
from .x_transformers import x_transformers_spec

# ----------------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------------

#: name -> the function that describes a module of that library (the spec ``audit_module(module, name)`` uses)
LIBRARY_SPECS: dict[str, Callable[[Any], ModuleSpec]] = {
    "litgpt": litgpt_spec, "timm": timm_spec, "open_clip": open_clip_spec, "diffusers": diffusers_spec,
    "torchtune": torchtune_spec, "x_transformers": x_transformers_spec}
#: each library's constructor options, as its spec treats them (x_transformers: its twin, in specs)
LIBRARY_OPTIONS: dict[str, Options] = {
    "litgpt": LITGPT_OPTIONS, "timm": TIMM_OPTIONS, "open_clip": OPEN_CLIP_OPTIONS, "diffusers": DIFFUSERS_OPTIONS,
    "torchtune": TORCHTUNE_OPTIONS}


def _register_shipped_options() -> None:
    from .pytorch import TORCH_MHA_OPTIONS
    from .typed_transformer import TYPED_TRANSFORMER_OPTIONS

    LIBRARY_OPTIONS.update(torch_mha=TORCH_MHA_OPTIONS, typed_transformer=TYPED_TRANSFORMER_OPTIONS)
#: the static spec of each library (its class and how the command line builds one), by name
LIBRARY_BASES: dict[str, ModuleSpec] = {"litgpt": LITGPT, "timm": TIMM, "open_clip": OPEN_CLIP, "diffusers": DIFFUSERS}


def _library_of(module: Any) -> str:
    """The name of the library spec (or shipped spec) whose class ``module`` is an instance of."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}
    for name, spec in {**SHIPPED_SPECS, **LIBRARY_BASES}.items():
        if spec.module_type in names:
            return name
    top = type(module).__module__.split(".")[0]
    if top == "transformers":
        return "hf"
    raise AuditUsageError(f"{type(module).__module__}.{type(module).__qualname__}: no spec describes this class "
                          f"(libraries with zero-line specs: {', '.join(LIBRARY_SPECS)}; hf for transformers)")


def library_spec(module: Any, name: str | None = None) -> ModuleSpec:
    """The zero-line spec of ``module``: the library's own description (``name``: ``"litgpt"``, ``"timm"``, ...;
    None or ``"auto"``: chosen from the module's class; ``"hf"``: :func:`~typed_transformer.audit.hf_spec`).

    Raises:
        AuditUsageError: the module is of a class no spec describes, or has options its spec does not model (the
            message names them).
    """
    if name in (None, "auto"):
        name = _library_of(module)
    if name == "hf":
        from ..hf.recognise import hf_spec

        return hf_spec(module)
    if name in LIBRARY_SPECS:
        base = LIBRARY_BASES.get(name) or SHIPPED_SPECS.get(name)
        if base is not None and base.module_type and base.module_type not in {
                f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}:
            raise AuditUsageError(f"{type(module).__module__}.{type(module).__qualname__} does not match spec "
                                  f"{name!r}: expected a {base.module_type}")
        return LIBRARY_SPECS[name](module)
    if name in SHIPPED_SPECS:
        return SHIPPED_SPECS[name]
    raise KeyError(f"unknown spec {name!r}; shipped specs: {', '.join(SHIPPED_SPECS)}, auto")


def library_version(name: str) -> str | None:
    """The installed version of a library (by its spec name), or None when it is not installed."""
    import importlib.metadata

    distribution = {"open_clip": "open_clip_torch", "x_transformers": "x-transformers"}.get(name, name)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _register() -> None:
    from . import SPECS

    for name, spec in LIBRARY_BASES.items():
        SPECS.setdefault(name, spec)
        SHIPPED_SPECS.setdefault(name, spec)
    for name in (*LIBRARY_SPECS, "auto"):
        LIBRARY_READERS[name] = functools.partial(_read, name=name)


def _read(module: Any, name: str) -> ModuleSpec:
    return library_spec(module, name)


_register()
_register_shipped_options()

__all__ = ["DIFFUSERS", "LIBRARY_OPTIONS", "LIBRARY_SPECS", "OPEN_CLIP", "TIMM", "Options", "diffusers_spec",
           "import_without_torchvision", "library_spec", "open_clip_spec", "timm_spec", "torchtune_decode",
           "torchtune_spec", "x_transformers_spec"]
