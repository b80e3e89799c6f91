"""Muon on the hidden matrices, AdamW on the rest: :class:`MuonAdamW` (one ``torch.optim.Optimizer``).

Muon (Jordan et al., 2024) for a hidden weight matrix ``W`` (``r x c``) with gradient ``G_t``::

    M_t = mu M_{t-1} + (1 - mu) G_t                       momentum (mu = 0.95)
    U_t = (1 - mu) G_t + mu M_t                           Nesterov
    O_t = NS_k(U_t)                                       k quintic Newton-Schulz steps (below)
    W  <- W (1 - eta lambda) - eta sqrt(max(1, r / c)) O_t   decoupled weight decay lambda, rate eta

and the Newton-Schulz iteration that takes ``U`` to about the nearest semi-orthogonal matrix (``U = P S Q^T`` to
``P Q^T``: every singular value to about 1), on ``X`` of at most as many rows as columns (transposed if not)::

    X_0 = U / ||U||_F
    X_{j+1} = a X_j + (b A_j + c A_j^2) X_j,   A_j = X_j X_j^T,   (a, b, c) = (3.4445, -4.7750, 2.0315)

Each step multiplies ``X`` on the left by a polynomial of its Gram matrix, ``X_{j+1} = p(A_j) X_j`` with
``p(A) = a I + b A + c A^2``; ``p(A_j)`` commutes with ``A_j``, so the iteration can run on ``r x r`` matrices
alone (the Gram form, for ``X`` of ``r`` rows and ``c`` columns)::

    A_0 = X_0 X_0^T,   A_{j+1} = p(A_j)^2 A_j,   X_k = p(A_{k-1}) ... p(A_1) p(A_0) X_0

``k`` steps cost ``4 r^2 c + (8k - 6) r^3`` FLOPs in that form against ``k (4 r^2 c + 2 r^3)`` step by step: fewer
whenever ``c > 1.5 r``, whatever ``k`` (the baby preset's ``128 x 384`` and ``128 x 512`` matrices: 0.66x and
0.56x at 5 steps), so :func:`newton_schulz` takes that form there and the step-by-step one for squarer matrices.
The two agree to float32 rounding (``tests/app/test_muon.py`` holds both against a float64 reference).

The embeddings, the output head, the norms and the biases get AdamW (exactly torch's fused one). The iteration
runs in float32, the matrices of one shape stacked and orthogonalised in one batched product per step
(``torch.baddbmm``): at the baby preset's sizes the four layers' matrices of a shape cost little more than one
(``benchmarks/muon_step.py``). torch's own ``torch.optim.Muon`` is not used: it runs the iteration in bfloat16,
which this project's CPUs do at about 1 GFLOP/s, and it has no AdamW half for the other parameters.
"""

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor, nn
from torch.optim.adamw import adamw

from .shapecheck import typechecked

__all__ = ["NS_COEFFICIENTS", "MuonAdamW", "check_muon_entry", "gram_form_pays", "hidden_matrices", "muon_groups",
           "newton_schulz"]

#: The quintic's coefficients (a, b, c) (Jordan et al.): steep at 0, so few steps take every singular value
#: to about 1 (to between about 0.7 and 1.2, not exactly 1: the update needs the directions, not exact values).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(update: Float[Tensor, "n r c"], steps: int = 5, *, gram_form: bool | None = None
                  ) -> Float[Tensor, "n r c"]:
    """``steps`` quintic Newton-Schulz steps on each of the ``n`` stacked matrices at once (in float32: the
    caller's dtype is given back); see the module's equation. ``gram_form``: None takes the Gram form where it
    costs fewer FLOPs (the longer side more than 1.5x the shorter), True or False always or never."""
    a, b, c = NS_COEFFICIENTS
    x = update.float()
    wide = x.shape[-2] > x.shape[-1]
    if wide:
        x = rearrange(x, "n r c -> n c r")
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + 1e-7)
    if gram_form_pays(*x.shape[-2:]) if gram_form is None else gram_form:
        x = _gram_form(x, steps)
    else:
        for _ in range(steps):
            gram = torch.bmm(x, rearrange(x, "n r c -> n c r"))
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)
    if wide:
        x = rearrange(x, "n c r -> n r c")
    return x.to(update.dtype)


