"""A module that (against the project rule) uses string annotations, to prove the safety net:
typechecked() resolves them against this module's globals even under a foreign wrapper."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from tests.support.foreign_wrappers import logged, trampoline
from typed_transformer.shapecheck import typechecked


def add(x: Float[Tensor, "b d"], y: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
    return x + y


add_wrapped = typechecked(logged(add))
add_trampolined = typechecked(trampoline(add))
