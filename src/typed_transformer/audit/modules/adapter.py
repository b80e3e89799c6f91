"""The adapter that calls a module under its spec and computes the reference from the same weights:
:class:`ModuleAdapter`."""

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import torch
from einops import einsum, rearrange, repeat
from jaxtyping import Bool, Float, Float64
from torch import Tensor, nn

from ...masks import window_mask
from ...positions import alibi_slopes
from ...shapecheck import shape_checked
from ..core.conventions import AuditUsageError, CandidateOutput, Conventions, Inputs, KeepMask, ModuleInputs
from ..core.examples import Example, example_fields, import_line, repro_comparison
from ..core.reference import effective_keep, reference_attention, rotate
from ..core.running import candidate_code
from .masking import block_mask, local_mask
from .positions import Disentangled, RelativeKeys, alibi_bias, decomposed_bias, disentangled_rows, mrope_positions
from .repro import _constructor_lines, _rebuild, weights_lines
from .spec import SHIPPED_SPECS, ModuleSpec, resolve
from .weights import _linear, _norm, latent_projections, spec_weights


def _relative_keys(module: Any, spec: ModuleSpec, rk: RelativeKeys, h: int) -> tuple[Tensor, Tensor | None]:
    """The relative embeddings ``(n, h, d)`` in float64 (projected, or one table shared by the heads) and the bias the
    queries meet them with."""
    table = rk.table(module).detach().double()
    if rk.proj is not None:
        weight, bias = _linear(module, rk.proj, spec)
        table = einsum(table, weight, "n e, o e -> n o") + (0.0 if bias is None else bias)
        table = rearrange(table, "n (h d) -> n h d", h=h)
    else:
        table = repeat(table, "n d -> n h d", h=h)
    extra = None if rk.query_bias is None else resolve(module, rk.query_bias, spec.name).detach().double()
    if rk.content_bias is not None:  # the queries carry u (folded into their bias): the positional term takes v - u
        u = resolve(module, rk.content_bias, spec.name).detach().double()
        extra = -u if extra is None else extra - u
    return table, extra


def _disentangled(module: Any, spec: ModuleSpec, dz: Disentangled, h: int
                  ) -> tuple[Tensor | None, Tensor | None, Literal["v1", "v2"], int, int]:
    """DeBERTa's position keys and queries ``(h, n, d)`` (each None where its term is off), in float64, from the
    spec's relative-embedding table; with the rows' form, buckets and largest position."""
    terms = [str(term) for term in (resolve(module, dz.terms, spec.name) or [])]
    share = bool(resolve(module, dz.share_key, spec.name)) if dz.form == "v2" else False
    table = dz.table(module).detach().double()

    def embed(path: str) -> Tensor:
        weight, bias = _linear(module, path, spec)
        out = einsum(table, weight, "n e, o e -> n o") + (0.0 if bias is None else bias)
        return rearrange(out, "n (h d) -> h n d", h=h)

    kr = embed(spec.k if share and spec.k else dz.key_proj) if "c2p" in terms else None
    qr = embed(spec.q if share and spec.q else dz.query_proj) if "p2c" in terms else None
    buckets = dz.buckets if isinstance(dz.buckets, int) else int(resolve(module, dz.buckets, spec.name))
    return kr, qr, dz.form, buckets, int(resolve(module, dz.max_position, spec.name))


def module_device(module: nn.Module) -> torch.device | None:
    """Where ``module``'s parameters (else its buffers) are; None for a module with neither."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return None


def _check_fits(module: nn.Module, spec: ModuleSpec) -> None:
    """Refuses a module of another class than the spec's, or with an option the spec does not model."""
    if spec.module_type and not any(spec.module_type == f"{c.__module__}.{c.__qualname__}"
                                    for c in type(module).__mro__):
        raise AuditUsageError(f"{type(module).__module__}.{type(module).__qualname__} does not match spec "
                              f"{spec.name!r}: expected a {spec.module_type} (a class of the same shape: reuse "
                              f"the spec as dataclasses.replace(SPECS[{spec.name!r}], module_type=''))")
    unmodelled = [] if spec.unmodelled is None else spec.unmodelled(module)
    if unmodelled:
        raise AuditUsageError(f"spec {spec.name!r} does not model {type(module).__qualname__}'s option"
                              f"{'s' if len(unmodelled) > 1 else ''} {', '.join(unmodelled)}: the audit would "
                              f"compare it with attention it does not compute (write a spec that models it)")


