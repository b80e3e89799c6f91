"""Every public signature says the shape of its tensors: no bare ``torch.Tensor`` in an annotation.

The walk covers each public module's ``__all__``: functions, and the public methods, properties,
``__init__`` and ``forward`` of classes. A bare ``Tensor`` anywhere in an annotation (also inside
``X | None``, ``tuple[...]``, ``list[...]``) fails; jaxtyping's ``Float[Tensor, "b t d"]`` passes.
The argument and return types of a *callable parameter* (``activation: Callable[[Tensor], Tensor]``)
describe the user's function, not ours, and are not walked.
"""

import collections.abc
import importlib
import inspect
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from jaxtyping import AbstractArray

from typed_transformer.shapecheck import is_checked

ROOT = Path(__file__).resolve().parents[2]

#: Every public module: the core, the testing toolkit and the app.
MODULES = ["validation", "attention", "masks", "positions", "multihead", "layers", "interop", "seq2seq", "gpt", "hf",
           "tutorial", "shapecheck", "strategies", "audit", "audit.specs", "data", "seq2seq_data", "plot", "threads",
           "config", "muon", "run_files", "checkpoint", "generation", "step_loop", "training", "seq2seq_training",
           "cli"]


def _bare(annotation: object) -> bool:
    if annotation is torch.Tensor:
        return True
    if typing.get_origin(annotation) in (collections.abc.Callable, Callable):
        return False
    return any(_bare(arg) for arg in typing.get_args(annotation))


def _signatures(module_name: str) -> Iterator[tuple[str, Callable[..., object]]]:
    module = importlib.import_module(f"typed_transformer.{module_name}")
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            for attribute, value in vars(obj).items():
                if attribute.startswith("_") and attribute != "__init__":
                    continue
                if isinstance(value, property) and value.fget is not None:
                    yield f"{name}.{attribute}", value.fget
                elif isinstance(value, staticmethod | classmethod):
                    yield f"{name}.{attribute}", value.__func__
                elif inspect.isfunction(value):
                    yield f"{name}.{attribute}", value
        elif inspect.isfunction(obj):
            yield name, obj


def _bare_annotations(module_name: str) -> list[str]:
    found = []
    for label, function in _signatures(module_name):
        for parameter, annotation in typing.get_type_hints(function, include_extras=True).items():
            if _bare(annotation):
                found.append(f"{label}: {parameter}")
    return found


@pytest.mark.parametrize("module", MODULES)
def test_no_bare_tensor_in_a_public_signature(module: str) -> None:
    assert _bare_annotations(module) == []


