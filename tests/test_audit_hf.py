"""Hugging Face attention classes audited with zero lines of spec: built from a tiny config of their own config
class, recognised by the common shape, conventions inferred; a planted bug in such a class is found; a class of
another shape is refused with what is missing."""

from typing import Any

import pytest
import torch

from typed_transformer.audit import AuditUsageError, audit_module
from typed_transformer.audit._hf import hf_attention_classes, hf_build, hf_limits, hf_spec
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"max_examples": 4, "dtypes": (torch.float32,), "seed": 0}


def test_llama_attention_with_zero_lines_of_spec() -> None:
    from transformers.models.llama.modeling_llama import LlamaAttention

    module = randomize_parameters(hf_build(LlamaAttention), 0)
    spec = hf_spec(module)
    assert spec.name == "hf:LlamaAttention"
    assert spec.rotary is not None
    assert spec.rotary.base == 10000.0
    assert spec.decode is not None
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert {name: report.status(name) for name in ("conventions", "rope", "incremental_decoding")} == {
        "conventions": "PASS", "rope": "PASS", "incremental_decoding": "PASS"}
    assert report.table().splitlines()[1].startswith("inferred conventions (")
    assert hf_limits(module) == []


def test_fused_qkv_class_is_recognised() -> None:
    from transformers.models.phi3.modeling_phi3 import Phi3Attention

    spec = hf_spec(Phi3Attention)
    assert spec.qkv == "qkv_proj"
    assert audit_module(randomize_parameters(hf_build(Phi3Attention), 0), spec, conventions="infer",
                        checks=["reference", "rope"], **QUICK).passed


def test_a_planted_bug_in_a_zero_spec_class_fails() -> None:
    from transformers.models.llama.modeling_llama import LlamaAttention

    class MaskDroppingAttention(LlamaAttention):
        """Bug: drops the attention mask."""

        def forward(self, hidden_states: torch.Tensor, position_embeddings: Any = None,
                    attention_mask: Any = None, cache: Any = None, **kwargs: Any) -> Any:
            return super().forward(hidden_states, position_embeddings, None, cache, **kwargs)

    module = randomize_parameters(hf_build(MaskDroppingAttention), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.status("conventions") == "FAIL"
    findings = [r.message for r in report.results if r.name == "conventions"]
    assert any("is accepted and ignored" in message for message in findings), findings
    assert report.status("masking") == "FAIL"


def test_other_shapes_are_refused_with_what_is_missing() -> None:
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention

    with pytest.raises(AuditUsageError, match=r"not of the common shape .no q_proj, k_proj, v_proj, o_proj"):
        hf_spec(GPTNeoXAttention)


def test_attention_classes_of_a_model_package() -> None:
    names = [cls.__name__ for cls in hf_attention_classes("llama")]
    assert names == ["LlamaAttention"]


def test_infer_conventions_of_a_module_through_its_spec() -> None:
    from transformers.models.llama.modeling_llama import LlamaAttention

    from typed_transformer.audit import infer_conventions

    module = randomize_parameters(hf_build(LlamaAttention), 0)
    inference = infer_conventions(module, spec=hf_spec(module))
    assert inference.findings == []
    # HF's fill finfo(float64).min becomes -inf in its float32 softmax: NaN rows in float64, the mean in float32
    assert inference.conventions.fully_masked == "any"
    assert "NaN with dv = d in float64" in inference.evidence["fully_masked"].seen
    assert "the mean of the values with dv = d in float32" in inference.evidence["fully_masked"].seen
