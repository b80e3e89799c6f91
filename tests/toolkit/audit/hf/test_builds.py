"""Hugging Face classes the sweep could not build before, audited with zero lines of spec: DBRX's clipped
projections (``clip_qkv``, modelled), Cohere Compass with default rotary parameters, EfficientLoFTR with its key/value
heads tied to its query heads, Gemma 4's vision attention (blocked axial rotary), WavTokenizer's single head and
JetMoE's mixture of attention with one expert; each passing, and a planted bug in each new piece failing."""

import dataclasses
import importlib
from typing import Any

import pytest
import torch

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _class(model: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)  # type: ignore[no-any-return]


def _audit(module: Any, spec: Any) -> Any:
    return audit_module(module, spec, conventions="infer", **QUICK)



def _passes_noted(module: Any, spec: Any, noted: str) -> None:
    """Nothing the reference lacks, a note containing ``noted``, and every check passing, the reference's among them."""
    assert not hf_limits(module)
    assert any(noted in n for n in hf_notes(module))
    report = _audit(module, spec)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"

def test_dbrx_builds_with_its_released_clip_and_passes() -> None:
    module: Any = randomize_parameters(hf_build(_class("dbrx", "DbrxAttention")), 0)
    assert module.clip_qkv == 8.0  # its config's default None makes forward raise
    spec = hf_spec(module)
    assert spec.clip_qkv == "clip_qkv"
    assert not hf_limits(module)
    assert any("clip_qkv=None makes forward raise" in n for n in hf_notes(module))
    report = _audit(module, spec)
    assert report.passed, report.table()


def test_a_clip_the_reference_leaves_out_fails_the_reference() -> None:
    """A bound the audit's projections cross (0.5): the clip modelled, every check passes; left out, the
    reference fails."""
    module: Any = randomize_parameters(hf_build(_class("dbrx", "DbrxAttention")), 0)
    module.clip_qkv = 0.5
    spec = hf_spec(module)
    assert _audit(module, spec).passed
    report = _audit(module, dataclasses.replace(spec, clip_qkv=None))
    assert report.status("reference") == "FAIL"


def test_olmo_s_config_clip_is_modelled() -> None:
    """OLMo clamps q, k and v with ``config.clip_qkv`` (None by default: no clamp)."""
    module: Any = randomize_parameters(hf_build(_class("olmo", "OlmoAttention")), 0)
    module.config.clip_qkv = 0.5
    spec = hf_spec(module)
    assert spec.clip_qkv == "config.clip_qkv"
    assert _audit(module, spec).passed
    assert _audit(module, dataclasses.replace(spec, clip_qkv=None)).status("reference") == "FAIL"


def test_a_clip_after_the_qk_norms_is_a_limit() -> None:
    """OLMoE clamps its normalised queries and keys: not modelled, named as a limit when a bound is set."""
    module: Any = hf_build(_class("olmoe", "OlmoeAttention"))
    assert not hf_limits(module)
    module.config.clip_qkv = 0.5
    assert hf_spec(module).clip_qkv is None
    assert any("clip_qkv" in limit for limit in hf_limits(module))


