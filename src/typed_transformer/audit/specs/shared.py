"""Pieces the library specs share: refusals, pairs, identity, and an import of libraries that pull in torchvision
without it."""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

from torch import Tensor, nn

from ..core.conventions import AuditUsageError

# ----------------------------------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------------------------------


def _refuse(module: Any, spec: str, unmodelled: list[str]) -> None:
    """An :class:`AuditUsageError` naming every option of ``module`` the spec does not model (none: returns)."""
    if unmodelled:
        raise AuditUsageError(f"{type(module).__qualname__} computes what spec {spec!r} does not model: "
                              f"{'; '.join(unmodelled)}. The reference has no such step, so a FAIL would be about the "
                              f"reference, not the module: not audited")


def _pair(layer: Any) -> tuple[Tensor, Tensor | None]:
    """An ``nn.Linear``'s weight and bias in float64."""
    bias = getattr(layer, "bias", None)
    return layer.weight.detach().double(), None if bias is None else bias.detach().double()


def _identity(layer: Any) -> bool:
    return layer is None or isinstance(layer, nn.Identity)


class _Placeholder(type):
    """A class of the torchvision shim: any attribute is another placeholder, an instance cannot be made."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")


def _placeholder(name: str) -> type:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{name} belongs to the torchvision shim of typed_transformer.audit "
                           f"(import_without_torchvision): install a torchvision that imports to use it")

    return _Placeholder(name, (), {"__init__": init})


class _ShimModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _TorchvisionShim(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _ShimModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0+typed_transformer.shim"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_without_torchvision() -> bool:
    """Make ``import timm`` and ``import open_clip`` work where torchvision is missing or does not import (the
    registry's torchvision is a CUDA build that breaks on a CPU torch): a shim answers every ``torchvision.*``
    import with placeholder classes (an instance of one raises). Their attention modules do not use torchvision;
    image transforms and datasets do, and stay unusable. Returns True when the shim was installed (False: a working
    torchvision is there, or the shim already is)."""
    if any(isinstance(finder, _TorchvisionShim) for finder in sys.meta_path):
        return False
    try:
        import torchvision  # noqa: F401
        return False
    except Exception:  # missing, or a build that does not match this torch
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    sys.meta_path.insert(0, _TorchvisionShim())
    return True