@shape_checked
class ModuleAdapter:
    """The :class:`~typed_transformer.audit.core.report.Adapter` of a module: the checks call a deep copy of it (one
    per dtype, in eval mode); the reference uses its weights in float64."""

    kind: Literal["function", "module"] = "module"
    __shape_checked__ = ("call", "bias", "gated", "with_content", "visible", "reference", "logit_bound", "logits",
                         "rows", "decode", "fast_path")

    def __init__(self, module: nn.Module, spec: ModuleSpec, *, conventions: Conventions | None = None,
                 name: str | None = None, device: torch.device | str | None = None) -> None:
        _check_fits(module, spec)
        self.spec = spec
        #: where the module's copies run (default: where its parameters are; None: the CPU); the weights the
        #: reference reads, and the reference, stay on the CPU
        self.device = module_device(module) if device is None else torch.device(device)
        if self.device is not None and self.device.type == "cpu":
            self.device = None
        self.original = copy.deepcopy(module).eval()
        if self.device is not None:
            self.original = self.original.to("cpu")
        self.weights = spec_weights(self.original, spec)
        if spec.relative_keys is not None and spec.relative_keys.content_bias is not None:
            # Transformer-XL's content logits use q + u: u joins the query bias (the positional term subtracts it)
            u = resolve(self.original, spec.relative_keys.content_bias, spec.name).detach().double().reshape(-1)
            self.weights = dataclasses.replace(self.weights, bq=u if self.weights.bq is None else self.weights.bq + u)
        w = self.weights
        self.conventions = dataclasses.replace(conventions or spec.conventions, scale=w.scale,
                                               supports_gqa=w.g != w.h, enable_gqa=False)
        self.name = name or f"{type(module).__module__}.{type(module).__qualname__} (spec {spec.name})"
        #: the longest sequence the module takes (the spec's ``max_length``), None: any
        self.longest: int | None = None
        if spec.max_length is not None:
            longest = spec.max_length if isinstance(spec.max_length, int) \
                else resolve(self.original, spec.max_length, spec.name)
            self.longest = None if longest is None else int(longest)
        tied = self.conventions.self_attention
        self.fixed: dict[str, int] | None = {
            "h": w.h, "g": w.g, "d": w.d, "dv": w.dv, "eq": w.wq.shape[1], "ek": w.wk.shape[1],
            "ev": w.wv.shape[1], "tied": int(tied), "fast_path": int(spec.fast_path is not None)}
        self._read_rotary(module)
        self._read_windows()
        self._read_logits(module)
        self._read_relative_positions()
        positional = [what for what, present in (("rotary positions", self.rotary is not None),
                                                  ("a position bias", spec.position_bias is not None
                                                   or spec.alibi is not None or spec.decomposed is not None
                                                   or spec.disentangled is not None
                                                   or spec.relative_keys is not None),
                                                  ("a sliding window", self.window is not None),
                                                  ("blocks of keys", self.blocks is not None),
                                                  ("a local window", self.radius is not None)) if present]
        self.positional: str | None = ", ".join(positional) or None
        self._copies: dict[torch.dtype, nn.Module] = {}
        self._setup: str | None = None
        self._given = module


    def _read_rotary(self, module: nn.Module) -> None:
        """The spec's rotary positions, read from the module: base, style, rotated dimensions, frequencies, M-RoPE."""
        spec, w = self.spec, self.weights
        self.rotary: tuple[float, Literal["half", "interleaved"]] | None = None
        self.rotary_dims = w.d
        #: variants the diagnosis of a failure tries (:mod:`typed_transformer.audit.core.causes`): the last
        #: dimensions rotated instead of the first, the rotary tables and the softmax computed in another dtype
        self.rotary_last = False
        self.rotary_tables = torch.float64
        #: the inverse frequencies and cos/sin factor of a rope type other than the default (None: ``base``'s)
        self.rotary_frequencies: tuple[Tensor, float] | None = None
        self.softmax_dtype: torch.dtype | None = None
        self.softmax_over_queries = False  # another variant: the softmax over the wrong axis
        #: the tokens before the rotated ones (the rotary's ``prefix``)
        self.rotary_prefix = 0
        if spec.rotary is not None and (spec.rotary.when is None
                                        or resolve(self.original, spec.rotary.when, spec.name) is not None):
            prefix = spec.rotary.prefix
            self.rotary_prefix = int(prefix if isinstance(prefix, int) else resolve(self.original, prefix, spec.name))
            base = spec.rotary.base
            base = float(base if isinstance(base, float | int) else resolve(self.original, base, spec.name))
            self.rotary = (base, spec.rotary.style)
            fraction = spec.rotary.fraction
            fraction = float(fraction if isinstance(fraction, float | int)
                             else resolve(self.original, fraction, spec.name))
            self.rotary_dims = int(w.d * fraction)
            if spec.rotary.frequencies is not None:
                inverse, magnitude = spec.rotary.frequencies(self.original)
                self.rotary_frequencies = (inverse.detach().double(), float(magnitude))
        #: a latent attention module's projections (None: linear ones, from :attr:`weights`)
        self.latent = None if spec.latent is None else latent_projections(self.original, spec)
        if spec.latent is not None and self.rotary is not None:  # the last ``rope`` features of each head turn
            self.rotary_dims, self.rotary_last = int(resolve(self.original, spec.latent.rope, spec.name)), True
        #: M-RoPE: the axis (0, 1, 2) of the 3-D position each rotated frequency turns by (None: 1-D positions)
        self.mrope_axes: Tensor | None = None
        #: blocked axial rotary: the axis of each block of rotated features (None: not blocked)
        self.mrope_blocks: tuple[int, ...] | None = None
        if spec.mrope is not None and self.rotary is not None and spec.mrope.blocks:
            if spec.mrope.axes is None or self.rotary_dims % (2 * len(spec.mrope.axes)):
                raise AuditUsageError(f"spec {spec.name!r}: blocked M-RoPE needs axes that split the "
                                      f"{self.rotary_dims} rotated features into blocks of whole pairs")
            self.mrope_blocks = spec.mrope.axes
        elif spec.mrope is not None and self.rotary is not None:
            sections, axes = spec.mrope.sections, spec.mrope.axes
            sizes = [int(n) for n in (sections if isinstance(sections, tuple) else sections(self.original)
                                      if callable(sections) else resolve(self.original, sections, spec.name))]
            if sum(sizes) != self.rotary_dims // 2:
                raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: M-RoPE sections "
                                      f"{sizes} do not sum to the {self.rotary_dims // 2} rotated frequencies")
            self.mrope_axes = torch.cat([torch.full((n,), i % 3 if axes is None else axes[i])
                                         for i, n in enumerate(sizes)])

    def _read_windows(self) -> None:
        """The spec's sliding window, blocks of keys and local window, read from the module."""
        spec = self.spec
        window = spec.window
        if isinstance(window, str):
            window = resolve(self.original, window, spec.name)  # None: this module has no window
        self.window: int | None = None if window is None else int(window)
        blocks = spec.blocks
        if isinstance(blocks, str):
            blocks = resolve(self.original, blocks, spec.name)
        #: the block size of block-local attention (None: none)
        self.blocks: int | None = None if blocks is None else int(blocks)
        if self.blocks is not None and not self.conventions.self_attention:
            raise AuditUsageError(f"spec {spec.name!r}: block-local attention cuts the queries and the keys into the "
                                  f"same blocks, so it needs self-attention")
        radius = spec.radius
        if isinstance(radius, str):
            radius = resolve(self.original, radius, spec.name)  # None: this module has no local window
        #: the two-sided local window's radius (None: none)
        self.radius: int | None = None if radius is None else int(radius)
        if self.radius is not None and self.radius < 0:
            raise AuditUsageError(f"spec {spec.name!r}: a local window's radius is at least 0, got {self.radius}")

    def _read_logits(self, module: nn.Module) -> None:
        """What the spec computes between the projections and the softmax: norms, soft-cap, clipping, sub-norm,
        ALiBi and differential attention."""
        spec, w = self.spec, self.weights
        self.norms: dict[str, Callable[[Tensor], Tensor]] = {}
        for which, path in (("q", spec.q_norm), ("k", spec.k_norm), ("v", spec.v_norm)):
            norm = None if path is None else _norm(self.original, path, spec)
            if norm is not None:
                self.norms[which] = norm
        if spec.norms is not None:
            self.norms.update(spec.norms(self.original))
        cap = spec.softcap if spec.softcap is None or isinstance(spec.softcap, float | int) else resolve(
            self.original, spec.softcap, spec.name)
        #: the logit cap (None: no soft-capping; a config's 0 or None switches it off)
        self.softcap: float | None = float(cap) if cap else None
        clip = spec.clip_qkv if spec.clip_qkv is None or isinstance(spec.clip_qkv, float | int) else resolve(
            self.original, spec.clip_qkv, spec.name)
        #: the bound of the projections' clipping (None: no clipping; a config's None switches it off)
        self.clip_qkv: float | None = None if clip is None else float(clip)
        self.sub_norm = None if spec.sub_norm is None else _norm(self.original, spec.sub_norm, spec)
        factor = None if spec.alibi is None else spec.alibi.factor
        #: ALiBi's slopes ``(h,)`` in canonical head order (None: no ALiBi)
        self.alibi_slopes: Tensor | None = None
        if spec.alibi is not None and factor is not None:
            slopes = alibi_slopes(w.h) * float(factor if isinstance(factor, float | int)
                                               else resolve(self.original, factor, spec.name))
            self.alibi_slopes = (rearrange(slopes, "(r g) -> (g r)", g=w.g) if spec.grouping == "r g" and w.g != w.h
                                 else slopes)
        #: differential attention's ``(lambda, lambda_init)`` (None: plain attention)
        self.differential = None if spec.differential is None else _lambdas(self.original, spec)
        if self.differential is not None and (w.h % 2 or w.g % 2):
            raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: differential "
                                  f"attention pairs heads, and {w.h} query heads on {w.g} key/value heads do not pair")

    def _read_relative_positions(self) -> None:
        """The spec's relative positions, read from the module in float64: decomposed, disentangled, relative keys
        and values."""
        spec, w = self.spec, self.weights
        #: decomposed relative positions' tables ``(rel_h, rel_w)`` in float64 (None: none)
        self.decomposed: tuple[Tensor, Tensor] | None = None
        if spec.decomposed is not None:
            if not self.conventions.self_attention:
                raise AuditUsageError(f"spec {spec.name!r}: decomposed relative positions lay the keys on the "
                                      f"queries' grid, so they need self-attention")
            self.decomposed = (resolve(self.original, spec.decomposed.h, spec.name).detach().double(),
                               resolve(self.original, spec.decomposed.w, spec.name).detach().double())
        #: DeBERTa's disentangled attention: ``(Kr or None, Qr or None)`` per head ``(h, n, d)`` in float64, the rows'
        #: form, buckets and largest position (None: none)
        self.disentangled: tuple[Tensor | None, Tensor | None, Literal["v1", "v2"], int, int] | None = None
        if spec.disentangled is not None:
            self.disentangled = _disentangled(self.original, spec, spec.disentangled, w.h)
        #: relative position embeddings the queries meet: ``(R (n, h, d), c (h, d) or None)`` in float64
        self.relative_keys: tuple[Tensor, Tensor | None] | None = None
        if spec.relative_keys is not None:
            self.relative_keys = _relative_keys(self.original, spec, spec.relative_keys, w.h)
        #: Shaw's relative values ``V (n, dv)`` in float64 (None: none)
        self.relative_values: Tensor | None = None
        if spec.relative_keys is not None and spec.relative_keys.values is not None:
            self.relative_values = spec.relative_keys.values(self.original).detach().double()
            if self.relative_values.ndim != 2 or self.relative_values.shape[1] != w.dv:
                raise AuditUsageError(f"spec {spec.name!r}: relative_keys.values gave shape "
                                      f"{tuple(self.relative_values.shape)}, expected (n, {w.dv})")

    @property
    def setup(self) -> str:
        """Lines defining ``module`` and ``spec`` for :meth:`repro` (made when first asked for)."""
        if self._setup is None:
            self._setup = module_setup(self._given, self.spec)
        return self._setup

    @setup.setter
    def setup(self, lines: str) -> None:
        self._setup = lines

    def module(self, dtype: torch.dtype) -> nn.Module:
        """The module copy in ``dtype`` (made once)."""
        if dtype not in self._copies:
            self._copies[dtype] = copy.deepcopy(self.original).to(device=self.device, dtype=dtype).eval()
        return self._copies[dtype]

    def call(self, ins: ModuleInputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
             ) -> CandidateOutput:
        x, key, value = (z.to(device=self.device, dtype=dtype) for z in self._memory(ins))
        if keep is not None and self.device is not None:
            keep = keep.to(self.device)
        module = self.module(dtype)
        with candidate_code(x=x, key=key, value=value, mask=keep):
            if self.conventions.self_attention:
                out = self.spec.forward(module, x, None, None, keep, is_causal)
            else:
                out = self.spec.forward(module, x, key, value, keep, is_causal)
        return out if self.device is None else out.to("cpu")

    def _project(self, ins: Inputs, dtype: torch.dtype, offset: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        w = self.weights
        x, key, value = (z.to(dtype) for z in self._memory(ins))
        memory = key.shape[1]
        if self.spec.keys_with_input:  # keys and values over concat(memory, x)
            key, value = torch.cat([key, x], dim=1), torch.cat([value, x], dim=1)

        def lin(z: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
            y = einsum(z, weight.to(dtype), "b t e, o e -> b t o")
            y = y if bias is None else y + bias.to(dtype)
            return y if self.clip_qkv is None else y.clamp(-self.clip_qkv, self.clip_qkv)

        if self.latent is not None:  # self-attention through a compressed latent: x gives q, k and v
            q, k, v = self.latent(x)
        else:
            q = rearrange(lin(x, w.wq, w.bq), "b t (h d) -> b h t d", h=w.h)
            k = rearrange(lin(key, w.wk, w.bk), "b s (g d) -> b g s d", g=w.g)
            v = rearrange(lin(value, w.wv, w.bv), "b s (g d) -> b g s d", g=w.g)
        if "v" in self.norms:
            v = self.norms["v"](v)
        after = self.spec.norms_after_rotary
        if "q" in self.norms and not after:
            q = self.norms["q"](q)
        if "k" in self.norms and not after:
            k = self.norms["k"](k)
        if self.rotary is not None:
            q, k = self._rotate(q, offset + (memory if self.spec.keys_with_input else 0)), self._rotate(k, offset)
        if "q" in self.norms and after:
            q = self.norms["q"](q)
        if "k" in self.norms and after:
            k = self.norms["k"](k)
        if w.extra_k is not None and w.extra_v is not None:  # appended key/value positions (add_bias_kv, ...)
            n = w.extra_k.shape[0]
            extra_k = rearrange(w.extra_k.to(dtype), "n (g d) -> 1 g n d", g=w.g).expand(k.shape[0], w.g, n, w.d)
            extra_v = rearrange(w.extra_v.to(dtype), "n (g d) -> 1 g n d", g=w.g).expand(v.shape[0], w.g, n, w.dv)
            k, v = torch.cat([k, extra_k], dim=2), torch.cat([v, extra_v], dim=2)
        return q, k, v

    def _rotate(self, x: Tensor, offset: int) -> Tensor:
        """The rotary embedding of the first :attr:`rotary_dims` of each head (the last ones with
        :attr:`rotary_last`: a variant the rope diagnosis tries), tables in :attr:`rotary_tables`."""
        assert self.rotary is not None
        if self.rotary_prefix:  # the prefix tokens pass unturned; the rest count their positions from 0
            n = self.rotary_prefix
            if x.shape[2] <= n:
                return x
            return torch.cat([x[:, :, :n], self._turn(x[:, :, n:], offset)], dim=2)
        return self._turn(x, offset)

    def _turn(self, x: Tensor, offset: int) -> Tensor:
        """:meth:`_rotate` on tokens that all turn."""
        assert self.rotary is not None
        d = x.shape[-1]
        low, high = (d - self.rotary_dims, d) if self.rotary_last else (0, self.rotary_dims)
        inverse, magnitude = self.rotary_frequencies or (None, 1.0)
        positions = None
        if self.mrope_blocks is not None:  # each block of features turns on its own, by its axis
            grid = mrope_positions(offset, x.shape[2]).double()
            width = (high - low) // len(self.mrope_blocks)
            blocks = [rotate(x[..., low + i * width:low + (i + 1) * width], *self.rotary, offset=offset,
                             tables=self.rotary_tables, frequencies=inverse, magnitude=magnitude,
                             positions=grid[axis][:, None].expand(-1, width // 2))
                      for i, axis in enumerate(self.mrope_blocks)]
            return torch.cat([x[..., :low], *blocks, x[..., high:]], dim=-1)
        if self.mrope_axes is not None:  # each frequency turns by its section's axis of the 3-D positions
            grid = mrope_positions(offset, x.shape[2]).double()
            positions = grid[self.mrope_axes].T  # (t, frequencies)
        rotated = rotate(x[..., low:high], *self.rotary, offset=offset, tables=self.rotary_tables,
                         frequencies=inverse, magnitude=magnitude, positions=positions)
        return torch.cat([x[..., :low], rotated, x[..., high:]], dim=-1)

    def _memory(self, ins: Inputs) -> Inputs:
        """A cross-attention module with one memory tensor: the key input is also the value input."""
        return (ins[0], ins[1], ins[1]) if self.spec.memory else ins

    def bias(self, t: int, s: int, dtype: torch.dtype) -> Float[Tensor, "1 h_or_1 {t} {s}"] | None:
        """The additive position bias ``(1, 1 or h, t, s)`` the spec declares (its ``position_bias`` plus its ALiBi),
        or None."""
        alibi = None
        if self.spec.alibi is not None and self.alibi_slopes is not None:
            alibi = alibi_bias(self.weights.h, t, s, form=self.spec.alibi.form, slopes=self.alibi_slopes)
        if self.spec.position_bias is None:
            return None if alibi is None else alibi.to(dtype)[None]
        bias = self.spec.position_bias(self.original, t, s).detach().to(dtype)
        if bias.ndim != 3 or bias.shape[0] not in (1, self.weights.h) or tuple(bias.shape[1:]) != (t, s):
            raise AuditUsageError(f"spec {self.spec.name!r}: position_bias(module, {t}, {s}) gave shape "
                                  f"{tuple(bias.shape)}, expected (1 or {self.weights.h}, {t}, {s})")
        return (bias if alibi is None else bias + alibi.to(dtype))[None]

    def gated(self, bias: Float[Tensor, "1 #h t s"] | None, x: Float[Tensor, "b t e"]
              ) -> Float[Tensor, "#b #h t s"] | None:
        """``bias`` times the spec's position gate ``(b, h, t)`` of the query input ``x`` (none: ``bias``)."""
        if bias is None or self.spec.position_gate is None:
            return bias
        gate = self.spec.position_gate(self.original, x.double()).to(bias.dtype)
        if gate.shape != (x.shape[0], self.weights.h, x.shape[1]):
            raise AuditUsageError(f"spec {self.spec.name!r}: position_gate gave shape {tuple(gate.shape)}, expected "
                                  f"({x.shape[0]}, {self.weights.h}, {x.shape[1]})")
        return bias * gate[..., None]

    def with_content(self, bias: Float[Tensor, "#b #h t s"] | None, q: Float[Tensor, "b h t d"],
                     k: Float[Tensor, "b g s d"]) -> Float[Tensor, "#b #h t s"] | None:
        """``bias`` plus the terms that depend on the queries ``q`` and keys ``k``: decomposed relative positions,
        DeBERTa's disentangled terms (when the spec has them)."""
        t, s = q.shape[2], k.shape[2]
        if self.decomposed is not None and self.spec.decomposed is not None:
            grid = self.spec.decomposed.grid(t)
            if grid[0] * grid[1] != t:
                raise AuditUsageError(f"spec {self.spec.name!r}: decomposed.grid({t}) gave {grid}, not a grid of {t} "
                                      f"tokens")
            rel_h, rel_w = self.decomposed
            rel = decomposed_bias(q, rel_h.to(q.dtype), rel_w.to(q.dtype), grid)
            bias = rel if bias is None else bias + rel
        if self.disentangled is not None:
            kr, qr, form, buckets, largest = self.disentangled
            rows = disentangled_rows(t, s, form, buckets, largest)
            terms = q.new_zeros(q.shape[0], q.shape[1], t, s)
            if kr is not None:  # content to position: the query against the key embedding of the distance
                terms = terms + einsum(q, kr.to(q.dtype)[:, rows], "b h t d, h t s d -> b h t s")
            if qr is not None:  # position to content: the key against the query embedding of the distance
                terms = terms + einsum(k, qr.to(q.dtype)[:, rows], "b h s d, h t s d -> b h t s")
            terms = terms * self.weights.scale
            bias = terms if bias is None else bias + terms
        if self.relative_keys is not None and self.spec.relative_keys is not None:
            table, extra = self.relative_keys
            rows = self.spec.relative_keys.rows(t, s)
            met = q if extra is None else q + rearrange(extra.to(q.dtype), "h d -> 1 h 1 d")
            terms = einsum(met, table.to(q.dtype)[rows], "b h t d, t s h d -> b h t s") * self.weights.scale
            bias = terms if bias is None else bias + terms
        return bias

    def visible(self, keep: KeepMask | None, is_causal: bool, t: int, s: int
                ) -> tuple[Bool[Tensor, "#b #h #t _"] | None, bool]:
        """``(keep, is_causal)`` with the sliding window and the module's extra key positions applied (the
        returned mask covers the ``s`` keys and the appended ones)."""
        w = self.weights
        if (self.window is None and self.blocks is None and self.radius is None and w.extra_k is None
                and not self.spec.keys_with_input):
            return keep, is_causal
        keep = effective_keep(keep, is_causal, t, s, self.conventions)
        if self.window is not None:
            inside = window_mask(t, s, self.window)[None, None]
            keep = inside if keep is None else keep & inside
        if self.blocks is not None:
            inside = block_mask(t, s, self.blocks)[None, None]
            keep = inside if keep is None else keep & inside
        if self.radius is not None:
            near = local_mask(t, s, self.radius)[None, None]
            keep = near if keep is None else keep & near
        if self.spec.keys_with_input:  # the input's own t keys, after the memory's: always visible
            keep = torch.ones(1, 1, t, s, dtype=torch.bool) if keep is None else keep
            keep = torch.cat([keep, keep.new_ones(*keep.shape[:-1], t)], dim=-1)
        if w.extra_k is not None and keep is not None:
            keep = torch.cat([keep, keep.new_ones(*keep.shape[:-1], w.extra_k.shape[0])], dim=-1)
        return keep, False

    def reference(self, ins: ModuleInputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
                  ) -> Float[Tensor, "b t e"]:
        q, k, v = self._project(ins, dtype)
        t, s = q.shape[2], ins[1].shape[1]
        keep, is_causal = self.visible(keep, is_causal, t, s)
        bias = self.with_content(self.gated(self.bias(t, s, dtype), ins[0]), q, k[:, :, :s])
        if bias is not None and self.weights.extra_k is not None:
            bias = torch.cat([bias, bias.new_zeros(*bias.shape[:-1], self.weights.extra_k.shape[0])], dim=-1)
        if bias is not None and self.spec.keys_with_input:
            raise AuditUsageError(f"spec {self.spec.name!r}: a position bias over keys_with_input's appended keys "
                                  f"is not modelled")
        w = self.weights
        if self.differential is not None:  # key/value head j carries the value of its differential head
            half = torch.arange(w.g) % (w.g // 2)
            v = torch.cat([v[:, half], v[:, half + w.g // 2]], dim=-1)
        dv = v.shape[-1]
        if self.relative_values is not None:  # the weights p too, as the attention of one-hot values
            v = torch.cat([v, torch.eye(v.shape[2], dtype=v.dtype).expand(*v.shape[:2], -1, -1)], dim=-1)
        # softmax_dtype: a variant the diagnosis tries, the softmax in a lower precision as many libraries compute it
        out = reference_attention(q, k, v, keep, is_causal=is_causal, conventions=self.conventions, bias=bias,
                                  softcap=self.softcap, sinks=None if w.sinks is None else w.sinks.to(dtype),
                                  softmax_dtype=self.softmax_dtype, softmax_over_queries=self.softmax_over_queries)
        if self.relative_values is not None and self.spec.relative_keys is not None:  # o_i += sum_j p_ij V[row(i, j)]
            table = self.relative_values.to(dtype)[self.spec.relative_keys.rows(t, s)]
            out = out[..., :dv] + einsum(out[..., dv:dv + s], table, "b h t s, t s d -> b h t d")
        if self.differential is not None:
            lam, _ = self.differential
            out = out[:, :w.h // 2] - lam * out[:, w.h // 2:]
        if self.sub_norm is not None:
            out = self.sub_norm(out)
        if self.differential is not None:
            out = (1 - self.differential[1]) * out
        out = rearrange(out, "b h t dv -> b t (h dv)")
        if w.wg is not None:
            x = ins[0].to(dtype)
            logits = einsum(x, w.wg.to(dtype), "b t e, n e -> b t n") + (0.0 if w.bg is None else w.bg.to(dtype))
            softplus = self.spec.gate is not None and self.spec.gate.activation == "softplus"
            gate = torch.nn.functional.softplus(logits) if softplus else torch.sigmoid(logits)
            out = out * (gate.repeat_interleave(w.dv, dim=-1) if gate.shape[-1] == w.h else gate)
        if w.wo is None:
            return out
        out = einsum(out, w.wo.to(dtype), "b t i, o i -> b t o")
        return out if w.bo is None else out + w.bo.to(dtype)

    def logit_bound(self, ins: ModuleInputs) -> float:
        q, k, _ = self._project(ins, torch.float64)
        grouped = rearrange(q.abs(), "b (g r) t d -> b g r t d", g=k.shape[1])
        bound = float(einsum(grouped, k.abs(), "b g r t d, b g s d -> b g r t s").max()) * abs(self.weights.scale)
        rel = self.with_content(None, q, k)
        return bound if rel is None else bound + float(rel.abs().max())

    def logits(self, ins: ModuleInputs) -> Float64[Tensor, "b h t s"]:
        """The float64 logits ``(b, h, t, s)`` of the reference."""
        q, k, _ = self._project(ins, torch.float64)
        grouped = rearrange(q, "b (g r) t d -> b g r t d", g=k.shape[1])
        logits = einsum(grouped, k, "b g r t d, b g s d -> b g r t s") * self.weights.scale
        logits = rearrange(logits, "b g r t s -> b (g r) t s")[..., :ins[1].shape[1]]  # not the extra positions
        s = ins[1].shape[1]
        bias = self.with_content(self.gated(self.bias(q.shape[2], s, torch.float64), ins[0]), q, k[:, :, :s])
        return logits if bias is None else logits + bias

    def rows(self, keep: KeepMask, example: Example) -> Bool[Tensor, "b t 1"]:
        """The query rows with an allowed key: in the sliding window (a row whose window holds only masked keys has
        none), or among the module's extra key positions (always allowed)."""
        if self.weights.extra_k is not None or self.spec.keys_with_input:
            return torch.ones(example.b, example.t, 1, dtype=torch.bool)
        if self.window is not None:
            keep = keep & window_mask(example.t, example.s, self.window)
        if self.blocks is not None:
            keep = keep & block_mask(example.t, example.s, self.blocks)
        if self.radius is not None:
            keep = keep & local_mask(example.t, example.s, self.radius)
        return rearrange(keep.any(dim=-1).all(dim=1).expand(example.b, example.t), "b t -> b t 1")

    def decode(self, ins: ModuleInputs, dtype: torch.dtype) -> CandidateOutput | None:
        if self.spec.decode is None:
            return None
        module = copy.deepcopy(self.module(dtype))
        x = ins[0].to(device=self.device, dtype=dtype)
        with candidate_code(x=x):
            out = self.spec.decode(module, x)
        return out if self.device is None or out is None else out.to("cpu")

    def fast_path(self, x: Float[Tensor, "b t e"], padding: Bool[Tensor, "b t"], dtype: torch.dtype
                  ) -> CandidateOutput | None:
        if self.spec.fast_path is None:
            return None
        module = copy.deepcopy(self.module(dtype))
        x = x.to(device=self.device, dtype=dtype)
        padding = padding if self.device is None else padding.to(self.device)
        with candidate_code(x=x, padding=padding):
            out = self.spec.fast_path(module, x, padding)
        return out if self.device is None or out is None else out.to("cpu")

    def repro(self, example: Example, check: str) -> str:
        """A snippet that runs as printed in a fresh interpreter: :attr:`setup` defines ``module`` and
        ``spec`` (the CLI rebuilds its module with the same seeded weights), then the failing call and the
        reference."""
        fields = ", ".join(f"{key}={value!r}" for key, value in example_fields(example).items())
        return (f"import torch\n"
                f"from typed_transformer.audit import Conventions, Example, ModuleAdapter\n"
                f"{self.setup}\n"
                f"example = Example({fields})\n"
                f"adapter = ModuleAdapter(module, spec, conventions={self.conventions!r})\n"
                + repro_comparison(check))


def _lambdas(module: Any, spec: ModuleSpec) -> tuple[float, float]:
    """Differential attention's ``(lambda, lambda_init)``, read from the module in float64."""
    assert spec.differential is not None
    diff = spec.differential

    def dot(q: str, k: str) -> Tensor:
        vectors: list[Tensor] = [resolve(module, path, spec.name).detach().double() for path in (q, k)]
        return (vectors[0] * vectors[1]).sum()

    init = diff.lambda_init
    init = float(init if isinstance(init, float | int) else resolve(module, init, spec.name))
    lam = torch.exp(dot(diff.lambda_q1, diff.lambda_k1)) - torch.exp(dot(diff.lambda_q2, diff.lambda_k2)) + init
    return float(lam), init


def module_setup(module: Any, spec: ModuleSpec) -> str:
    """Lines that define ``module`` and ``spec`` in a fresh interpreter. The module: by the factory that built it
    when the factory can be imported, else rebuilt from its class and constructor arguments where the library
    keeps them (a Hugging Face class from its config; ``nn.MultiheadAttention`` from its attributes) with its
    weights (:func:`weights_lines`). The spec: a shipped one by name, one that says how to rebuild itself
    (``hf_spec``) that way, a user's by the module-level name it has (where its forward is defined first). What
    cannot be rebuilt is left for the reader, with a comment that says so."""
    if SHIPPED_SPECS.get(spec.name) is spec:
        spec_line = f"from typed_transformer.audit import SPECS\nspec = SPECS[{spec.name!r}]"
    elif _rebuild(spec) is not None:
        spec_line = str(_rebuild(spec))
    else:
        search = tuple(dict.fromkeys(getattr(f, "__module__", "") for f in (spec.forward, spec.weights, spec.build)
                                     if f is not None))
        spec_line = import_line(spec, "spec", search=search) or (
            f"spec = ...  # the ModuleSpec {spec.name!r} you passed: define or import it here (it has no importable "
            f"name)")
    if not isinstance(module, nn.Module):  # a factory
        line = import_line(module, "factory")
        if line is not None:
            return f"{line}\nmodule = factory()\n{spec_line}"
        return f"module = ...  # a module: build it here (the factory you passed cannot be imported)\n{spec_line}"
    built = _constructor_lines(module)
    if built is None:
        return (f"module = ...  # the {type(module).__qualname__} you audited: build it here (its constructor "
                f"arguments are not kept by its class; pass an importable factory to get this line filled in)\n"
                f"{spec_line}")
    return f"{built}\n{weights_lines(module)}\n{spec_line}"