def gram_form_pays(rows: int, cols: int) -> bool:
    """Whether the Gram form costs fewer FLOPs than step by step for a ``rows x cols`` matrix: the longer side
    more than 1.5x the shorter (the module's count, whatever the number of steps)."""
    return max(rows, cols) > 1.5 * min(rows, cols)


def _gram_form(x: Tensor, steps: int) -> Tensor:
    """The Newton-Schulz steps in the Gram form (the module's equation) on ``x`` (``n r c``, normalised)."""
    a, b, c = NS_COEFFICIENTS
    gram = torch.bmm(x, rearrange(x, "n r c -> n c r"))
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device).expand_as(gram)
    product = None
    for j in range(steps):
        poly = torch.baddbmm(torch.add(eye, gram, alpha=b / a), gram, gram, beta=a, alpha=c)  # p(A_j)
        product = poly if product is None else torch.bmm(poly, product)
        if j < steps - 1:
            gram = torch.bmm(poly, torch.bmm(poly, gram))
    assert product is not None  # steps >= 1
    return torch.bmm(product, x)


_plain_newton_schulz = newton_schulz  # unchecked: what torch.compile traces (benchmarks/muon_step.py)
newton_schulz = typechecked(newton_schulz)


def hidden_matrices(model: nn.Module, outputs: Iterable[nn.Module] = ()) -> list[nn.Parameter]:
    """Muon's parameters: the weights of ``model``'s ``nn.Linear`` layers, in ``model.parameters()`` order, but
    not those of ``outputs`` (the output heads) nor a weight shared with an embedding (a tied head)."""
    skipped = {id(p) for module in outputs for p in module.parameters()}
    skipped |= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    found: dict[int, nn.Parameter] = {}
    for p in model.parameters():
        if id(p) in linear and id(p) not in skipped and p.requires_grad and p.dim() == 2:
            found[id(p)] = p
    return list(found.values())


def muon_groups(model: nn.Module, outputs: Iterable[nn.Module] = (), *, weight_decay: float, lr_scale: float,
                ns_steps: int = 5) -> list[dict[str, Any]]:
    """:class:`MuonAdamW`'s param groups for ``model``: Muon on :func:`hidden_matrices`, then AdamW with
    ``weight_decay`` on the other matrices (embeddings, output heads), then AdamW without decay on the vectors
    (norms, biases); each parameter once (a tied weight too), in ``model.parameters()`` order within a group."""
    hidden = hidden_matrices(model, outputs)
    taken = {id(p) for p in hidden}
    rest = [p for p in {id(p): p for p in model.parameters() if p.requires_grad}.values() if id(p) not in taken]
    return [{"params": hidden, "muon": True, "weight_decay": weight_decay, "lr_scale": lr_scale,
             "ns_steps": ns_steps},
            {"params": [p for p in rest if p.dim() >= 2], "muon": False, "weight_decay": weight_decay},
            {"params": [p for p in rest if p.dim() < 2], "muon": False, "weight_decay": 0.0}]


def check_muon_entry(index: int, entry: dict[str, Any], parameter: Float[Tensor, "..."]) -> None:
    """One Muon parameter's saved state before ``load_state_dict`` (which would cast a dtype silently): exactly
    a finite ``momentum_buffer`` of the parameter's shape and dtype."""
    if set(entry) != {"momentum_buffer"}:
        raise ValueError(f"optimizer state of parameter {index} must hold momentum_buffer only, got {sorted(entry)}")
    buffer = entry["momentum_buffer"]
    if not isinstance(buffer, Tensor) or buffer.shape != parameter.shape or buffer.dtype != parameter.dtype:
        raise ValueError(f"optimizer tensor {index}.momentum_buffer must be {parameter.dtype} of shape "
                         f"{tuple(parameter.shape)}")
    if not bool(torch.isfinite(buffer).all()):
        raise ValueError(f"optimizer tensor {index}.momentum_buffer holds NaN or infinity")


