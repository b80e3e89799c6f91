"""Hugging Face classes whose keys and values are over their memory followed by their own input (``keys_with_input``:
Idefics2's perceiver resampler, MuseGlimmerAssistant's drafter), T5Gemma 2's self- and cross-attention merged in one
softmax, and CPM-Ant's attention, audited with zero lines of spec; planted bugs in each failing the named check."""

import dataclasses
import importlib
from typing import Any

import pytest
import torch
from torch import Tensor

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.audit.modules.adapter import ModuleAdapter
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _modeling(model: str) -> Any:
    return importlib.import_module(f"transformers.models.{model}.modeling_{model}")


def _built(model: str, name: str) -> torch.nn.Module:
    module: torch.nn.Module = randomize_parameters(hf_build(getattr(_modeling(model), name)), 0)
    return module


@pytest.mark.parametrize(("model", "name", "rotary"), [
    ("idefics2", "Idefics2PerceiverAttention", None),  # concat([context, latents]): keys over both
    ("muse_glimmer_assistant", "MuseGlimmerAssistantAttention", "half"),  # context then window, turned at 0..s+t-1
])
def test_keys_over_memory_and_input_pass(model: str, name: str, rotary: str | None) -> None:
    module = _built(model, name)
    spec = hf_spec(module)
    assert spec.memory
    assert spec.keys_with_input
    assert (spec.rotary.style if spec.rotary else None) == rotary
    assert spec.window is None  # Muse's window is its model's mask's (a note says so)
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []
    assert any("keys over its memory and its input" in n for n in hf_notes(module))


def test_the_reference_appends_the_inputs_keys_visible() -> None:
    """The reference is the class's own computation: its keys over ``[context; latents]`` with the model's mask (the
    context's keep-mask, then ones), against the class called as its resampler calls it."""
    module = _built("idefics2", "Idefics2PerceiverAttention").double().eval()
    spec = hf_spec(module)
    adapter = ModuleAdapter(module, spec)
    g = torch.Generator().manual_seed(1)
    latents, context = torch.randn(2, 3, 16, dtype=torch.float64, generator=g), torch.randn(2, 5, 16,
                                                                                           dtype=torch.float64,
                                                                                           generator=g)
    keep = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    keep[0, :, :, 3:] = False  # the first context padded after 3 tokens
    mask = torch.cat([keep, torch.ones(2, 1, 3, 3, dtype=torch.bool)], dim=-1)
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, torch.finfo(torch.float64).min)
    with torch.no_grad():
        out = module(latents, context, attention_mask=additive)[0]
    ref = adapter.reference((latents, context, context), keep, False, torch.float64)
    # (its eager softmax runs in float32, even on float64 logits)
    assert float((out - ref).abs().max()) <= 1e-6 * float(ref.abs().max())
    plain = ModuleAdapter(module, dataclasses.replace(spec, keys_with_input=False))  # keys over the context alone
    assert float((out - plain.reference((latents, context, context), keep, False, torch.float64)).abs().max()) > 1e-2


def test_a_resampler_that_drops_its_context_fails() -> None:
    """Keys over ``[zeros; latents]`` (the context never reaching the keys): ``reference`` fails."""
    module = _built("idefics2", "Idefics2PerceiverAttention")
    spec = hf_spec(module)
    base = type(module)

    class NoContext(base):  # type: ignore[misc, valid-type]
        def forward(self, latents: Tensor, context: Tensor, *args: Any, **kwargs: Any) -> Any:
            return super().forward(latents, torch.zeros_like(context), *args, **kwargs)

    module.__class__ = NoContext
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert not report.passed
    assert report.status("reference") == "FAIL"


