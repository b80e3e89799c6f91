"""Hugging Face attention classes audited with zero lines of spec: built from a tiny config of their own config
class, recognised by the common shape, conventions inferred; a planted bug in such a class is found; a class of
another shape is refused with what is missing."""

from typing import Any

import pytest
import torch

from typed_transformer.audit import AuditUsageError, Example, ModuleAdapter, audit_module
from typed_transformer.audit.hf.build import hf_attention_classes, hf_build
from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 4, "dtypes": (torch.float32,), "seed": 0}


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
    lines = report.table().splitlines()
    # its rows without keys (NaN in float64, the mean of the values in float32) differ from the paper's zeros, as
    # its spec declares: listed first, declared, not failing
    assert lines[1] == "differences from the paper's attention (1, 0 not declared):"
    assert lines[2].startswith("  - fully_masked = 'any' (the paper: a query row without any allowed key gives zeros)")
    assert lines[2].endswith("; declared")
    assert lines[3].startswith("inferred conventions (")
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


# Shapes the generic spec describes: each on the real class from a tiny config, and with a planted bug.


def _audit(module: Any, **kwargs: Any) -> Any:
    return audit_module(module, hf_spec(module), conventions="infer", **{**QUICK, **kwargs})


def test_m_rope_with_text_positions_is_1d_rotary() -> None:
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLAttention

    module: Any = randomize_parameters(hf_build(Qwen2VLAttention), 0)
    assert sum(module.config.rope_parameters["mrope_section"]) == module.head_dim // 2  # scaled to the tiny head
    assert _audit(module, checks=["reference", "rope", "incremental_decoding"]).passed

    class TurnsBackwards(Qwen2VLAttention):
        """Bug: a sign error in the sine table (every pair turned the other way)."""

        def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
                    cache: Any = None, position_embeddings: Any = None, **kwargs: Any) -> Any:
            cos, sin = position_embeddings
            return super().forward(hidden_states, attention_mask, position_ids, cache, (cos, -sin), **kwargs)

    bugged = randomize_parameters(hf_build(TurnsBackwards), 0)
    assert _audit(bugged, checks=["reference", "rope"]).status("rope") == "FAIL"


def test_hybrid_model_attention_decodes_with_the_attention_cache() -> None:
    from transformers.models.jamba.modeling_jamba import JambaAttention

    module: Any = randomize_parameters(hf_build(JambaAttention), 0)
    assert module.config.layer_types[0] != "full_attention"  # the tiny config puts a recurrent layer first
    assert _audit(module, checks=["incremental_decoding"]).status("incremental_decoding") == "PASS"

    class ForgetsTheCache(JambaAttention):
        """Bug: each step attends to itself only (the cache is dropped)."""

        def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, cache: Any = None,
                    **kwargs: Any) -> Any:
            return super().forward(hidden_states, attention_mask, None, **kwargs)

    bugged = randomize_parameters(hf_build(ForgetsTheCache), 0)
    assert _audit(bugged, checks=["incremental_decoding"]).status("incremental_decoding") == "FAIL"


def test_a_required_mask_argument_gets_its_models_mask_while_decoding() -> None:
    """ModernBERT's decoder adds its attention mask to the logits unconditionally (its model always builds one):
    decoded with no mask it raised TypeError (Tensor + None), a false FAIL of the sweep. A module that drops its
    cache still fails."""
    from transformers.models.modernbert_decoder.modeling_modernbert_decoder import ModernBertDecoderAttention

    module: Any = randomize_parameters(hf_build(ModernBertDecoderAttention), 0)
    assert _audit(module, checks=["incremental_decoding"]).status("incremental_decoding") == "PASS"

    class ForgetsTheCache(ModernBertDecoderAttention):
        """Bug: each step attends to itself only (the cache is dropped)."""

        def forward(self, hidden_states: torch.Tensor, position_embeddings: Any, attention_mask: Any,
                    cache: Any = None, **kwargs: Any) -> Any:
            mask = None if attention_mask is None else attention_mask[..., -hidden_states.shape[1]:]
            return super().forward(hidden_states, position_embeddings, mask, None, **kwargs)

    bugged = randomize_parameters(hf_build(ForgetsTheCache), 0)
    assert _audit(bugged, checks=["incremental_decoding"]).status("incremental_decoding") == "FAIL"