def test_cohere_compass_gets_default_rotary_parameters_per_layer_type() -> None:
    """Its text config's default ``rope_parameters = {}`` (its model's rotary class raises a KeyError): each layer
    type gets default parameters, named in the notes; the rotary path is then audited and passes."""
    module: Any = randomize_parameters(hf_build(_class("cohere_compass", "CohereCompassAttention")), 0)
    assert module.config.rope_parameters == {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    spec = hf_spec(module)
    assert spec.rotary is not None
    assert spec.rotary.style == "half"
    _passes_noted(module, spec, "rope_parameters = {}")


def test_qwen4_exp_builds_with_a_qsa_indexer_and_is_set_aside_with_its_reasons() -> None:
    """Its attention builds a QSA indexer whatever the config, and the default config leaves the indexer's sizes
    None (a TypeError): the tiny ones build it; interleaved M-RoPE and the indexer keep it set aside, by name."""
    module: Any = hf_build(_class("qwen4_exp", "Qwen4ExpTextAttention"))
    assert module.indexer.token_budget == 256
    assert module.indexer.compress_ratio == 2
    limits = hf_limits(module)
    assert any("interleaved" in limit for limit in limits)
    assert any("'indexer'" in limit for limit in limits)


def test_efficientloftr_is_built_with_its_tied_heads_and_audited_without_its_width_rotary() -> None:
    """Its config sets num_key_value_heads = num_attention_heads whatever it is given (the tiny config keeps them
    equal), and its optional rotary tables turn the whole width before the heads are split (not modelled): audited
    without them, named in the notes."""
    module: Any = randomize_parameters(hf_build(_class("efficientloftr", "EfficientLoFTRAttention")), 0)
    assert module.config.num_key_value_heads == module.config.num_attention_heads == 4
    spec = hf_spec(module)
    assert spec.rotary is None
    _passes_noted(module, spec, "across the whole model width")


def test_a_single_head_block_of_1x1_convolutions_is_audited_as_one_head() -> None:
    """WavTokenizer's Vocos attention keeps no head count: one head over every channel (``torch.bmm`` of the whole
    query and key, ``channels**-0.5``), (b, e, t) in and out; its GroupNorm named as bypassed."""
    module: Any = randomize_parameters(hf_build(_class("wavtokenizer", "WavTokenizerVocosAttention")), 0)
    spec = hf_spec(module)
    assert spec.num_heads == "1"
    _passes_noted(module, spec, "pre-norm inside the class")


def test_a_single_head_block_that_weighs_its_keys_fails() -> None:
    """The same block weighing its keys instead of its values: the reference fails."""
    cls = _class("wavtokenizer", "WavTokenizerVocosAttention")

    class Wrong(cls):  # type: ignore[misc,valid-type]
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            x = self.norm(hidden_states)
            q, k = self.q(x), self.k(x)
            weights = torch.softmax(torch.bmm(q.permute(0, 2, 1), k) * q.shape[1] ** -0.5, dim=2)
            out: torch.Tensor = hidden_states + self.proj_out(torch.bmm(k, weights.permute(0, 2, 1)))
            return out

    module: Any = randomize_parameters(hf_build(cls), 0)
    spec = hf_spec(module)
    module.__class__ = Wrong
    report = _audit(module, dataclasses.replace(spec, module_type=""))
    assert not report.passed
    assert report.status("conventions") == "FAIL"
    assert "differs from the reference" in next(r.message for r in report.results if r.name == "conventions")


def test_gemma4_vision_s_blocked_axial_rotary_passes() -> None:
    """Gemma 4's vision rotary turns a block of d/2 features by the height and the next by the width
    (``rotate_half`` within each block, the same d/4 frequencies): the blocked M-RoPE of the reference."""
    module: Any = randomize_parameters(hf_build(_class("gemma4", "Gemma4VisionAttention")), 0)
    spec = hf_spec(module)
    assert spec.mrope is not None
    assert spec.mrope.blocks
    assert spec.mrope.axes == (1, 2)
    assert not hf_limits(module)
    assert any("use_clipped_linears" in n for n in hf_notes(module))
    report = _audit(module, spec)
    assert report.passed, report.table()
    assert report.status("rope") == "PASS"


def test_gemma4_vision_turning_its_blocks_by_the_wrong_axes_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: its rotary helper given the tables with the height and width halves swapped (the first block
    turned by the width): the rope check fails."""
    modeling = importlib.import_module("transformers.models.gemma4.modeling_gemma4")
    original = modeling.apply_multidimensional_rope

    def swapped(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor,
                unsqueeze_dim: int = 2) -> torch.Tensor:
        def flip(z: torch.Tensor) -> torch.Tensor:
            return torch.cat(z.chunk(2, dim=-1)[::-1], dim=-1)

        result: torch.Tensor = original(x, flip(cos), flip(sin), position_ids, unsqueeze_dim)
        return result

    module: Any = randomize_parameters(hf_build(_class("gemma4", "Gemma4VisionAttention")), 0)
    spec = hf_spec(module)
    monkeypatch.setattr(modeling, "apply_multidimensional_rope", swapped)
    report = _audit(module, spec)
    assert not report.passed
    assert "FAIL" in (report.status("conventions"), report.status("reference"))
    assert report.status("rope") == "FAIL"


def test_the_blocked_rotary_matches_gemma4_s_own_helper() -> None:
    """The reference's blocked turn of (b, h, t, d) heads equals ``apply_multidimensional_rope`` on the tables
    Gemma 4's vision rotary class makes from the same (height, width) positions."""
    from typed_transformer.audit.modules.adapter import ModuleAdapter
    from typed_transformer.audit.modules.positions import mrope_positions

    modeling = importlib.import_module("transformers.models.gemma4.modeling_gemma4")
    module: Any = hf_build(_class("gemma4", "Gemma4VisionAttention"))
    adapter = ModuleAdapter(module, hf_spec(module))
    b, h, t, d = 2, 4, 6, module.head_dim
    x = torch.randn(b, h, t, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = mrope_positions(0, t)[1:].T[None].expand(b, -1, -1)
    cos, sin = modeling.Gemma4VisionRotaryEmbedding(module.config)(x, positions)
    theirs = modeling.apply_multidimensional_rope(x.transpose(1, 2), cos.double(), sin.double(), positions)
    torch.testing.assert_close(adapter._turn(x, 0), theirs.transpose(1, 2), rtol=1e-6, atol=1e-6)


def test_jetmoe_with_one_expert_passes_and_routing_is_refused() -> None:
    """JetMoE's mixture of attention with one expert for every token (gate 1): plain rotary attention through the
    expert's projections; several experts (its checkpoints' routing) are refused by name."""
    cls = _class("jetmoe", "JetMoeAttention")
    module: Any = randomize_parameters(hf_build(cls), 0)
    spec = hf_spec(module)
    assert spec.weights is not None
    assert not hf_limits(module)
    assert any("mixture of attention" in n for n in hf_notes(module))
    report = _audit(module, spec)
    assert report.passed, report.table()
    assert report.status("incremental_decoding") == "PASS"
    routed: Any = hf_build(cls, {"num_local_experts": 2, "num_experts_per_tok": 2})
    assert spec.unmodelled is not None
    assert spec.unmodelled(routed) == ["num_local_experts=2, num_experts_per_tok=2 (routed query and output "
                                       "projections, top-k gates)"]


def test_jetmoe_that_drops_its_output_bias_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: the experts' output bias left out of the merge."""
    modeling = importlib.import_module("transformers.models.jetmoe.modeling_jetmoe")
    module: Any = randomize_parameters(hf_build(_class("jetmoe", "JetMoeAttention")), 0)
    spec = hf_spec(module)
    original = modeling.JetMoeMoA.reduce

    def without_bias(self: Any, layer_input: torch.Tensor, topo_info: Any) -> torch.Tensor:
        out: torch.Tensor = original(self, layer_input, topo_info) - self.bias
        return out

    monkeypatch.setattr(modeling.JetMoeMoA, "reduce", without_bias)
    report = _audit(module, spec)
    assert not report.passed
    assert "FAIL" in (report.status("conventions"), report.status("reference"))


def test_eager_unless_the_class_has_no_eager_fallback() -> None:
    """SDPA only for a forward that looks its attention function up with no eager fallback (Qwen2.5-Omni's
    DiTAttention); a lookup beside ``eager_attention_forward`` (transformers 5.0's GPT-2, under ``!= "eager"``) is
    eager, as are the classes that call ``get_interface``."""
    from typed_transformer.audit.hf.build import _attention_implementation

    class Fallback(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> str:  # the source is what is read
            return "eager_attention_forward; ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]"

    assert _attention_implementation(Fallback) == "eager"
    assert _attention_implementation(_class("qwen2_5_omni", "DiTAttention")) == "sdpa"
    assert _attention_implementation(_class("llama", "LlamaAttention")) == "eager"
    gpt2: Any = hf_build(_class("gpt2", "GPT2Attention"))
    assert gpt2.config._attn_implementation == "eager"