check_muon_entry = typechecked(check_muon_entry)


def _grads(params: list[Tensor]) -> list[Tensor]:
    return [p.grad for p in params if p.grad is not None]


def _check_group(group: dict[str, Any]) -> None:
    """A param group's settings (the constructor's, or a saved state's), the first wrong one named."""
    lr, lr_scale, betas = group["lr"], group["lr_scale"], group["betas"]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               for v in (lr, lr_scale, group["momentum"], group["weight_decay"], group["eps"], *betas)):
        raise ValueError("lr, lr_scale, momentum, weight_decay, eps and betas must be finite numbers")
    if lr < 0 or lr_scale <= 0:
        raise ValueError(f"need lr >= 0 and lr_scale > 0, got lr={lr}, lr_scale={lr_scale}")
    if not 0 <= group["momentum"] < 1 or len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        raise ValueError(f"momentum and betas must be in [0, 1), got {group['momentum']}, {betas}")
    steps = group["ns_steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"ns_steps must be a positive integer, got {steps!r}")
    if group["weight_decay"] < 0 or group["eps"] < 0:
        raise ValueError(f"weight_decay and eps must be >= 0, got {group['weight_decay']}, {group['eps']}")
    if not isinstance(group["muon"], bool) or not isinstance(group["nesterov"], bool):
        raise ValueError(f"muon and nesterov must be True or False, got {group['muon']!r}, {group['nesterov']!r}")
    if group["muon"] and any(p.dim() != 2 for p in group["params"]):
        raise ValueError("a Muon group holds matrices only (2-D parameters); give the others muon=False")


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the param groups with ``muon=True``, AdamW (torch's fused kernel where the device has it) for the
    others. A Muon group's rate is ``lr * lr_scale``: a schedule that sets every group's ``lr`` (the training
    loop's) moves both halves together, Muon's at its own peak. ``state_dict()`` round-trips: Muon's state is
    each matrix's ``momentum_buffer``, AdamW's torch's own (``step``, ``exp_avg``, ``exp_avg_sq``)."""

    def __init__(self, params: Iterable[dict[str, Any]], lr: float, *, betas: tuple[float, float] = (0.9, 0.99),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, lr_scale: float = 1.0, fused: bool | None = None) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "momentum": momentum,
                    "nesterov": nesterov, "ns_steps": ns_steps, "lr_scale": lr_scale, "muon": False,
                    "fused": fused}
        super().__init__(list(params), defaults)
        for group in self.param_groups:
            _check_group(group)


    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._muon if group["muon"] else self._adamw)(group, params)
        return loss

    def _muon(self, group: dict[str, Any], params: list[Tensor]) -> None:
        mu, lr = group["momentum"], group["lr"] * group["lr_scale"]
        by_shape: dict[tuple[int, ...], list[Tensor]] = {}
        for p in params:
            by_shape.setdefault(tuple(p.shape), []).append(p)
        for (rows, cols), same in by_shape.items():
            grads = _grads(same)
            buffers = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in same]
            torch._foreach_lerp_(buffers, grads, 1 - mu)
            stacked = torch.stack(grads)
            stacked = stacked.lerp_(torch.stack(buffers), mu) if group["nesterov"] else torch.stack(buffers)
            orthogonal = newton_schulz(stacked, group["ns_steps"])
            if group["weight_decay"]:
                torch._foreach_mul_(same, 1 - lr * group["weight_decay"])
            torch._foreach_add_(same, list(orthogonal.unbind(0)), alpha=-lr * max(1.0, rows / cols) ** 0.5)

    def _adamw(self, group: dict[str, Any], params: list[Tensor]) -> None:
        for p in params:
            if not self.state[p]:
                self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                 "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        fused = group["fused"]
        if fused is None:
            fused = all(p.device.type in ("cpu", "cuda") for p in params)
        states = [self.state[p] for p in params]
        adamw(params, _grads(params), [s["exp_avg"] for s in states],
                                [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states], fused=fused,
                                amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"],
                                weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
