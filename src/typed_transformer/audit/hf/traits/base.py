"""The trait type, the one reading of a class every trait asks (:class:`Seen`), and the registry (the package's
docstring says what a trait is)."""

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import nn

from ...core.conventions import AuditUsageError
from ...modules.spec import ModuleSpec
from ..facts import _core_of, _norm_paths
from ..generic import generic_spec
from ..layout import Layout, find_layout

#: the names a class's forward may give its mask, in the order the notes look for them
MASK_ARGS = ("attention_mask", "mask", "attn_mask")


class Seen:
    """One reading of a built attention module: the facts every trait asks for, each computed once."""

    def __init__(self, module: nn.Module, generic: ModuleSpec | None = None) -> None:
        self.module = module
        if generic is not None:  # the generic reading hands on the spec it made (not read again)
            self.__dict__["spec"] = generic
        self.cls: Any = type(module)
        self.signature: Mapping[str, inspect.Parameter] = inspect.signature(self.cls.forward).parameters
        self.mask_arg = next((n for n in MASK_ARGS if n in self.signature), "attention_mask")

    @functools.cached_property
    def core(self) -> nn.Module:
        """The submodule that holds the projections (a block's ``self``), or the module itself."""
        return _core_of(self.module)

    @functools.cached_property
    def spec(self) -> ModuleSpec | None:
        """The class's generic spec (:func:`..generic.generic_spec`, before the traits change it: what a trait's
        detection may ask of it), made once, when a trait first needs it; None where the reading refuses the class
        (a trait that needs it then finds nothing)."""
        with contextlib.suppress(AuditUsageError):
            return generic_spec(self.module, None)[0]
        return None

    @functools.cached_property
    def layout(self) -> Layout | None:
        """The class's layout, or None where no layout fits."""
        with contextlib.suppress(AuditUsageError):
            return find_layout(self.module, _norm_paths(self.module))
        return None


def _nothing(seen: Seen, found: Any) -> list[str]:
    return []


def _unchanged(seen: Seen, found: Any, spec: ModuleSpec, layout: Layout) -> ModuleSpec:
    return spec


@dataclasses.dataclass(frozen=True)
class Trait:
    """One thing known about attention classes (see the module's docstring for each part)."""

    name: str
    detect: Callable[[Seen], Any]
    examples: tuple[str, ...]
    notes: Callable[[Seen, Any], list[str]] = _nothing
    limits: Callable[[Seen, Any], list[str]] = _nothing
    reads: Callable[[Seen, Any], Iterable[str]] = _nothing
    own: Callable[[Seen, Any], Iterable[str]] = _nothing
    unmatched: str = ""
    #: what it changes in the generic spec (:mod:`..generic`), given the spec read so far and the class's layout
    changes: Callable[[Seen, Any, ModuleSpec, Layout], ModuleSpec] = _unchanged

    @property
    def subject(self) -> str:
        """The file of this folder the trait is written in (where its ``detect`` is defined)."""
        return str(self.detect.__module__).rsplit(".", 1)[-1]

    def found(self, seen: Seen) -> Any:
        """What :attr:`detect` found in the class, or None where it has not this trait."""
        found = self.detect(seen)
        return None if found is None or found is False or (isinstance(found, list | tuple | set | str)
                                                           and not found) else found


#: every trait, in the order registered
TRAITS: list[Trait] = []
#: the subjects, in the order a class's notes and limits list them (a trait registered elsewhere comes last)
SUBJECTS = ("positions", "masks", "inputs", "blocks")


def register(name: str, detect: Callable[[Seen], Any], *, examples: tuple[str, ...],
             limits: Callable[[Seen, Any], list[str]] = _nothing,
             reads: Callable[[Seen, Any], Iterable[str]] = _nothing,
             own: Callable[[Seen, Any], Iterable[str]] = _nothing,
             unmatched: str = "", changes: Callable[[Seen, Any, ModuleSpec, Layout], ModuleSpec] = _unchanged,
             ) -> Callable[[Callable[[Seen, Any], list[str]]], Trait]:
    """Registers a trait whose notes are the decorated function (``found`` is what ``detect`` returned)."""
    def add(notes: Callable[[Seen, Any], list[str]]) -> Trait:
        return add_trait(Trait(name, detect, examples, notes, limits, reads, own, unmatched, changes))

    return add


def add_trait(trait: Trait) -> Trait:
    """Registers ``trait`` (a name is registered once)."""
    if any(t.name == trait.name for t in TRAITS):
        raise ValueError(f"a trait named {trait.name!r} is registered already")
    TRAITS.append(trait)
    return trait