def test_a_drafter_that_turns_its_queries_at_the_contexts_positions_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queries turned by the tables' first ``t`` rows (the context's positions) instead of their last: ``reference``
    fails."""
    modeling = _modeling("muse_glimmer_assistant")
    module = _built("muse_glimmer_assistant", "MuseGlimmerAssistantAttention")
    spec = hf_spec(module)

    def first_rows(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        n = q.size(-2)
        turned = q * cos[..., :n, :] + modeling.rotate_half(q) * sin[..., :n, :]
        return turned, k * cos + modeling.rotate_half(k) * sin

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", first_rows)
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert not report.passed
    assert report.status("reference") == "FAIL"


def test_cpmant_with_its_input_as_keys_and_a_zero_bias_passes() -> None:
    """CPM-Ant's forward(hidden_q, hidden_kv, attention_mask, position_bias): its layer passes its input as both,
    a boolean mask (True = may attend), and a segment-relative bias its model computes (passed as zeros, noted);
    its softmax is a module of its own (nn.Softmax(dim=-1)); a fully masked row gives zeros; its cache decodes."""
    module = _built("cpmant", "CpmAntAttention")
    spec = hf_spec(module)
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert report.status("incremental_decoding") == "PASS"
    assert report.conventions["fully_masked"] == "zero"
    assert hf_limits(module) == []
    assert any("position_bias" in n and "zeros" in n for n in hf_notes(module))


def test_cpmant_with_its_mask_the_other_way_round_fails() -> None:
    """A CPM-Ant that fills the keys its mask allows (the polarity inverted): ``masking`` fails."""
    module = _built("cpmant", "CpmAntAttention")
    spec = hf_spec(module)
    base = type(module)

    class Inverted(base):  # type: ignore[misc, valid-type]
        def forward(self, hidden_q: Tensor, hidden_kv: Tensor, attention_mask: Tensor, *args: Any,
                    **kwargs: Any) -> Any:
            return super().forward(hidden_q, hidden_kv, ~attention_mask, *args, **kwargs)

    module.__class__ = Inverted
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert not report.passed
    assert report.status("masking") == "FAIL"


def test_a_softmax_module_over_another_axis_is_not_read_as_inert() -> None:
    module = _built("cpmant", "CpmAntAttention")
    module.softmax = torch.nn.Softmax(dim=-2)
    assert any("'softmax'" in limit for limit in hf_limits(module))


def test_t5gemma2_merged_attention_passes_beside_the_audits_encoder_tokens() -> None:
    """T5Gemma 2's decoder merges self- and cross-attention in one softmax: audited as self-attention (causal mask,
    rotary, q/k norms, its cache) beside the audit's own encoder tokens, their keys k-normed and unturned."""
    module = _built("t5gemma2", "T5Gemma2MergedAttention")
    spec = hf_spec(module)
    assert not spec.memory
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert report.status("incremental_decoding") == "PASS"
    assert hf_limits(module) == []
    assert any("merged in one softmax" in n for n in hf_notes(module))


def test_the_merged_references_encoder_keys_are_the_classes() -> None:
    """The reference's appended keys are the class's encoder keys: without them (or without their k_norm) the
    reference is far from the class."""
    module = _built("t5gemma2", "T5Gemma2MergedAttention").double().eval()
    spec = hf_spec(module)
    x = torch.randn(2, 4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    adapter = ModuleAdapter(module, spec)
    with torch.no_grad():
        out = adapter.call((x, x, x), None, True, torch.float64)
    ref = adapter.reference((x, x, x), None, True, torch.float64)
    assert float((out - ref).abs().max()) <= 1e-6 * float(ref.abs().max())
    alone = ModuleAdapter(module, dataclasses.replace(spec, weights=None))
    assert float((out - alone.reference((x, x, x), None, True, torch.float64)).abs().max()) > 1e-2


def test_a_merged_attention_that_turns_its_encoder_keys_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A T5Gemma 2 whose encoder keys are turned too (as if at positions 0..): ``reference`` fails."""
    modeling = _modeling("t5gemma2")
    module = _built("t5gemma2", "T5Gemma2MergedAttention")
    spec = hf_spec(module)
    norm = type(module.k_norm)

    class TurningNorm(norm):  # type: ignore[misc, valid-type]
        def forward(self, z: Tensor) -> Tensor:
            out: Tensor = super().forward(z)
            if z.shape[-2] == 3:  # the encoder's 3 tokens: turned by 1 radian per position and pair
                angle = torch.arange(3, dtype=z.dtype)[:, None].expand(3, z.shape[-1] // 2)
                cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
                out = out * cos + modeling.rotate_half(out) * sin
            return out

    module.k_norm.__class__ = TurningNorm
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert not report.passed
    assert report.status("reference") == "FAIL"