def test_a_module_that_raises_in_float64_has_its_conventions_inferred_in_float32() -> None:
    """XGLM fills its logits with ``torch.full((), finfo(float64).min)``, a float32 tensor that overflows: every
    float64 call raises. The conventions used to stay the defaults (per-head masks among them, which XGLM refuses,
    so its float32 mask checks failed too); probed in float32 they are its own, and only the float64 rows fail."""
    from transformers.models.xglm.modeling_xglm import XGLMAttention

    module: Any = randomize_parameters(hf_build(XGLMAttention), 0)
    report = _audit(module, dtypes=[torch.float32, torch.float64], checks=["reference", "masking"])
    assert report.status("conventions") == "PASS", report.table()
    assert report.conventions["per_head_masks"] is False
    rows = {(r.name, r.dtype): r for r in report.results}
    assert rows["masking", "float32"].status == "PASS", report.table()
    assert rows["reference", "float64"].status == "FAIL"
    assert "value cannot be converted to type float without overflow" in rows["reference", "float64"].message


def test_a_row_whose_window_holds_only_masked_keys_is_left_unchecked_where_such_rows_are_any() -> None:
    """Qwen3-Omni's Code2Wav attention has a sliding window of 72 keys: with a key padding mask keeping the first 4
    keys, a query past them sees none of them. Counted as a row with a key (the window left out), its output was
    compared with the reference's and a correct module failed `padding` at 127 keys (a false FAIL of the sweep)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2WavAttention

    module: Any = randomize_parameters(hf_build(Qwen3OmniMoeCode2WavAttention), 0)
    adapter = ModuleAdapter(module, hf_spec(module))
    window = adapter.window
    assert window == 72
    t = s = window + 8
    keep = torch.zeros(1, 1, 1, s, dtype=torch.bool)
    keep[..., :4] = True
    example = Example(b=1, h=4, g=2, t=t, s=s, d=4, dv=4, seed=0, dtype="float32", keep=keep.tolist(),
                      is_causal=False, widths=(16, 16, 16), tied=True)
    rows = adapter.rows(keep, example)
    assert rows[0, :, 0].tolist() == [p < window + 3 for p in range(t)]  # query p sees keys j > p - window


def test_forward_taking_layer_idx_and_a_wide_input() -> None:
    from transformers.models.zamba.modeling_zamba import ZambaAttention

    module: Any = randomize_parameters(hf_build(ZambaAttention), 0)
    assert module.q_proj.in_features == module.config.attention_hidden_size == 2 * module.config.hidden_size
    assert _audit(module, checks=["reference", "masking", "incremental_decoding"]).passed

    class IgnoresTheMask(ZambaAttention):
        def forward(self, hidden_states: torch.Tensor, layer_idx: int, attention_mask: Any = None,
                    **kwargs: Any) -> Any:
            return super().forward(hidden_states, layer_idx, None, **kwargs)

    bugged = randomize_parameters(hf_build(IgnoresTheMask), 0)
    assert _audit(bugged, checks=["masking"]).status("masking") == "FAIL"


def test_query_key_value_class_is_audited_on_separate_inputs() -> None:
    from transformers.models.sam3.modeling_sam3 import Sam3Attention

    module: Any = randomize_parameters(hf_build(Sam3Attention), 0)
    spec = hf_spec(module)
    assert not spec.conventions.self_attention
    assert not spec.memory
    report = _audit(module, checks=["reference", "masking"])
    assert report.passed, report.table()

    class SwapsKeyAndValue(Sam3Attention):
        def forward(  # type: ignore[override]
                self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> Any:
            return super().forward(query, value, key, **kwargs)

    bugged = randomize_parameters(hf_build(SwapsKeyAndValue), 0)
    assert _audit(bugged, checks=["reference"]).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name"), [("cohere_asr", "CohereAsrCrossAttention"),
                                             ("mllama", "MllamaTextCrossAttention")])
def test_cross_attention_classes_are_audited_over_their_memory(model: str, name: str) -> None:
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    module: Any = randomize_parameters(hf_build(cls), 0)
    spec = hf_spec(module)
    assert spec.memory
    assert not spec.conventions.self_attention
    report = _audit(module, checks=["reference", "masking", "padding"])
    assert report.passed, report.table()


def test_cross_attention_with_a_planted_bug_fails() -> None:
    from transformers.models.cohere_asr.modeling_cohere_asr import CohereAsrCrossAttention

    class AttendsToItself(CohereAsrCrossAttention):
        """Bug: keys and values from the decoder's own states instead of the memory (when t = s, shapes fit)."""

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: Any = None, **kwargs: Any) -> Any:
            if encoder_hidden_states is not None and encoder_hidden_states.shape == hidden_states.shape:
                encoder_hidden_states = hidden_states
            return super().forward(hidden_states, encoder_hidden_states, **kwargs)

    bugged = randomize_parameters(hf_build(AttendsToItself), 0)
    assert _audit(bugged, checks=["reference"]).status("reference") == "FAIL"


