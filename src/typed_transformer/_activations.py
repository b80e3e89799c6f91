"""The feed-forward activations by name, shared by the layers and the torch interop (which maps torch's
activation objects to these names and back).

``"relu"``, ``"gelu"`` (exact, ``x * Phi(x)``) and ``"gelu_tanh"`` (GPT-2's tanh approximation), or any
unary callable, which is kept as it is.
"""

from collections.abc import Callable
from typing import Literal, TypeAlias

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "Activation", "ActivationName", "activation_fn", "activation_name", "gelu_tanh"]

ActivationName = Literal["relu", "gelu", "gelu_tanh"]
#: ``"relu"``, ``"gelu"`` (exact, ``x * Phi(x)``), ``"gelu_tanh"`` (GPT-2's approximation) or any callable.
Activation: TypeAlias = ActivationName | Callable[[Tensor], Tensor]


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation as a plain function (torch's fast path takes any ``nn.GELU`` for the exact one)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": gelu_tanh}


def activation_fn(owner: str, activation: Activation) -> Callable[[Tensor], Tensor]:
    """The callable for a name (or the callable itself).

    Raises:
        ValueError: an unknown name, or something that is neither a name nor callable.
    """
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"{owner}: activation must be 'relu', 'gelu', 'gelu_tanh' or a callable, "
                             f"got {activation!r}")
        return ACTIVATIONS[activation]
    if not callable(activation):
        raise ValueError(f"{owner}: activation must be 'relu', 'gelu', 'gelu_tanh' or a callable, got {activation!r}")
    return activation


def activation_name(fn: Callable[[Tensor], Tensor]) -> Activation:
    """The name of a known activation (torch's ``F.relu``, ``nn.GELU()``, ...), else the callable itself."""
    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu or (isinstance(fn, nn.GELU) and fn.approximate == "none"):
        return "gelu"
    if fn is gelu_tanh or (isinstance(fn, nn.GELU) and fn.approximate == "tanh"):
        return "gelu_tanh"
    return fn
