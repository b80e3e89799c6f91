"""Attention variants the reference computes beyond plain softmax attention: ALiBi in the forms transformers uses
(BLOOM's and Falcon's tensor passed into attention, MPT's position bias) and differential attention (DiffLlama).
Each on a real class audited with zero lines of spec, and with a planted bug that fails the check that should
catch it."""

import functools
import inspect
import math
from typing import Any

import pytest
import torch
from torch import nn

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.notes import hf_limits
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.positions import alibi_slopes
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"max_examples": 4, "dtypes": (torch.float32,), "seed": 0}


def _audit(module: nn.Module, **kwargs: Any) -> Any:
    return audit_module(module, hf_spec(module), conventions="infer", **{**QUICK, **kwargs})


def _built(cls: type, overrides: dict[str, Any] | None = None) -> Any:
    return randomize_parameters(hf_build(cls, overrides), 0)


@pytest.mark.parametrize(("model", "name", "overrides", "spec", "factor"), [
    ("bloom", "BloomAttention", {}, "bloom", 1.0),
    ("mpt", "MptAttention", {"n_heads": 6, "d_model": 24}, "mpt", 1.0),  # six heads: the interpolated slopes
    ("falcon", "FalconAttention", {"alibi": True}, "falcon_alibi", "inv_norm_factor"),
])
def test_alibi_is_read_from_the_class_and_audited(model: str, name: str, overrides: dict[str, Any], spec: str,
                                                  factor: Any) -> None:
    import importlib

    module = _built(getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name), overrides)
    found = hf_spec(module)
    assert (found.name, found.alibi is not None, found.rotary) == (spec, True, None)
    assert found.alibi is not None
    assert (found.alibi.form, found.alibi.factor) == ("key", factor)
    report = _audit(module, checks=["reference", "causality", "masking", "incremental_decoding"])
    assert report.passed, report.table()
    assert report.status("incremental_decoding") == "PASS"


def test_falcon_without_alibi_keeps_its_rotary_spec() -> None:
    from transformers.models.falcon.modeling_falcon import FalconAttention

    spec = hf_spec(_built(FalconAttention))
    assert (spec.name, spec.alibi, spec.rotary is not None) == ("falcon", None, True)


def test_the_falcon_spec_refuses_a_falcon_built_with_alibi() -> None:
    from transformers.models.falcon.modeling_falcon import FalconAttention

    from typed_transformer.audit import AuditUsageError

    with pytest.raises(AuditUsageError, match=r"does not model FalconAttention's option alibi=True"):
        audit_module(_built(FalconAttention, {"alibi": True}), "falcon", **QUICK)


def test_mpt_with_clip_qkv_is_refused_by_name() -> None:
    from transformers.models.mpt.modeling_mpt import MptAttention

    from typed_transformer.audit import AuditUsageError

    module = _built(MptAttention)
    module.clip_qkv = 0.5
    with pytest.raises(AuditUsageError, match=r"clip_qkv=0.5"):
        audit_module(module, "mpt", **QUICK)
    with pytest.raises(AuditUsageError, match=r"spec 'mpt' does not model its option clip_qkv=0.5"):
        hf_spec(module)  # the reason the sweep gives