def test_head_indexed_rotary_is_position_free_a_true_behaviour() -> None:
    from transformers.models.neucodec.modeling_neucodec import NeuCodecAttention, NeuCodecRotaryEmbedding

    module: Any = randomize_parameters(hf_build(NeuCodecAttention), 0).double().eval()
    spec = hf_spec(module)
    assert spec.rotary is None
    assert any("position-free" in note for note in hf_notes(module))
    # the repro of the note on the real class: the model's tables (head index as position) change nothing
    x = torch.randn(2, 5, module.config.hidden_size, dtype=torch.float64)
    tables = NeuCodecRotaryEmbedding(config=module.config)(x, torch.arange(module.config.num_attention_heads)[None])
    identity = (torch.ones_like(tables[0]), torch.zeros_like(tables[1]))
    with torch.no_grad():
        turned, plain = (module(x, position_embeddings=t)[0] for t in (tables, identity))
    assert not torch.equal(tables[1], identity[1])
    torch.testing.assert_close(turned, plain, rtol=0, atol=1e-5)  # the tables are float32
    assert _audit(module.float(), checks=["reference", "permutation"]).passed


@pytest.mark.parametrize(("model", "name"), [("olmo2", "Olmo2Attention"), ("gemma3", "Gemma3Attention"),
                                             ("stablelm", "StableLmAttention"), ("glm4v", "Glm4vTextAttention")])
def test_norms_partial_rotary_and_pairings_are_described(model: str, name: str) -> None:
    """OLMo-2's q/k norm over every head, Gemma 3's (1 + weight) norm and rope per layer type, StableLM's quarter
    rotary (heads widened to turn one pair), GLM-4V's interleaved half-rotary M-RoPE."""
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    module: Any = randomize_parameters(hf_build(cls), 0)
    assert hf_limits(module) == []
    report = _audit(module, checks=["reference", "rope"])
    assert report.passed, report.table()


def test_a_skipped_key_norm_fails() -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    module: Any = randomize_parameters(hf_build(Qwen3Attention), 0)
    module.k_norm.forward = lambda x: x  # bug: the key norm is skipped
    assert _audit(module, checks=["reference"]).status("reference") == "FAIL"


def test_classes_the_generic_call_cannot_describe_are_refused_with_the_reason() -> None:
    from transformers.models.pegasus_x.modeling_pegasus_x import PegasusXGlobalLocalAttention

    # its global tokens, which its model passes beside the local ones (Bros's bounding-box embeddings, CPM-Ant's
    # hidden_kv and EfficientLoFTR's image-grid rotary, refused here before, are described now)
    with pytest.raises(AuditUsageError, match="forward needs global_hidden_states"):
        hf_spec(PegasusXGlobalLocalAttention)


def test_what_the_reference_does_not_model_is_listed() -> None:
    from transformers.models.dory.modeling_dory import DoryAttention  # a gate scaled by learned factors

    assert hf_limits(hf_build(DoryAttention)) == ["submodule 'gate_proj' (Linear) the spec does not read",
                                                  "submodule 'attn_sub_norm' (DoryL2Norm) the spec does not read",
                                                  "parameter 'sqk' the spec does not read",  # its learned factors
                                                  "parameter 's_gate' the spec does not read"]


@pytest.mark.parametrize(("model", "name"), [
    ("hunyuan_v1_dense", "HunYuanDenseV1Attention"),  # q/k norms after the rotary turn
    ("recurrent_gemma", "RecurrentGemmaAttention"),  # its own rotary_emb from position_ids, half of each head
    ("chameleon", "ChameleonAttention"),  # q/k LayerNorm with one weight row per head
    ("mimo_v2_flash", "MiMoV2FlashAttention"),  # values scaled by a constant, dv != d, rope per layer type
    ("lfm3", "Lfm3Attention"),  # a hybrid config whose first layer is a convolution: built at its attention index
])
def test_more_shapes_the_spec_describes(model: str, name: str) -> None:
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    module: Any = randomize_parameters(hf_build(cls), 0)
    if model == "lfm3":
        assert module.config.layer_types[module.layer_idx].endswith("attention")
        assert module.layer_idx > 0
        return  # its gate and proportional rope are listed by hf_limits: recognised, not audited
    assert hf_limits(module) == []
    report = _audit(module, checks=["reference", "rope"])
    assert report.passed, report.table()


def test_norms_after_the_turn_with_a_planted_bug() -> None:
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1Attention

    module: Any = randomize_parameters(hf_build(HunYuanDenseV1Attention), 0)
    assert hf_spec(module).norms_after_rotary
    module.key_layernorm.forward = lambda x: x  # bug: the key norm is skipped
    assert _audit(module, checks=["reference"]).status("reference") == "FAIL"


