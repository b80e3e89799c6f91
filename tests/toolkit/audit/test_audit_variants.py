"""Modern attention variants the reference computes (logit soft-capping, attention sinks, output gates, sub-norms
on the attention output): each on a real transformers class audited with zero lines of spec, and with a planted
bug that fails in the check that should catch it."""

from typing import Any

import pytest
import torch
from torch import nn

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.notes import hf_limits
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 4, "dtypes": (torch.float32,), "seed": 0}


def _audit(module: nn.Module, **kwargs: Any) -> Any:
    return audit_module(module, hf_spec(module), conventions="infer", **{**QUICK, **kwargs})


def _hooked(module: nn.Module, child: str, hook: Any) -> nn.Module:
    """``module`` with a forward hook on ``child`` that replaces its output (a planted bug)."""
    getattr(module, child).register_forward_hook(lambda _m, _args, out: hook(out))
    return module


def test_soft_capping_is_computed_and_a_missing_cap_fails_large_logits() -> None:
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention

    module: Any = randomize_parameters(hf_build(Gemma2Attention), 0)
    spec = hf_spec(module)
    assert spec.softcap == "attn_logit_softcapping"
    assert hf_limits(module) == []
    assert _audit(module).passed

    class ForgetsTheCap(Gemma2Attention):
        """Bug: the logits are not soft-capped."""

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            cap, self.attn_logit_softcapping = self.attn_logit_softcapping, None
            try:
                return super().forward(*args, **kwargs)
            finally:
                self.attn_logit_softcapping = cap

    report = _audit(randomize_parameters(hf_build(ForgetsTheCap), 0), checks=["reference", "large_logits"])
    assert report.status("large_logits") == "FAIL", report.table()


def test_attention_sinks_are_computed_and_a_dropped_sink_fails_reference() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    module: Any = randomize_parameters(hf_build(GptOssAttention), 0)
    assert hf_spec(module).sinks == "sinks"
    assert hf_limits(module) == []
    report = _audit(module)
    assert report.passed, report.table()
    assert report.conventions is not None
    assert report.conventions["fully_masked"] == "zero"

    class DropsTheSinks(GptOssAttention):
        """Bug: the sink logits never reach the softmax (as if they were -inf)."""

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            saved = self.sinks.detach().clone()
            with torch.no_grad():
                self.sinks.fill_(-1e9)
            try:
                return super().forward(*args, **kwargs)
            finally:
                with torch.no_grad():
                    self.sinks.copy_(saved)

    report = _audit(randomize_parameters(hf_build(DropsTheSinks), 0), checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


@pytest.mark.parametrize(("model", "name", "proj", "in_query", "width"), [
    ("afmoe", "AfmoeAttention", "gate_proj", False, "feature"),
    ("step3p7", "Step3p7Attention", "g_proj", False, "head"),
    ("qwen3_next", "Qwen3NextAttention", "q_proj", True, "feature"),
])
def test_output_gates_are_computed(model: str, name: str, proj: str, in_query: bool, width: str) -> None:
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    module: Any = randomize_parameters(hf_build(cls), 0)
    spec = hf_spec(module)
    assert spec.gate is not None
    assert (spec.gate.proj, spec.gate.in_query) == (proj, in_query)
    assert hf_limits(module) == []
    weights = spec_weights_of(module)
    assert weights.wg is not None
    assert weights.wg.shape[0] == (weights.h if width == "head" else weights.h * weights.dv)
    report = _audit(module)
    assert report.passed, report.table()


def spec_weights_of(module: nn.Module) -> Any:
    from typed_transformer.audit.modules.weights import spec_weights

    return spec_weights(module, hf_spec(module))


@pytest.mark.parametrize(("model", "name", "proj"), [("afmoe", "AfmoeAttention", "gate_proj"),
                                                     ("step3p7", "Step3p7Attention", "g_proj")])
def test_a_gate_with_its_sign_flipped_fails_reference(model: str, name: str, proj: str) -> None:
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    bugged = _hooked(randomize_parameters(hf_build(cls), 0), proj, lambda out: -out)  # sigmoid(-z): 1 - the gate
    report = _audit(bugged, checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_a_sub_norm_is_computed_and_a_mis_scaled_one_fails_reference() -> None:
    from transformers.models.bitnet.modeling_bitnet import BitNetAttention

    module: Any = randomize_parameters(hf_build(BitNetAttention), 0)
    assert hf_spec(module).sub_norm == "attn_sub_norm"
    assert hf_limits(module) == []
    assert _audit(module).passed
    bugged = _hooked(randomize_parameters(hf_build(BitNetAttention), 0), "attn_sub_norm", lambda out: out * 0.5)
    report = _audit(bugged, checks=["reference"])
    assert report.status("reference") == "FAIL", report.table()


def test_gates_the_reference_does_not_compute_stay_set_aside() -> None:
    from transformers.models.dory.modeling_dory import DoryAttention

    module: Any = hf_build(DoryAttention)  # its gate is scaled by learned factors: not the plain sigmoid gate
    assert hf_spec(module).gate is None
    assert any("'gate_proj'" in limit for limit in hf_limits(module))