def test_alibi_with_its_sign_flipped_fails_reference() -> None:
    from transformers.models.mpt.modeling_mpt import MptAttention

    class FlipsTheBias(MptAttention):
        """Bug: the bias rewards distant keys (``+m |p - j|``)."""

        def forward(self, hidden_states: Any, position_bias: Any, *args: Any, **kwargs: Any) -> Any:
            return super().forward(hidden_states, -position_bias, *args, **kwargs)

    report = _audit(_built(FlipsTheBias), checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_alibi_slopes_not_interpolated_fail_reference() -> None:
    from transformers.models.mpt.modeling_mpt import MptAttention

    class GeometricSlopes(MptAttention):
        """Bug: six heads get ``2^(-8 i / 6)``, not the paper's interpolation (which the tiny module needs)."""

        def forward(self, hidden_states: Any, position_bias: Any, *args: Any, **kwargs: Any) -> Any:
            slopes = torch.tensor([2.0 ** (-8 * i / self.n_heads) for i in range(1, self.n_heads + 1)])
            keys = torch.arange(1 - position_bias.shape[-1], 1, dtype=torch.float32)
            bias = (slopes[:, None, None] * keys).to(position_bias.dtype)
            return super().forward(hidden_states, bias, *args, **kwargs)

    assert not torch.allclose(torch.tensor([2.0 ** (-8 * i / 6) for i in range(1, 7)], dtype=torch.float64),
                              alibi_slopes(6))
    report = _audit(_built(GeometricSlopes, {"n_heads": 6, "d_model": 24}), checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_alibi_added_after_the_scale_fails_reference() -> None:
    from transformers.models.falcon.modeling_falcon import FalconAttention

    takes_alibi = "alibi" in inspect.signature(FalconAttention.forward).parameters  # transformers up to 5.24

    class ScalesTheBiasTwice(FalconAttention):
        """Bug: the bias reaches the logits with ``sqrt(d)`` times Falcon's slopes (added after the logit scale).
        Up to transformers 5.24 the bias is the argument ``alibi``; from 5.25 it is folded into the mask."""

        @functools.wraps(FalconAttention.forward)  # its signature: the spec reads which layout forward takes
        def forward(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            bias, *rest = args
            if takes_alibi:
                bias = bias * math.sqrt(self.head_dim)
            else:  # the folded mask: scale its finite entries, leave the masked-out ones at the dtype's minimum
                bias = torch.where(bias > torch.finfo(bias.dtype).min, bias * math.sqrt(self.head_dim), bias)
            return super().forward(hidden_states, bias, *rest, **kwargs)

    report = _audit(_built(ScalesTheBiasTwice, {"alibi": True}), checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_differential_attention_is_computed() -> None:
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    module = _built(DiffLlamaAttention)
    spec = hf_spec(module)
    assert spec.differential is not None
    assert spec.sub_norm == "groupnorm"
    assert hf_limits(module) == []
    report = _audit(module, checks=["reference", "causality", "masking", "incremental_decoding"])
    assert report.passed, report.table()
    assert report.status("incremental_decoding") == "PASS"


def test_differential_attention_without_its_lambda_init_scale_fails_reference() -> None:
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    assert _audit(_built(DiffLlamaAttention), checks=["reference"]).passed  # the class itself passes
    module = _built(DiffLlamaAttention)
    # Bug: the group norm's output reaches o_proj without the (1 - lambda_init) factor
    module.groupnorm.register_forward_hook(lambda m, _args, out: out / (1 - module.lambda_init))
    report = _audit(module, checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_differential_attention_with_lambda_reversed_fails_reference() -> None:
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    class ReversedLambda(DiffLlamaAttention):
        """Bug: ``lambda = exp(lambda_q2 . lambda_k2) - exp(lambda_q1 . lambda_k1) + lambda_init``."""

        @functools.wraps(DiffLlamaAttention.forward)  # its signature: hf_spec reads the arguments forward takes
        def forward(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            one, two = (self.lambda_q1, self.lambda_k1), (self.lambda_q2, self.lambda_k2)
            (self.lambda_q1, self.lambda_k1), (self.lambda_q2, self.lambda_k2) = two, one
            try:
                return super().forward(*args, **kwargs)
            finally:
                (self.lambda_q1, self.lambda_k1), (self.lambda_q2, self.lambda_k2) = one, two

    assert _audit(_built(DiffLlamaAttention), checks=["reference"]).passed  # the class itself passes
    bugged = _built(ReversedLambda)
    assert hf_spec(bugged).differential is not None  # read from the class it subclasses
    report = _audit(bugged, checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


#: DeepSeek's attention expands its latent to every query head, then repeats the heads again by
#: ``num_attention_heads // num_key_value_heads``: it runs only with as many key/value heads as query heads
MLA_HEADS = {"num_key_value_heads": 4}


@pytest.mark.parametrize(("model", "name", "overrides", "style"), [
    ("deepseek_v2", "DeepseekV2Attention", {}, "interleaved"),  # low-rank query, complex turns
    ("deepseek_v2", "DeepseekV2Attention", {"q_lora_rank": None}, "interleaved"),  # full-rank query
    ("deepseek_v3", "DeepseekV3Attention", {}, "interleaved"),  # rope_interleave (its default)
    ("deepseek_v3", "DeepseekV3Attention", {"rope_interleave": False, "q_lora_rank": None}, "half"),
])
def test_latent_attention_is_computed(model: str, name: str, overrides: dict[str, Any], style: str) -> None:
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    module = _built(cls, {**MLA_HEADS, **overrides})
    spec = hf_spec(module)
    assert spec.latent is not None
    assert spec.rotary is not None
    assert spec.rotary.style == style
    assert hf_limits(module) == []
    report = _audit(module, checks=["reference", "causality", "rope", "incremental_decoding"])
    assert report.passed, report.table()
    assert report.status("incremental_decoding") == report.status("rope") == "PASS"


def test_latent_attention_without_its_latent_norm_fails_reference() -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    module = _built(DeepseekV3Attention, MLA_HEADS)
    assert _audit(module, checks=["reference"]).passed  # the class itself passes
    module.kv_a_layernorm.register_forward_hook(lambda _m, args, _out: args[0])  # Bug: the latent is not normalised
    report = _audit(module, checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_latent_attention_with_the_other_rotary_pairing_fails_rope() -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    class HalfPairs(DeepseekV3Attention):
        """Bug: turns (x[i], x[i + d/2]) pairs where its config says interleaved (x[2i], x[2i+1])."""

        @functools.wraps(DeepseekV3Attention.forward)
        def forward(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            self.config.rope_interleave = False
            try:
                return super().forward(*args, **kwargs)
            finally:
                self.config.rope_interleave = True

    bugged = _built(HalfPairs, MLA_HEADS)
    assert hf_spec(bugged).latent is not None  # read from the class it subclasses
    report = _audit(bugged, checks=["reference", "rope"])
    assert report.status("rope") == "FAIL", report.table()


#: heads of 6: three rotated frequencies, one per M-RoPE section (temporal, height, width)
MROPE_HEADS = {"head_dim": 6, "hidden_size": 24}


@pytest.mark.parametrize(("model", "name"), [("qwen2_vl", "Qwen2VLAttention"),
                                             ("qwen2_5_vl", "Qwen2_5_VLAttention")])
def test_mrope_is_computed_with_3d_positions(model: str, name: str) -> None:
    import importlib

    from typed_transformer.audit.modules.adapter import ModuleAdapter
    from typed_transformer.audit.modules.positions import mrope_positions

    module = _built(getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name),
                    MROPE_HEADS)
    spec = hf_spec(module)
    assert spec.mrope is not None
    assert hf_limits(module) == []
    axes = ModuleAdapter(module, spec).mrope_axes
    assert axes is not None
    assert axes.tolist() == [0, 1, 2]
    grid = mrope_positions(0, 8)
    assert not any(torch.equal(grid[a], grid[b]) for a, b in ((0, 1), (0, 2), (1, 2)))  # not text positions
    report = _audit(module, checks=["reference", "causality", "rope", "incremental_decoding"])
    assert report.passed, report.table()
    assert report.status("incremental_decoding") == report.status("rope") == "PASS"


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_mrope_turning_every_section_by_one_axis_fails_reference(axis: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLAttention, Qwen2VLRotaryEmbedding

    module = _built(Qwen2VLAttention, MROPE_HEADS)
    assert _audit(module, checks=["reference"]).passed  # the class itself passes

    def one_axis(self: Any, freq: torch.Tensor) -> torch.Tensor:
        """Bug: every frequency turns by the same axis of the 3-D positions (text positions where it is 0)."""
        return torch.cat((freq[axis], freq[axis]), dim=-1)

    monkeypatch.setattr(Qwen2VLRotaryEmbedding, "recomposition_frequencies", one_axis)
    report = _audit(module, checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_interleaved_mrope_sections_are_named_as_a_limit() -> None:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextAttention

    module = _built(Qwen3VLTextAttention, MROPE_HEADS)
    assert hf_spec(module).mrope is None
    assert any("M-RoPE sections of another layout" in limit for limit in hf_limits(module))


#: heads of 8: two rotated frequencies per axis of Pixtral's axial rotary
AXIAL_HEADS = {"head_dim": 8, "hidden_size": 32}


def test_axial_rotary_is_computed_with_2d_positions() -> None:
    from transformers.models.pixtral.modeling_pixtral import PixtralAttention

    from typed_transformer.audit.modules.adapter import ModuleAdapter

    module = _built(PixtralAttention, AXIAL_HEADS)
    spec = hf_spec(module)
    assert spec.mrope is not None
    assert spec.mrope.axes == (1, 2)
    assert hf_limits(module) == []  # its rope_type 'axial' was set aside before
    axes = ModuleAdapter(module, spec).mrope_axes
    assert axes is not None
    assert axes.tolist() == [1, 1, 2, 2]  # height, then width
    report = _audit(module, checks=["reference", "batch_independence", "rope"])
    assert report.passed, report.table()


def test_axial_rotary_turned_by_height_alone_fails_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.pixtral.modeling_pixtral import PixtralAttention, PixtralVisionRotaryEmbedding

    module = _built(PixtralAttention, AXIAL_HEADS)
    assert _audit(module, checks=["reference"]).passed  # the class itself passes

    def height_only(self: Any, freq: torch.Tensor) -> torch.Tensor:
        """Bug: every frequency turns by the patch's row, none by its column."""
        return torch.cat([freq[:, 0], freq[:, 0]], dim=-1)

    monkeypatch.setattr(PixtralVisionRotaryEmbedding, "recomposition_frequencies", height_only)
    report = _audit(module, checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()
