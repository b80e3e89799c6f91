"""Candidates that end, crash, fork or hang the process they run in: what an isolated audit (``isolate=True``, the
command line's default) must survive and name. Each is correct attention until it misbehaves, so that the
misbehaviour is the only thing the audit can report. (The candidate that patches ``math.sqrt`` when it is imported
is in ``isolation_sly``: importing it changes the importing process.)"""

import ctypes
import math
import os
import signal
import time
from typing import Any

import torch
from torch import Tensor


def _attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    if is_causal:
        t, s = q.shape[-2], k.shape[-2]
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
        attn_mask = causal if attn_mask is None else attn_mask & causal
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, -math.inf)
    return (logits.softmax(-1).nan_to_num(0.0) @ v).to(q.dtype)


def correct(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    return _attention(q, k, v, attn_mask, is_causal)


def exits_quietly(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """``os._exit(0)``: in process, the command exited 0 with no output."""
    os._exit(0)


def exits_after_a_few_calls(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                            is_causal: bool = False) -> Tensor:
    if q.shape[-2] * k.shape[-2] > 12:  # right on the smallest inputs, gone on a larger one
        os._exit(0)
    return _attention(q, k, v, attn_mask, is_causal)


def segfaults(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise AssertionError("unreachable")


def killed_as_by_the_memory_limit(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """SIGKILL, as the kernel's out-of-memory killer sends it."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def forks_and_exits_its_parent(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                               is_causal: bool = False) -> Tensor:
    """The call forks; the process that was called exits, its fork goes on and answers."""
    if os.fork() > 0:
        os._exit(0)
    return _attention(q, k, v, attn_mask, is_causal)


def hangs(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    while True:
        time.sleep(0.05)


def raises_past_4_keys(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                       is_causal: bool = False) -> Tensor:
    if k.shape[-2] > 4:
        raise ValueError(f"at most 4 keys (got {k.shape[-2]})")
    return _attention(q, k, v, attn_mask, is_causal)


def turns_gradients_off(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    out = _attention(q, k, v, attn_mask, is_causal)
    torch.set_grad_enabled(False)
    return out


def wrong_without_gradients(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                            is_causal: bool = False) -> Tensor:
    out = _attention(q, k, v, attn_mask, is_causal)
    return out if torch.is_grad_enabled() else out * 0.5


def wrong_in_inference_mode(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                            is_causal: bool = False) -> Tensor:
    out = _attention(q, k, v, attn_mask, is_causal)
    return out * 0.5 if torch.is_inference_mode_enabled() else out


class _Evil:
    """Unpickling this would call os.system in whatever process unpickles it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch isolation_evil_ran",))


def returns_a_pickle_that_runs_code(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Any:
    return _Evil()


def returns_a_tuple(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Any:
    return _attention(q, k, v, attn_mask, is_causal), None


class Liar(Tensor):
    """A tensor whose subtraction answers zeros: a comparison run on it would see no error."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]
        if func in (torch.sub, Tensor.sub, Tensor.__sub__, Tensor.__rsub__) and isinstance(out, Tensor):
            return out * 0
        return out


def lying_mean_of_values(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """Wrong (the mean of the values), returned as a tensor whose subtraction lies."""
    return v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1]).contiguous().as_subclass(Liar)


def raises_skip(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    from typed_transformer.audit.core.running import Skip

    raise Skip("not today")


def ignores_the_mask(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                     is_causal: bool = False) -> Tensor:
    return _attention(q, k, v, None, is_causal)
