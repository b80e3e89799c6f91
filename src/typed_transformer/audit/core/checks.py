"""The checks: each a small function over the :class:`~typed_transformer.audit.core.report.Adapter` protocol,
registered in the order the report lists them. Sizes and masks are drawn with :mod:`typed_transformer.strategies`.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Literal

import torch
from hypothesis import strategies as st
from torch import Tensor

from ...strategies import attention_shapes, keep_masks, key_padding_masks, seeds
from .conventions import DEFAULT_CONVENTIONS, Inputs
from .examples import Example, bound, error, mask_to_list
from .reference import effective_keep, reference_attention
from .running import LONG, CandidateRaised, CheckFailure, Run, Skip, candidate_code, register

MaskKind = Literal["none", "keep", "padding", "fully_masked"]


# ----------------------------------------------------------------------------------------------------
# Drawing
# ----------------------------------------------------------------------------------------------------


def draw_example(run: Run, data: st.DataObject, *, mask: MaskKind = "none", is_causal: bool = False,
                 min_batch: int = 1, min_len: int | None = None, max_len: int | None = None,
                 min_head_dim: int | None = None, max_head_dim: int | None = None,
                 amplitude: float = 1.0, single_query: bool = False) -> Example:
    """One example the candidate supports (its declarations narrow the sizes), with a mask of ``mask`` kind:
    a keep-mask with at least one key per row (per head when supported), a key padding mask ``(b, 1, 1, s)``,
    or a keep-mask whose query row 0 allows no key."""
    a, conv = run.adapter, run.adapter.conventions
    low, high = conv.lengths
    if max_len is not None and conv.lengths == DEFAULT_CONVENTIONS.lengths:
        high = max_len  # the default range may grow; a declared one is kept
    high = min([high, *_longest(run)])
    low = min(max(low, min_len or low), high)
    tied = a.fixed is not None and bool(a.fixed.get("tied", 0))
    same = conv.self_attention or tied
    # drawn first: Hypothesis shrinks earlier choices first, so a deep size shrinks while the rest (the batch,
    # heads, queries that make a failure likely) is still as generated
    deep = deep_sizes(run, data, same=same, min_len=low, max_len=max_len, min_head_dim=min_head_dim) if run.deep \
        else {}
    if a.fixed is not None:
        shape = data.draw(attention_shapes(max_batch=3, max_len=high, min_len=low, max_kv_heads=1, max_group=1,
                                           max_head_dim=1, max_value_dim=1, same_length=same), label="shape")
        sizes = {k: a.fixed[k] for k in ("h", "g", "d", "dv")}
        widths: tuple[int, int, int] | None = (a.fixed["eq"], a.fixed["ek"], a.fixed["ev"])
    else:
        d_low, d_high = conv.head_sizes
        if min_head_dim is not None:
            d_low = max(d_low, min_head_dim)
        if "s" in deep:  # long rows: with d = 1 every query row has the same largest key, one row in effect
            d_low = max(d_low, min(4, conv.head_sizes[1]))
        if max_head_dim is not None:
            d_high = max_head_dim
        m = conv.head_multiple
        if m > 2 and conv.head_sizes == DEFAULT_CONVENTIONS.head_sizes:
            d_high = max(d_high, 2 * m)  # two head sizes a kernel of multiples takes: m and 2m
        d_high = max(d_high, d_low)
        shape = data.draw(attention_shapes(max_batch=3, max_len=high, min_len=low, max_kv_heads=3,
                                           max_group=2 if conv.supports_gqa else 1, min_head_dim=d_low,
                                           max_head_dim=d_high, max_value_dim=d_high, head_dim_multiple=m,
                                           same_value_dim=conv.equal_head_sizes, same_length=same),
                          label="shape")
        if conv.head_size_multiple > 1:  # dv too (the strategy narrows d only)
            shape = dataclasses.replace(shape, dv=conv.head_size(shape.dv))
        widths = None
    shape = dataclasses.replace(shape, **deep)
    if a.fixed is None:
        sizes = {"h": shape.h, "g": shape.g, "d": shape.d, "dv": shape.dv}
    # long rows: 3 batch elements, so that a bug that shows on a few rows in ten still shows when shrunk; past LONG
    # keys, one batch element and at most two query heads (the float64 reference's logits grow as t * s)
    b = max(shape.b, min_batch, 3 if "s" in deep else 1)
    if deep.get("s", 0) > LONG:
        b = max(1, min_batch)
        if a.fixed is None and shape.h > 2:
            shape = dataclasses.replace(shape, g=min(shape.g, 2), r=1 if shape.g >= 2 else min(shape.r, 2))
            sizes = {"h": shape.h, "g": shape.g, "d": shape.d, "dv": shape.dv}
    t = 1 if single_query and not same and low <= 1 else shape.t
    t, s = conv.blocks(t, shape.s)  # a kernel of whole blocks: lengths rounded up, their order kept
    shape = dataclasses.replace(shape, t=t, s=t if same else s)
    keep: Tensor | None = None
    if mask in ("keep", "fully_masked"):
        heads = sizes["h"] if conv.per_head_masks and data.draw(st.booleans(), label="per_head") else 1
        keep = data.draw(keep_masks((b, heads, shape.t, shape.s)), label="keep")
        if mask == "fully_masked":
            keep[:, :, 0, :] = False
    elif mask == "padding":
        # positions matter (rotary, a position bias, a window): dropping padded keys must not renumber real ones
        styles: tuple[Literal["right", "random"], ...] = ("right",) if a.positional is not None else ("right", "random")
        keep = data.draw(key_padding_masks(b, shape.s, styles=styles), label="padding")[:, None, None, :]
    seed = data.draw(seeds(), label="seed")
    ramp = 2.0 if "s" in deep else 0.0  # long rows: keys grow along the sequence (see Example)
    shift = 1.0 if deep.get("s", 0) > LONG else 0.0  # past LONG keys: outputs near 1 (see Example)
    example = Example(b=b, t=shape.t, s=shape.s, **sizes, seed=seed, dtype=_name(run.dtype),
                      keep=mask_to_list(keep), is_causal=is_causal, amplitude=amplitude, widths=widths, tied=tied,
                      ramp=ramp, shift=shift)
    run.current = example
    return example


def _longest(run: Run) -> list[int]:
    """The longest lengths the candidate takes: a module's (its position table's) and ``max_length``, where given."""
    return [n for n in (run.adapter.longest, run.adapter.conventions.max_length) if n is not None]


def deep_sizes(run: Run, data: st.DataObject, *, same: bool, min_len: int, max_len: int | None,
               min_head_dim: int | None) -> dict[str, int]:
    """The sizes that replace the small example's on one axis, from the budget's deep lists: key and query
    lengths across the tiles (``run.deep == "lengths"``), or (``"sizes"``) a head size kernels specialise or a
    batch and head count above 4 (lengths stay small). Only what the candidate supports: declared ``lengths``,
    ``head_sizes``, ``even_head_size``, ``head_size_multiple``, ``max_length`` and a module's fixed sizes narrow
    the lists (the check's own ``max_len`` too: rope stays at 16); with nothing left, none.
    Every list shrinks to its first (smallest) element."""
    a, conv, budget = run.adapter, run.adapter.conventions, run.budget
    declared_len = conv.lengths != DEFAULT_CONVENTIONS.lengths
    high = conv.lengths[1] if declared_len else math.inf
    if max_len is not None:
        high = min(high, max_len)
    high = min([high, *_longest(run)])
    lengths = [n for n in budget.lengths if min_len <= n <= high]
    head_sizes: list[int] = []
    if a.fixed is None:
        d_low, d_high = conv.head_sizes if conv.head_sizes != DEFAULT_CONVENTIONS.head_sizes else (1, math.inf)
        head_sizes = [d for d in budget.head_sizes if max(d_low, min_head_dim or 1) <= d <= d_high
                      and d % conv.head_multiple == 0]
    widest = run.deep in ("widest", "longest")  # one example at each list's largest: the lists reversed
    if widest:
        lengths, head_sizes = lengths[::-1], head_sizes[::-1]
    batches, heads = (budget.batches[::-1], budget.heads[::-1]) if widest else (budget.batches, budget.heads)
    if run.deep in ("lengths", "longest"):
        focuses = ["lengths"] if lengths else []
    elif run.deep == "widest":
        focuses = ["batch"] if batches else []
    else:
        focuses = [name for name, values in (("head_sizes", head_sizes), ("batch", budget.batches)) if values]
    if not focuses:
        return {}
    focus = focuses[0] if len(focuses) == 1 else data.draw(st.sampled_from(focuses), label="deep")
    if focus == "lengths":
        s = data.draw(st.sampled_from(lengths), label="deep_s")
        # many query rows too (the longest example: as many as keys)
        t = s if same or run.deep == "longest" else data.draw(st.sampled_from(lengths), label="deep_t")
        return {"t": t, "s": s}
    if focus == "head_sizes":
        d = data.draw(st.sampled_from(head_sizes), label="deep_d")
        dv = d if conv.equal_head_sizes else data.draw(st.sampled_from([d, *head_sizes]), label="deep_dv")
        return {"d": d, "dv": dv}
    b = data.draw(st.sampled_from(batches), label="deep_b")
    if a.fixed is not None or not heads:
        return {"b": b}
    h = data.draw(st.sampled_from(heads), label="deep_h")
    groups = [g for g in range(h, 0, -1) if h % g == 0] if conv.supports_gqa else [h]
    g = data.draw(st.sampled_from(groups), label="deep_g")
    return {"b": b, "g": g, "r": h // g}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _length(example: Example) -> int:
    """The longest sum in the computation (for the tolerance floor)."""
    return example.s + example.d + (max(example.widths) if example.widths else 0)


def compare(run: Run, example: Example, *, keep: Tensor | None = None, is_causal: bool = False,
            what: str = "output", ins: Inputs | None = None) -> tuple[Tensor, float]:
    """Call the candidate on ``example`` and apply the FlashAttention rule; return ``(output, allowed)``."""
    a = run.adapter
    ins = example.inputs() if ins is None else ins
    out = a.call(ins, keep, is_causal, run.dtype)
    if half_rule(run):
        ref64, allowed, base = half_bound(run, ins, keep, is_causal, live_rows(run, example, keep, is_causal))
    else:
        ref64 = a.reference(ins, keep, is_causal, torch.float64)
    if tuple(out.shape) != tuple(ref64.shape):
        raise CheckFailure(f"{what}: output shape {tuple(out.shape)}, expected {tuple(ref64.shape)}", example)
    rows = live_rows(run, example, keep, is_causal)
    if not half_rule(run):
        reflow = a.reference(ins, keep, is_causal, run.dtype)
        allowed, base = bound(ref64, reflow, run.tolerance, run.dtype, rows=rows, amplification=a.logit_bound(ins),
                              length=_length(example))
    err = error(out, ref64, rows)
    ratio = err / base
    if not err <= allowed:
        hint = half_hint(run, ins, ref64, keep, is_causal, rows, err)
        raise CheckFailure(f"{what}: max error {err:.3g} > allowed {allowed:.3g} "
                           f"(ratio {ratio:.3g} to the reference's own error {base:.3g}){hint}", example, ratio)
    run.note(ratio)
    return out, allowed


#: The half-precision dtypes judged by :func:`half_bound`.
HALF = (torch.float16, torch.bfloat16)


def half_rule(run: Run) -> bool:
    """Whether the forward output is judged by :func:`half_bound`: a function's half-precision inputs (a module's
    weights are rounded too, which the float32 reference does not model: modules keep :func:`bound`'s rule)."""
    return run.dtype in HALF and run.adapter.kind == "function"


def half_bound(run: Run, ins: Inputs, keep: Tensor | None, is_causal: bool, rows: Tensor | None
               ) -> tuple[Tensor, float, float]:
    """``(ref64, allowed, base)`` for half-precision inputs, as a kernel that accumulates in float32 would do:
    the candidate receives the inputs rounded to its dtype, so ``ref64`` is the reference on those rounded
    inputs in float64; ``base`` is what the reference itself achieves run the good kernel's way (the rounded
    inputs computed in float32, the output rounded to the dtype) against ``ref64``, or one unit in the last
    place of ``max(1, max|ref64|)`` when that is larger (the output's own rounding is half of one). It does not
    grow with the logits: a kernel whose logits overflow, or lose their digits in half precision, fails.
    Allowed: ``tolerance * base``."""
    a = run.adapter
    q, k, v = (x.to(run.dtype).double() for x in ins)
    rounded: Inputs = (q, k, v)
    ref64 = a.reference(rounded, keep, is_causal, torch.float64)
    good = a.reference(rounded, keep, is_causal, torch.float32).to(run.dtype)
    allowed, base = bound(ref64, good, run.tolerance, run.dtype, rows=rows, floor_ulps=1.0)
    if a.conventions.half_precision == "plain":  # FlashAttention's tests' standard: plain math in the dtype
        plain_allowed, plain_base = plain_bound(run, rounded, ref64, keep, is_causal, rows)
        if plain_base > base:
            allowed, base = plain_allowed, plain_base
    return ref64, allowed, base


def plain_bound(run: Run, rounded: Inputs, ref64: Tensor, keep: Tensor | None, is_causal: bool,
                rows: Tensor | None) -> tuple[float, float]:
    """``(allowed, base)`` as plain PyTorch math does it in the run's half dtype: the reference on the rounded
    inputs written out in that dtype (logits, softmax and ``P @ V``; a function's reference is the paper's attention
    in its conventions, which ``half_rule`` makes the case), against ``ref64``."""
    q, k, v = (x.to(run.dtype) for x in rounded)
    plain = reference_attention(q, k, v, keep, is_causal=is_causal, conventions=run.adapter.conventions,
                                softmax_dtype=run.dtype)
    return bound(ref64, plain, run.tolerance, run.dtype, rows=rows, floor_ulps=1.0)


def half_hint(run: Run, ins: Inputs, ref64: Tensor, keep: Tensor | None, is_causal: bool, rows: Tensor | None,
              err: float) -> str:
    """Why a half-precision output failed the float32 standard, when plain math in the dtype does as badly: its
    logits, softmax or sums run in the half dtype (the sentence is added to the failure), else ``""``."""
    if not half_rule(run) or run.adapter.conventions.half_precision != "float32" or not math.isfinite(err):
        return ""
    rounded: Inputs = tuple(x.to(run.dtype).double() for x in ins)  # type: ignore[assignment]
    allowed, _ = plain_bound(run, rounded, ref64, keep, is_causal, rows)
    if not err <= allowed:
        return ""
    name = _name(run.dtype)
    return (f". Plain PyTorch math in {name} errs by {allowed / run.tolerance:.3g} on these inputs, and this is "
            f"within {run.tolerance:g}x of that: its logits, softmax or sums run in {name}, where torch's SDPA and "
            f"Hugging Face's eager attention upcast to float32 first. Fix: compute them in float32 and cast the "
            f"output back, or declare half_precision='plain' to hold it to plain {name} math")


def live_rows(run: Run, example: Example, keep: Tensor | None, is_causal: bool) -> Tensor | None:
    """Rows compared: all, unless ``fully_masked="any"`` leaves rows without an allowed key unchecked."""
    if run.adapter.conventions.fully_masked != "any":
        return None
    eff = effective_keep(keep, is_causal, example.t, example.s, run.adapter.conventions)
    return None if eff is None else run.adapter.rows(eff, example)


def same(a: Tensor, b: Tensor, allowed: float, example: Example, what: str, rows: Tensor | None = None) -> None:
    err = error(a, b, rows)
    if not err <= 2 * allowed:
        raise CheckFailure(f"{what}: outputs differ by {err:.3g} > {2 * allowed:.3g}", example)


def keys_map(run: Run, ins: Inputs, fn: Callable[[Tensor], Tensor]) -> Inputs:
    """Apply ``fn`` to the keys and values (to the one input of a tied module: queries change with it)."""
    q, k, v = ins
    if k is q:
        x = fn(q)
        return x, x, x
    return q, fn(k), fn(v)


def batch(ins: Inputs, i: int) -> Inputs:
    q, k, v = ins
    if k is q:
        x = q[i:i + 1]
        return x, x, x
    return q[i:i + 1], k[i:i + 1], v[i:i + 1]


def _need_mask(run: Run) -> None:
    if not run.adapter.conventions.supports_mask:
        raise Skip("supports_mask=False")


def _need_causal(run: Run) -> None:
    conv = run.adapter.conventions
    if not conv.supports_causal and not conv.always_causal:
        raise Skip("supports_causal=False")


# ----------------------------------------------------------------------------------------------------
# The checks, in report order
# ----------------------------------------------------------------------------------------------------


@register("reference")
def reference(run: Run, data: st.DataObject) -> None:
    """Plain attention (no mask) against the float64 reference; a function is called under ``torch.no_grad()`` and
    ``torch.inference_mode()`` too, as inference calls it (torch's own attention takes another kernel there)."""
    example = draw_example(run, data)
    compare(run, example)
    if run.adapter.kind == "function":
        with torch.no_grad():
            compare(run, example, what="output under torch.no_grad()")
        _under_inference_mode(run, example)


def _under_inference_mode(run: Run, example: Example) -> None:
    """The call under ``torch.inference_mode()``, where the candidate allows it: a refusal that names inference
    tensors (one saved for backward, or updated in place) is the candidate's choice, not a wrong output."""
    try:
        with torch.inference_mode():
            compare(run, example, what="output under torch.inference_mode()")
    except CandidateRaised as raised:
        if "inference tensor" not in str(raised.__cause__ or raised).lower():
            raise


@register("scale", kinds=("function",))
def scale(run: Run, data: st.DataObject) -> None:
    """Large head sizes, where a wrong logit scale (missing, or sqrt(d) twice) changes the output a lot."""
    if run.adapter.fixed is not None:
        raise Skip("the module fixes the head size (the reference check uses its scale)")
    low, high = run.adapter.conventions.head_sizes
    high = 64 if (low, high) == (1, 8) else high  # the default range: go large; a declared one: stay inside
    example = draw_example(run, data, min_head_dim=min(max(low, 16), high), max_head_dim=high)
    compare(run, example, what="scale")


@register("causality")
def causality(run: Run, data: st.DataObject) -> None:
    """``is_causal=True`` against the reference, and a query's output does not move when keys it may not see
    change."""
    _need_causal(run)
    # a single query (decoding) a quarter of the time: its causal rule differs between libraries
    single = data.draw(st.sampled_from([False, False, False, True]), label="single_query")
    example = draw_example(run, data, is_causal=True, single_query=single)
    out, allowed = compare(run, example, is_causal=True, what="is_causal=True")
    visible = effective_keep(None, True, example.t, example.s, run.adapter.conventions)
    assert visible is not None
    ins = example.inputs()
    visible = visible[0, 0]
    for i in range(example.t):
        future = ~visible[i]
        if not future.any() or not visible[i].any():
            continue

        def perturb(x: Tensor, future: Tensor = future) -> Tensor:
            x = x.clone()
            x[..., future, :] += 3.0
            return x

        out2 = run.adapter.call(keys_map(run, ins, perturb), None, True, run.dtype)
        err = error(out2[..., i:i + 1, :], out[..., i:i + 1, :])
        if not err <= 2 * allowed:
            raise CheckFailure(f"query {i} changed by {err:.3g} when keys it may not see changed "
                               f"({run.adapter.conventions.causal_alignment} alignment)", example)
        break


@register("batch_independence")
def batch_independence(run: Run, data: st.DataObject) -> None:
    """Each batch element alone gives what it gives inside the batch."""
    example = draw_example(run, data, min_batch=2)
    out, allowed = compare(run, example, what="batched output")
    ins = example.inputs()
    for i in range(example.b):
        single = run.adapter.call(batch(ins, i), None, False, run.dtype)
        same(out[i:i + 1], single, allowed, example, f"batch element {i} alone vs in the batch")


@register("permutation")
def permutation(run: Run, data: st.DataObject) -> None:
    """Permuting keys and values leaves the output alone; permuting queries permutes it (a tied module:
    permuting its one input permutes the output)."""
    if run.adapter.positional is not None:
        raise Skip(f"{run.adapter.positional}: order matters")
    if run.adapter.conventions.always_causal:
        raise Skip("always causal: order matters")
    example = draw_example(run, data)
    key_perm, query_perm = _permutation(run, data, example.s, "key_perm"), _permutation(run, data, example.t,
                                                                                        "query_perm")
    out, allowed = compare(run, example)
    q, k, v = ins = example.inputs()
    if k is q:
        permuted = run.adapter.call(keys_map(run, ins, lambda x: x[..., key_perm, :]), None, False, run.dtype)
        same(permuted, out[..., key_perm, :], allowed, example, f"input positions permuted by {key_perm.tolist()}")
        return
    permuted_keys = run.adapter.call(keys_map(run, ins, lambda x: x[..., key_perm, :]), None, False, run.dtype)
    same(permuted_keys, out, allowed, example, f"keys and values permuted by {key_perm.tolist()}")
    permuted_queries = run.adapter.call((q[..., query_perm, :], k, v), None, False, run.dtype)
    same(permuted_queries, out[..., query_perm, :], allowed, example, f"queries permuted by {query_perm.tolist()}")


def _permutation(run: Run, data: st.DataObject, n: int, label: str) -> Tensor:
    """A permutation of ``range(n)``: drawn element by element for the small examples (it shrinks to a single
    swap), from a seed at the deep sizes (shrinking 129 elements one by one would take thousands of calls)."""
    if not run.deep:
        return torch.tensor(data.draw(st.permutations(range(n)), label=label))
    return torch.randperm(n, generator=torch.Generator().manual_seed(data.draw(seeds(), label=label)))


@register("masking")
def masking(run: Run, data: st.DataObject) -> None:
    """A boolean keep-mask ``(b, 1, t, s)`` or, where supported, per head ``(b, h, t, s)``."""
    _need_mask(run)
    example = draw_example(run, data, mask="keep")
    keep = example.mask()
    conv = run.adapter.conventions
    compare(run, example, keep=keep, what=f"attn_mask {tuple(keep.shape) if keep is not None else ''} "
            f"({conv.mask_kind}, {conv.mask_polarity} polarity)")


@register("padding")
def padding(run: Run, data: st.DataObject) -> None:
    """A key padding mask ``(b, 1, 1, s)`` equals dropping each batch element's padded keys (a tied module:
    its padded positions; right padding only where positions matter)."""
    _need_mask(run)
    example = draw_example(run, data, mask="padding")
    keep = example.mask()
    assert keep is not None
    out, allowed = compare(run, example, keep=keep, what="key padding mask (b, 1, 1, s)")
    if run.adapter.conventions.always_causal:
        return  # dropping keys would move the causal diagonal: the comparison with the reference is the check
    ins = example.inputs()
    # one input, or t = s required: dropping a padded key drops that query position too
    positions = ins[1] is ins[0] or run.adapter.conventions.self_attention
    if run.adapter.rotary is not None and getattr(getattr(run.adapter, "spec", None), "keys_with_input", False):
        return  # the input's tokens turn at positions s.. after the memory's s keys: dropping keys moves them
    for i in range(example.b):
        real = keep[i, 0, 0].nonzero().flatten()
        if len(real) < run.adapter.conventions.lengths[0] or len(real) % run.adapter.conventions.length_multiple:
            continue  # shorter than the candidate supports, or not whole blocks (the reference comparison stands)

        def keep_real(x: Tensor, real: Tensor = real) -> Tensor:
            return x[..., real, :]

        q, k, v = batch(ins, i)
        alone_ins = keys_map(run, (q, k, v), keep_real)
        if positions and alone_ins[0] is not alone_ins[1]:
            alone_ins = (keep_real(q), alone_ins[1], alone_ins[2])
        alone = run.adapter.call(alone_ins, None, False, run.dtype)
        mine = out[i:i + 1, ..., real, :] if positions else out[i:i + 1]
        same(mine, alone, allowed, example, f"batch element {i}: padding to {example.s} keys vs keeping only the "
             f"{len(real)} real ones {real.tolist()}")


@register("fully_masked")
def fully_masked(run: Run, data: st.DataObject) -> None:
    """A query row without any allowed key gives what ``fully_masked`` declares (zeros, NaN or the mean of the
    values); the other rows stay right."""
    _need_mask(run)
    conv = run.adapter.conventions
    if conv.fully_masked == "any":
        raise Skip("fully_masked='any' declared")
    example = draw_example(run, data, mask="fully_masked")
    compare(run, example, keep=example.mask(), what=f"fully masked query row 0 (declared {conv.fully_masked!r})")


@register("mask_and_causal")
def mask_and_causal(run: Run, data: st.DataObject) -> None:
    """``attn_mask`` and ``is_causal=True`` together: both apply (ANDed)."""
    _need_mask(run)
    _need_causal(run)
    if not run.adapter.conventions.supports_causal:
        raise Skip("always causal: masking checks the mask with the causal mask")
    if not run.adapter.conventions.mask_with_causal:
        raise Skip("mask_with_causal=False")
    example = draw_example(run, data, mask="keep", is_causal=True)
    compare(run, example, keep=example.mask(), is_causal=True, what="attn_mask with is_causal=True")


@register("large_logits")
def large_logits(run: Run, data: st.DataObject) -> None:
    """Inputs scaled so that the logits reach +-100 to +-1e5: either the largest logit reaches the target (a
    softmax without max subtraction overflows) or, with a mask, the largest allowed logit of some row sinks to
    -target (a finite mask fill such as -1e4 then outweighs every allowed key)."""
    mask: MaskKind = "none"
    if run.adapter.conventions.supports_mask:
        mask = data.draw(st.sampled_from(["keep", "padding", "none"]), label="mask")
    example = draw_example(run, data, mask=mask)
    keep = example.mask()
    sink = keep is not None and data.draw(st.booleans(), label="sink_a_row")
    targets = [1e5, 1e4] if sink else [1e3, 1e5, 1e2, 1e4]  # a fill of -1e4 leaks from a row at -1e4 down
    target = data.draw(st.sampled_from(targets), label="logit_target")
    logits = run.adapter.logits(example.inputs())
    reach = float(logits.abs().max())
    how = "largest |logit|"
    if sink and keep is not None:
        # the most negative logit of a row with at least two keys becomes that row's only allowed key
        full = keep.expand_as(logits).clone()
        candidates = logits.masked_fill(~full, math.inf) if example.s > 1 else logits.new_full(logits.shape, math.inf)
        lowest = float(candidates.min())
        if lowest < 0:
            index = int(candidates.argmin())
            b, h, t, s = (int(i) for i in torch.unravel_index(torch.tensor(index), logits.shape))
            if keep.shape[1] == 1:  # keep the mask's head layout: the row changes for every head
                keep, h = keep.expand(keep.shape[0], 1, example.t, example.s).clone(), 0
            else:
                keep = full
            keep[b, h, t] = False
            keep[b, h, t, s] = True
            reach, how = -lowest, "a row's only allowed logit at -target"
            example = dataclasses.replace(example, keep=mask_to_list(keep))
    amplitude = math.sqrt(target / max(reach, 1e-6))
    example = dataclasses.replace(example, amplitude=amplitude)
    run.current = example
    compare(run, example, keep=keep, what=f"logits scaled to {target:g} ({how})")


@register("gradients")
def gradients(run: Run, data: st.DataObject) -> None:
    """Gradients with respect to every input against the reference's, with no mask, a keep-mask, a causal
    mask or (declared ``zero``) fully masked rows, whose gradients must be finite (zero)."""
    a, conv = run.adapter, run.adapter.conventions
    if not conv.supports_autograd:
        raise Skip("supports_autograd=False")
    kinds: list[MaskKind | Literal["causal"]] = ["none"]
    if conv.supports_mask:
        kinds.append("keep")
        if conv.fully_masked == "zero":  # NaN rows have no gradient; uniform rows' "gradient" is not defined
            kinds.append("fully_masked")
    if conv.supports_causal:
        kinds.append("causal")
    if conv.always_causal and conv.fully_masked in ("nan", "any"):
        kinds = ["none"]  # a mask ANDed with the candidate's own causal mask may leave NaN rows
    kind: MaskKind | Literal["causal"] = data.draw(st.sampled_from(kinds), label="mask")
    example = draw_example(run, data, mask="none" if kind == "causal" else kind, is_causal=kind == "causal")
    if ((kind == "causal" or conv.always_causal) and conv.fully_masked in ("nan", "any", "uniform")
            and example.t > example.s):
        # a declaration that allows NaN rows: bottom-right causal rows without keys (t > s) would carry NaN into
        # every gradient of the softmax (dk and dv too); a uniform row's gradient is not defined (it depends on
        # the fill): those rows are not drawn here (listed as not tested)
        example = dataclasses.replace(example, t=example.s)
        run.current = example
    keep, is_causal = example.mask(), example.is_causal
    ins = example.inputs()
    tied = ins[1] is ins[0]
    out_shape = a.reference(ins, keep, is_causal, torch.float64).shape
    cotangent = torch.randn(out_shape, generator=torch.Generator().manual_seed(example.seed + 4),
                            dtype=torch.float64)
    rows = live_rows(run, example, keep, is_causal)
    if rows is not None:
        cotangent = cotangent * rows

    def grads(fn: Callable[[Inputs, Tensor | None, bool, torch.dtype], Tensor], dtype: torch.dtype) -> list[Tensor]:
        leaves = [x.to(dtype).detach().requires_grad_(True) for x in (ins[:1] if tied else ins)]
        leaf_ins: Inputs = (leaves[0], leaves[0], leaves[0]) if tied else (leaves[0], leaves[1], leaves[2])
        out = fn(leaf_ins, keep, is_causal, dtype)
        with candidate_code():  # the candidate's backward (or an output of the wrong shape)
            torch.autograd.backward([(out.double().nan_to_num(0.0) * cotangent).sum()])
        return [x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves]

    g64, glow, gcand = grads(a.reference, torch.float64), grads(a.reference, run.dtype), grads(a.call, run.dtype)
    for name, r64, rlow, c in zip(("x",) if tied else ("q", "k", "v"), g64, glow, gcand, strict=True):
        allowed, base = bound(r64, rlow, run.tolerance, run.dtype, floor_ulps=16.0, amplification=a.logit_bound(ins),
                              length=_length(example))
        err = error(c, r64)
        if not err <= allowed:
            raise CheckFailure(f"d{name} ({kind} mask): max error {err:.3g} > allowed {allowed:.3g}", example,
                               err / base)
        run.note(err / base)


@register("dtype")
def dtype(run: Run, data: st.DataObject) -> None:
    """The output comes back in the input dtype."""
    example = draw_example(run, data)
    out = run.adapter.call(example.inputs(), None, False, run.dtype)
    if out.dtype != run.dtype:
        raise CheckFailure(f"output dtype {out.dtype}, inputs {run.dtype}", example)


@register("rope", kinds=("module",))
def rope(run: Run, data: st.DataObject) -> None:
    """A module's rotary embedding against the reference rotary (base and pairing from the spec), at
    lengths up to 16 (with a causal mask when supported)."""
    if run.adapter.rotary is None:
        raise Skip("no rotary embedding declared")
    is_causal = run.adapter.conventions.supports_causal and data.draw(st.booleans(), label="is_causal")
    example = draw_example(run, data, min_len=2, max_len=16, is_causal=is_causal)
    frequencies = ("frequencies of the module's rotary class" if getattr(run.adapter, "rotary_frequencies", None)
                   else f"base {run.adapter.rotary[0]:g}")
    compare(run, example, is_causal=is_causal, what=f"rotary embedding ({run.adapter.rotary[1]} pairs, "
            f"{frequencies})")


@register("incremental_decoding", kinds=("module",))
def incremental_decoding(run: Run, data: st.DataObject) -> None:
    """Token by token with the candidate's KV cache equals the full causal pass (and the reference)."""
    a = run.adapter
    if a.fixed is None or not a.fixed.get("tied"):
        raise Skip("no KV cache declared (self-attention modules with a decode function only)")
    example = draw_example(run, data, min_len=2, is_causal=True)
    ins = example.inputs()
    decoded = a.decode(ins, run.dtype)
    if decoded is None:
        raise Skip("no KV cache declared (the spec has no decode function)")
    full, allowed = compare(run, example, is_causal=True, what="full causal pass")
    ref64 = a.reference(ins, None, True, torch.float64)
    err = error(decoded, ref64)
    if not err <= allowed:
        worst = int((decoded.double() - ref64).abs().nan_to_num(math.inf).amax(dim=(0, 2)).argmax())
        raise CheckFailure(f"token-by-token decoding with the cache differs from the full causal pass by {err:.3g} "
                           f"> {allowed:.3g} (worst at position {worst})", example)
    same(decoded, full, allowed, example, "token-by-token decoding vs the candidate's full causal pass")


@register("fast_path", kinds=("module",), deep=False)
def fast_path(run: Run, data: st.DataObject) -> None:
    """The module's inference fast path (nn.MultiheadAttention: eval, no grad, batch-first self-attention with
    a key padding mask, including fully padded batch elements): real positions equal the reference, and a fully
    padded element gives what ``fully_masked`` declares (NaN only with ``"nan"`` or ``"any"``)."""
    a = run.adapter
    if a.fixed is None or not a.fixed.get("fast_path"):
        raise Skip("no fast path declared")
    conv = a.conventions
    t = data.draw(st.integers(conv.lengths[0], conv.lengths[1]), label="t")
    b = data.draw(st.integers(2, 3), label="b")
    real = data.draw(key_padding_masks(b, t, fully_padded_rows=True), label="padding")
    seed = data.draw(seeds(), label="seed")
    example = Example(b=b, h=a.fixed["h"], g=a.fixed["g"], t=t, s=t, d=a.fixed["d"], dv=a.fixed["dv"], seed=seed,
                      dtype=_name(run.dtype), keep=mask_to_list(real[:, None, None, :]),
                      widths=(a.fixed["eq"], a.fixed["ek"], a.fixed["ev"]), tied=True)
    run.current = example
    ins = example.inputs()
    out = a.fast_path(ins[0], real, run.dtype)
    if out is None:
        raise Skip("the module cannot take its fast path")
    keep = real[:, None, None, :]
    ref64 = a.reference(ins, keep, False, torch.float64)
    reflow = a.reference(ins, keep, False, run.dtype)
    rows = real[:, :, None]  # real query positions (padded ones are not computed by the nested-tensor path)
    allowed, base = bound(ref64, reflow, run.tolerance, run.dtype, rows=rows, amplification=a.logit_bound(ins),
                          length=_length(example))
    err = error(out, ref64, rows)
    if not err <= allowed:
        raise CheckFailure(f"fast path: max error {err:.3g} > allowed {allowed:.3g} at real positions", example,
                           err / base)
    run.note(err / base)
    dead = ~real.any(dim=-1)
    if conv.fully_masked in ("zero", "uniform") and bool(dead.any()):
        rows_dead = out[dead]
        if not bool(torch.isfinite(rows_dead).all()):
            raise CheckFailure(f"fast path: a fully padded batch element gave {rows_dead.flatten()[:3].tolist()}..., "
                               f"declared fully_masked={conv.fully_masked!r}", example)
