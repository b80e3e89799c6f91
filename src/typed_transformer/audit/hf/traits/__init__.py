"""Traits: what the audit knows about Hugging Face attention classes, one small registered unit per thing known.

A :class:`Trait` knows one thing (sliding chunks, a gated relative bias, a key-padding-only mask, ...):

- ``detect``: whether a class has it, read from facts about the class (:mod:`..facts`); anything falsy is "no";
  what it returns otherwise is handed to the trait's other parts;
- ``notes``: what the class's audit leaves untested because of it (:func:`..notes.hf_notes`);
- ``limits``: what the class computes that the reference does not model (:func:`..notes.hf_limits`);
- ``reads`` and ``own``: the submodules and the class's own parameters its spec reads (the rest is a limit);
- ``changes``: what it changes in the spec the generic reading (:mod:`..generic`) made;
- ``examples``: the classes it was written for, as ``"model.ClassName"`` of ``transformers.models``; a test builds
  each and fails when the trait no longer recognises it (a stale trait, as a stale skip is in array-api-tests);
- ``unmatched``: for a trait no class of the installed transformers has (a guard), why it is kept.

The traits of a subject live in one file of this folder (``positions``, ``masks``, ``inputs``, ``blocks``); a new
family is taught in one place: a trait of its own, or an example added to the trait that already fits it. A class is
read once (:class:`Seen`) and the traits fold over that reading, subject by subject (:func:`all_traits`).
"""

from typing import Any

from torch import nn

from ...modules.spec import ModuleSpec
from ..layout import Layout
from . import blocks, inputs, masks, positions  # noqa: F401  (each registers its traits)
from .base import SUBJECTS, TRAITS, Seen, Trait, _unchanged, add_trait, register

__all__ = ["SUBJECTS", "TRAITS", "Seen", "Trait", "add_trait", "all_traits", "changed_spec", "register", "traits_of"]


def traits_of(module: nn.Module) -> list[tuple[Trait, Any]]:
    """The traits ``module``'s class has, each with what it found, in registration order."""
    seen = Seen(module)
    return [(trait, found) for trait in all_traits() if (found := trait.found(seen)) is not None]


def changed_spec(module: nn.Module, spec: ModuleSpec, layout: Layout) -> ModuleSpec:
    """``spec`` (the generic reading of ``module``) with each change of the traits the class has, in trait order."""
    seen = Seen(module, spec)
    for trait in all_traits():
        if trait.changes is not _unchanged and (found := trait.found(seen)) is not None:
            spec = trait.changes(seen, found, spec, layout)
    return spec


def all_traits() -> list[Trait]:
    """Every registered trait, by subject (:data:`SUBJECTS`), each subject's in the order its file registers them."""
    return sorted(TRAITS, key=lambda t: SUBJECTS.index(t.subject) if t.subject in SUBJECTS else len(SUBJECTS))