def test_the_walk_finds_a_bare_tensor() -> None:
    """The check itself: a bare Tensor in an argument, in a union return, in a property; not in a callable."""

    def plain(x: torch.Tensor) -> int:
        return 0

    def union(x: int) -> torch.Tensor | None:
        return None

    def activation(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        return None

    hints = [typing.get_type_hints(f, include_extras=True) for f in (plain, union, activation)]
    assert _bare(hints[0]["x"])
    assert _bare(hints[1]["return"])
    assert not _bare(hints[2]["fn"])
    from jaxtyping import Float

    assert not _bare(Float[torch.Tensor, "b t"] | None)
    assert not _bare(tuple[Float[torch.Tensor, " b"], int])


def test_every_public_module_is_walked_or_named() -> None:
    import pkgutil

    import typed_transformer

    public = {m.name for m in pkgutil.iter_modules(typed_transformer.__path__) if not m.name.startswith("_")}
    assert public <= set(MODULES), sorted(public - set(MODULES))


def _shaped(annotation: object) -> bool:
    """A jaxtyping array type anywhere in the annotation (not inside a callable's own signature)."""
    if isinstance(annotation, type) and issubclass(annotation, AbstractArray):
        return True
    if typing.get_origin(annotation) in (collections.abc.Callable, Callable):
        return False
    return any(_shaped(arg) for arg in typing.get_args(annotation))


def _runtime_checkable(module_name: str) -> Iterator[tuple[str, Callable[..., object]]]:
    """The public functions and methods a call can check: not a property (no call to check at: its value comes
    from a checked method), not a Protocol's (no code), not a Hypothesis strategy (its ``draw`` argument, a
    non-runtime Protocol, cannot be checked; what it draws is tested by the property tests)."""
    module = importlib.import_module(f"typed_transformer.{module_name}")
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            if getattr(obj, "_is_protocol", False):
                continue
            for attribute, value in vars(obj).items():
                if (attribute.startswith("_") and attribute != "__init__") or isinstance(value, property):
                    continue
                if isinstance(value, staticmethod | classmethod):
                    value = value.__func__
                if callable(value):
                    yield f"{name}.{attribute}", value
        elif callable(obj) and not getattr(obj, "is_hypothesis_strategy_function", False):
            yield name, obj


@pytest.mark.parametrize("module", MODULES)
def test_shape_annotations_are_checked_at_run_time(module: str) -> None:
    """An annotation that states a shape is enforced at the call: each public function or method with one is
    wrapped by the library's check (``typechecked``, or ``shape_checked`` for a class's methods)."""
    unchecked = []
    for label, function in _runtime_checkable(module):
        if not (inspect.isfunction(function) or is_checked(function)):
            continue  # a class or another callable object, not a function with a signature of its own
        hints = typing.get_type_hints(inspect.unwrap(function), include_extras=True)
        if any(_shaped(hint) for hint in hints.values()) and not is_checked(function):
            unchecked.append(label)
    assert unchecked == []


def test_the_run_time_walk_sees_checked_and_unchecked_functions() -> None:
    from jaxtyping import Float

    def unchecked(x: Float[torch.Tensor, "b t"]) -> int:
        return 0

    assert _shaped(typing.get_type_hints(unchecked, include_extras=True)["x"])
    assert not is_checked(unchecked)
    walked = dict(_runtime_checkable("audit"))
    assert is_checked(walked["ModuleAdapter.reference"])
    assert is_checked(walked["Weights.__init__"])
    assert "Adapter.call" not in walked  # a Protocol's methods have no code to check


def _every_signature(module_name: str) -> Iterator[tuple[str, Callable[..., object]]]:
    """Every function and method the module defines, private ones included."""
    module = importlib.import_module(f"typed_transformer.{module_name}")
    for name, obj in vars(module).items():
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            for attribute, value in vars(obj).items():
                function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if inspect.isfunction(function):
                    yield f"{name}.{attribute}", function
        elif inspect.isfunction(obj):
            yield name, obj


@pytest.mark.parametrize("module", ["step_loop", "training", "run_files", "checkpoint"])
def test_no_bare_tensor_in_the_training_and_checkpoint_internals(module: str) -> None:
    """The internals a reader of the step path and the checkpoint format reads: shapes there too."""
    found = [f"{label}: {parameter}" for label, function in _every_signature(module)
             for parameter, annotation in typing.get_type_hints(function, include_extras=True).items()
             if _bare(annotation)]
    assert found == []


#: The model code (the design card: einops for every reshape, no ad hoc indexing of axes).
MODEL_MODULES = ["attention", "masks", "positions", "multihead", "layers", "gpt", "seq2seq"]
_NEW_AXIS = re.compile(r"\[(?::,\s*|\.\.\.,\s*)*None\b")  # x[:, None], x[None], x[..., None, :]


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_the_model_code_names_new_axes_with_einops(module: str) -> None:
    source = (ROOT / "src" / "typed_transformer" / f"{module}.py").read_text()
    found = [f"{module}.py:{number}: {line.strip()}" for number, line in enumerate(source.splitlines(), 1)
             if _NEW_AXIS.search(line) or ".nonzero().flatten()" in line]
    assert found == []


def test_the_new_axis_pattern_sees_the_indexing_it_forbids() -> None:
    assert all(_NEW_AXIS.search(text) for text in ("x[:, None]", "b[None]", "s[:, None, None]", "y[..., None]"))
    assert not any(_NEW_AXIS.search(text) for text in ("tuple[int, None]", "Tensor | None]", "x[:, 0]"))