def test_a_value_scale_left_out_fails() -> None:
    from transformers.models.mimo_v2_flash.modeling_mimo_v2_flash import MiMoV2FlashAttention

    module: Any = randomize_parameters(hf_build(MiMoV2FlashAttention), 0)
    spec = hf_spec(module)
    assert module.v_scale != 1.0
    assert spec.weights is not None  # the constant folded into the value projection
    module.v_scale = 1.0  # bug: the values are no longer scaled (the spec read the original constant)
    report = audit_module(module, spec, conventions="infer", checks=["reference"], **QUICK)
    assert report.status("reference") == "FAIL"


def test_rope_turned_the_other_way_is_a_true_finding_with_its_cause() -> None:
    """nanochat's rotate_half is (x2, -x1): every FAIL of the class comes from that, and with the sine negated the
    class matches the reference."""
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.models.nanochat.modeling_nanochat import NanoChatAttention

    from typed_transformer.audit import hf_causes

    module: Any = randomize_parameters(hf_build(NanoChatAttention), 0)
    assert hf_causes(module)[0].startswith("its rotate_half returns (x2, -x1)")
    report = _audit(module, checks=["reference", "rope"])
    assert report.status("rope") == "FAIL"

    class SineNegated(NanoChatAttention):
        def forward(self, hidden_states: torch.Tensor, position_embeddings: Any = None, attention_mask: Any = None,
                    cache: Any = None, **kwargs: Any) -> Any:
            cos, sin = position_embeddings
            return super().forward(hidden_states, (cos, -sin), attention_mask, cache, **kwargs)

    negated: Any = randomize_parameters(hf_build(SineNegated), 0)
    assert _audit(negated, checks=["reference", "rope", "incremental_decoding"]).passed
    assert hf_causes(randomize_parameters(hf_build(LlamaAttention), 0)) == []


def test_a_class_that_needs_as_many_key_value_heads_is_refused_at_fewer() -> None:
    from transformers.models.esmc.modeling_esmc import EsmcAttention

    with pytest.raises(AuditUsageError, match=r"not of the common shape .a call on"):
        hf_spec(randomize_parameters(hf_build(EsmcAttention), 0))
    module = randomize_parameters(hf_build(EsmcAttention, {"num_key_value_heads": 4}), 0)
    assert _audit(module, checks=["reference"]).passed


@pytest.mark.parametrize("rope", [
    # Llama 3's: low frequencies divided by the factor (an original length of 8 puts the tiny head's second pair
    # past the low-frequency wavelength), YaRN's: frequencies blended and cos/sin scaled by 0.1 ln(factor) + 1
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
], ids=["llama3", "yarn"])
def test_rope_types_are_read_from_the_class_rotary_and_a_base_alone_fails(rope: dict[str, Any]) -> None:
    """A rope type other than the default is audited with the frequencies and cos/sin factor the class's own rotary
    module computes (the reference still does the turn); with the base alone the same class fails rope, so the
    frequencies are what makes it pass. A rope type recomputed per call (dynamic) stays a limit."""
    import dataclasses

    from transformers.models.llama.modeling_llama import LlamaAttention

    module = randomize_parameters(hf_build(LlamaAttention, {"rope_parameters": {"rope_theta": 10000.0, **rope}}), 0)
    spec = hf_spec(module)
    assert spec.rotary is not None
    assert spec.rotary.frequencies is not None
    inverse, magnitude = spec.rotary.frequencies(module)
    default = 10000.0 ** (-torch.arange(2, dtype=torch.float64) / 2)
    assert not torch.allclose(inverse.double(), default) or magnitude != 1.0  # the tiny config is not the default
    assert hf_limits(module) == []
    checks = ["reference", "rope", "incremental_decoding"]
    assert audit_module(module, spec, conventions="infer", checks=checks, **QUICK).passed
    base_only = dataclasses.replace(spec, rotary=dataclasses.replace(spec.rotary, frequencies=None))
    assert audit_module(module, base_only, checks=["rope"], **QUICK).status("rope") == "FAIL"


def test_a_rope_type_recomputed_per_call_is_a_limit() -> None:
    from transformers.models.llama.modeling_llama import LlamaAttention

    module = hf_build(LlamaAttention, {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "dynamic",
                                                           "factor": 2.0}})
    assert [limit.split(" (")[0] for limit in hf_limits(module)] == ["rope_type 'dynamic'"]
    assert hf_spec(module).rotary.frequencies is None  # type: ignore[union-attr]
