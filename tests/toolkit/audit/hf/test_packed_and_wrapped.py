"""More Hugging Face layouts audited with zero lines of spec: packed (``cu_seqlens``) vision and audio encoders,
DETR's optional position embeddings, config fields a class never reads, head counts the module chose itself,
projections wrapped in a module of their own, and Pix2Struct's T5-like text attention; a planted bug in the packed
form failing."""

import importlib
import inspect
from typing import Any, Literal

import pytest
import torch
from torch import Tensor

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.known import hf_causes
from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.audit.modules.weights import spec_weights
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _class(model: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)  # type: ignore[no-any-return]


def _passing(model: str, name: str) -> tuple[Any, Any, Any]:
    """The class built, randomized and audited with zero lines: ``(module, spec, report)`` once every check
    passed."""
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    return module, spec, report


@pytest.mark.parametrize(("model", "name", "h", "g", "rotary"), [
    ("qwen2_5_vl", "Qwen2_5_VLVisionAttention", 4, 4, "half"),  # fused qkv, (total, e), its vision rotate_half
    ("glm4v", "Glm4vVisionAttention", 4, 4, "half"),  # text rotary interleaved, vision rotary half
    ("qwen3_omni_moe", "Qwen3OmniMoeAudioAttention", 4, 4, None),  # no rotary
    ("minicpm_ocr", "MiniCPMOcrVisionAttention", 4, 4, None),  # a leading axis of 1: (1, total, e)
    ("detr", "DetrSelfAttention", 4, 4, None),  # position_embeddings optional, added to the inputs
    ("detr", "DetrCrossAttention", 4, 4, None),
    ("voxtral", "VoxtralAttention", 4, 4, None),  # config.num_key_value_heads = 2, never read: keys as wide
    ("gpt_bigcode", "GPTBigCodeAttention", 4, 1, None),  # its own kv_heads (multi_query), not the config's
    ("dia", "DiaCrossAttention", 4, 2, None),  # sizes read from cross_* config fields
    ("pix2struct", "Pix2StructTextAttention", 4, 4, None),  # d_kv, a Linear named output, a decoder's bias
    ("moshi", "MoshiAttention", 4, 2, "half"),  # projections wrapped in MoshiLinear(.linear)
    ("bark", "BarkSelfAttention", 4, 4, None),  # fused att_proj
    ("grounding_dino", "GroundingDinoMultiheadAttention", 4, 4, None),  # forward(queries, keys, values)
    ("sam", "SamAttention", 4, 4, None),  # (b, points, t, e) tokens; attention_mask=attention_similarity
    ("sam2", "Sam2Attention", 4, 4, None),  # (b, t, e) read as t point batches: lifted to one point
    ("blip_2", "Blip2Attention", 4, 4, None),  # passes attention_mask=None on: no mask through **kwargs
    ("zoedepth", "ZoeDepthMultiheadAttention", 4, 4, None),  # (hidden_size, num_attention_heads, dropout)
    ("lxmert", "LxmertAttention", 4, 4, None),  # cross-attention over a required context
    ("t5gemma", "T5GemmaCrossAttention", 4, 2, None),  # cross_attention_hidden_size its config lacks
])
def test_more_layouts_pass_with_zero_lines(model: str, name: str, h: int, g: int, rotary: str | None) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    weights = spec_weights(module, spec)
    assert (weights.h, weights.g) == (h, g)
    assert (spec.rotary.style if spec.rotary else None) == rotary
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    if rotary:
        assert report.status("rope") == "PASS"
    assert hf_limits(module) == []


def test_a_packed_encoder_that_attends_across_its_pieces_fails() -> None:
    """Each image of a packed call attends within itself: one that ignores ``cu_seqlens`` (one piece of every
    token) mixes the batch's sequences, and the audit says so."""
    base = _class("qwen3_omni_moe", "Qwen3OmniMoeAudioAttention")

    class Leaky(base):  # type: ignore[misc, valid-type]
        def forward(self, hidden_states: Tensor, cu_seqlens: Tensor, **kwargs: Any) -> Any:
            whole = torch.tensor([0, hidden_states.shape[0]], dtype=cu_seqlens.dtype)
            return super().forward(hidden_states, whole, **kwargs)

    Leaky.__module__ = base.__module__  # read as the Hugging Face class it derives from
    module = randomize_parameters(hf_build(base), 0)
    module.__class__ = Leaky
    report = audit_module(module, hf_spec(module), **QUICK)
    assert report.status("batch_independence") == "FAIL"
    assert report.status("reference") == "FAIL"


def test_detr_s_position_embeddings_are_named_as_not_tested() -> None:
    module = hf_build(_class("detr", "DetrSelfAttention"))
    assert any("not tested" in note for note in hf_notes(module))


def test_an_eager_function_that_never_applies_the_mask_is_named_as_the_cause() -> None:
    """VJEPA2's ``eager_attention_forward`` takes ``attention_mask`` and never reads it: its pooler's FAILs in every
    masked check are that, named."""
    module = randomize_parameters(hf_build(_class("vjepa2", "VJEPA2PoolerCrossAttention")), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.status("masking") == "FAIL"
    assert report.status("reference") == "PASS"
    assert any("never applies it" in cause for cause in hf_causes(module))
    assert hf_causes(hf_build(_class("llama", "LlamaAttention"))) == []


def test_parameters_of_the_class_the_spec_does_not_read_are_named() -> None:
    """A parameter of the class the spec does not read (one planted in a VITS, whose windowed relative embeddings
    are read): named, not audited (TimesFM's learned query scale is read)."""
    module = hf_build(_class("vits", "VitsAttention"))
    assert hf_limits(module) == []
    module.planted = torch.nn.Parameter(torch.ones(3))
    assert hf_limits(module) == ["parameter 'planted' the spec does not read"]
    assert hf_limits(hf_build(_class("timesfm", "TimesFmAttention"))) == []
    assert hf_limits(hf_build(_class("gpt_oss", "GptOssAttention"))) == []  # its sinks are read
    assert hf_limits(hf_build(_class("sam", "SamVisionAttention"))) == []  # its decomposed tables are read


@pytest.mark.parametrize(("length", "n"), [(7, 3), (7, 7), (7, 13), (1, 5), (31, 9)])
def test_resize_table_is_torch_s_linear_interpolation(length: int, n: int) -> None:
    from typed_transformer.audit.modules.positions import resize_table

    table = torch.randn(length, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    expected = torch.nn.functional.interpolate(table.T[None], size=n, mode="linear")[0].T
    torch.testing.assert_close(resize_table(table, n), expected, rtol=0, atol=1e-12)


def test_decomposed_bias_is_sam_s_on_a_two_dimensional_grid() -> None:
    """Against SAM's own ``get_decomposed_rel_pos`` on a 3 x 5 grid whose tables are resized (27 entries: built for
    14 x 14)."""
    from typed_transformer.audit.modules.positions import decomposed_bias

    module: Any = randomize_parameters(hf_build(_class("sam", "SamVisionAttention")), 0).double()
    b, h, d = 2, 4, int(module.rel_pos_h.shape[1])
    q = torch.randn(b, h, 15, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = module.get_decomposed_rel_pos(q.reshape(b * h, 15, d), module.rel_pos_h, module.rel_pos_w,
                                                 (3, 5), (3, 5)).reshape(b, h, 15, 15)
        ours = decomposed_bias(q, module.rel_pos_h, module.rel_pos_w, (3, 5))
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("model", "name"), [
    ("sam", "SamVisionAttention"), ("sam", "SamVisionSdpaAttention"), ("seggpt", "SegGptAttention"),
    ("got_ocr2", "GotOcr2VisionAttention"),
])
def test_decomposed_relative_positions_pass(model: str, name: str) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec.decomposed is not None
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert any("height table only at distance 0" in note for note in hf_notes(module))


def test_decomposed_relative_positions_read_the_wrong_way_fail() -> None:
    """A SAM whose width table is read with the distance reversed (``k - q`` for ``q - k``) fails ``reference``;
    so does one that drops the tables, while the spec still reads them."""
    module: Any = randomize_parameters(hf_build(_class("sam", "SamVisionAttention")), 0)
    spec = hf_spec(module)
    assert audit_module(module, spec, **QUICK).status("reference") == "PASS"
    own = module.get_rel_pos
    module.get_rel_pos = lambda q_size, k_size, table: own(q_size, k_size, table).flip(0)
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"
    module.get_rel_pos = own
    module.use_rel_pos = False
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


def test_a_tower_takes_its_own_rotary_and_another_s_only_when_there_is_no_other() -> None:
    from typed_transformer.audit.hf.facts import _rotary_class

    audio = hf_build(_class("dots3_note", "Dots3NoteAudioAttention"), {"num_key_value_heads": 4})
    assert getattr(_rotary_class(audio), "__name__", "") == "Dots3NoteAudioRotaryEmbedding"
    text = hf_build(_class("dots3_note", "Dots3NoteTextAttention"))
    assert getattr(_rotary_class(text), "__name__", "") == "Dots3NoteTextRotaryEmbedding"
    only = hf_build(_class("pixtral", "PixtralAttention"))  # its module has only the vision one
    assert getattr(_rotary_class(only), "__name__", "") == "PixtralVisionRotaryEmbedding"


def test_an_encoder_that_takes_a_cache_it_was_never_built_for_is_not_decoded() -> None:
    """Dots3Note's audio attention updates a cache at ``self.layer_idx``, which its constructor never sets."""
    module = randomize_parameters(hf_build(_class("dots3_note", "Dots3NoteAudioAttention"),
                                           {"num_key_value_heads": 4}), 0)
    spec = hf_spec(module)
    assert spec.decode is None
    assert audit_module(module, spec, conventions="infer", **QUICK).passed


def test_an_expert_whose_cache_another_layer_fills_first_is_not_decoded() -> None:
    """PI0.5's action expert reads ``cache.layers[self.layer_idx].keys.device`` before it writes the layer (its VLM
    prefix fills it first): an empty cache raises AttributeError, which is no bug of the class."""
    module = randomize_parameters(hf_build(_class("pi05", "PI05Attention")), 0)
    spec = hf_spec(module)
    assert spec.decode is None
    assert audit_module(module, spec, conventions="infer", **QUICK).passed


def test_a_rotary_apply_the_kernels_package_made_a_module_is_read_through() -> None:
    """transformers 5.25 decorates ``apply_rotary_pos_emb`` with ``use_kernel_forward_from_hub``, which makes it a
    module instance without source; OpenAI's privacy filter's calls ``_apply_rotary_emb``, which turns interleaved
    pairs (read as half pairs, it failed every check)."""
    from typed_transformer.audit.hf.facts import _unkernelized

    modeling = importlib.import_module("transformers.models.openai_privacy_filter.modeling_openai_privacy_filter")
    assert inspect.isfunction(_unkernelized(modeling.apply_rotary_pos_emb))
    assert _unkernelized(modeling.apply_rotary_pos_emb).__name__ == "apply_rotary_pos_emb"
    module = randomize_parameters(hf_build(_class("openai_privacy_filter", "OpenAIPrivacyFilterAttention")), 0)
    spec = hf_spec(module)
    assert spec.rotary is not None
    assert spec.rotary.style == "interleaved"
    assert audit_module(module, spec, conventions="infer", **QUICK).passed


@pytest.mark.parametrize(("model", "name"), [
    ("deepseek_v32", "DeepseekV32Attention"),  # no q_proj attribute; rotary always interleaved; an indexer
    ("bailing_hybrid", "BailingHybridAttention"),  # latent attention with a per-head output gate
    ("persimmon", "PersimmonAttention"),  # query_key_value laid out per head
    ("segformer", "SegformerAttention"),  # forward(hidden_states, height, width), reduction ratio 1
    ("internvl", "InternVLVisionAttention"),  # the output projection named projection_layer
    ("mistral4", "Mistral4Attention"),  # latent attention, its yarn rotary over head_dim * partial_rotary_factor
    ("pe_audio", "PeAudioEncoderAttention"),  # rotary as 2 x 2 matrices on pairs (2i, 2i+1)
])
def test_latent_gated_per_head_and_staged_layouts_pass(model: str, name: str) -> None:
    module = randomize_parameters(hf_build(_class(model, name), {"num_key_value_heads": 4}), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"


def test_a_latent_module_whose_gate_is_dropped_fails() -> None:
    """The reference applies a latent module's output gate: a BailingHybrid whose gate is always open (sigmoid of
    a large logit, the gate dropped) fails, while the spec reads the gate's real weights."""
    module = randomize_parameters(hf_build(_class("bailing_hybrid", "BailingHybridAttention"),
                                           {"num_key_value_heads": 4}), 0)
    spec = hf_spec(module)
    assert spec.latent is not None
    assert spec.gate is not None
    assert audit_module(module, spec, **QUICK).status("reference") == "PASS"
    gate: Any = module.g_proj
    heads = int(gate.out_features)
    gate.forward = lambda x: torch.full((*x.shape[:-1], heads), 30.0, dtype=x.dtype)
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


def test_the_dsa_indexer_is_named_as_not_tested() -> None:
    module = hf_build(_class("deepseek_v32", "DeepseekV32Attention"), {"num_key_value_heads": 4})
    assert any("selection itself is not tested" in note for note in hf_notes(module))


def test_gemma_4_s_value_norm_is_read_and_dropping_it_fails() -> None:
    """Gemma 4 normalises each value head (an RMSNorm without a weight) after a heterogeneous config is built
    homogeneous; its rotary is applied to (b, t, h, d) heads with unsqueeze_dim=2, which is still a rotation."""
    module = randomize_parameters(hf_build(_class("gemma4", "Gemma4TextAttention")), 0)
    spec = hf_spec(module)
    assert spec.v_norm == "v_norm"
    assert spec.rotary is not None
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    norm: Any = module.v_norm
    norm.forward = lambda x: x  # the values left unnormalised
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


def test_llama_4_s_shared_weightless_qk_norm_after_its_complex_rotary() -> None:
    module = randomize_parameters(hf_build(_class("llama4", "Llama4TextAttention")), 0)
    spec = hf_spec(module)
    assert (spec.q_norm, spec.k_norm, spec.norms_after_rotary) == ("qk_norm", "qk_norm", True)
    assert spec.rotary is not None
    assert spec.rotary.style == "interleaved"  # view_as_complex pairs
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    norm: Any = module.qk_norm
    norm.forward = lambda x: x  # the norm dropped
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


def test_values_from_the_key_projection_and_a_cache_the_class_only_reads() -> None:
    """DiffusionGemma's decoder has no v_proj (its values are the keys' projection, then v_norm) and appends to a
    cache its encoder filled, never writing it: audited without token-by-token decoding."""
    cls = _class("diffusion_gemma", "DiffusionGemmaDecoderTextAttention")
    config: Any = hf_build(cls).config
    config.attention_k_eq_v = True  # its full-attention layers: no v_proj
    config.num_hidden_layers = len(config.layer_types)
    # the default rope for that layer (its own, "proportional", is set aside by hf_limits: not what is tested here)
    config.rope_parameters["full_attention"] = {"rope_type": "default", "rope_theta": 10000.0}
    module: Any = randomize_parameters(cls(config, layer_idx=config.layer_types.index("full_attention")), 0)
    assert module.v_proj is None
    spec = hf_spec(module)
    assert (spec.k, spec.v, spec.v_norm) == ("k_proj", "k_proj", "v_norm")
    assert spec.decode is None
    assert audit_module(module, spec, conventions="infer", **QUICK).passed


def test_window_bias_is_swin_s_own_table_lookup() -> None:
    """Against Swin's ``SwinRelativePositionBias`` (its own index buffer) on a 3 x 3 window."""
    from transformers.models.swin.modeling_swin import SwinRelativePositionBias

    from typed_transformer.audit.modules.positions import window_bias

    bias: Any = randomize_parameters(SwinRelativePositionBias(4, (3, 3)), 0).double()
    with torch.no_grad():
        torch.testing.assert_close(window_bias(bias.relative_position_bias_table, (3, 3)), bias()[0], rtol=0, atol=0)


@pytest.mark.parametrize(("model", "name"), [
    ("swin", "SwinAttention"), ("clap", "ClapAudioSelfAttention"), ("clap", "ClapAudioAttention"),
])
def test_swin_windows_pass_at_their_one_length(model: str, name: str) -> None:
    """Swin's windows are built 2 x 2 (its 7 x 7 would be longer than the audit's sequences): every example is one
    window of 4 tokens, with its per-window mask (shared by the heads)."""
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec.conventions.lengths == (4, 4)
    assert spec.position_bias is not None
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert report.status("masking") == "PASS"


def test_a_swin_that_reads_its_table_the_wrong_way_fails() -> None:
    """A Swin whose index buffer is transposed (offset ``j - i`` for ``i - j``) fails ``reference``."""
    module: Any = randomize_parameters(hf_build(_class("swin", "SwinAttention")), 0)
    spec = hf_spec(module)
    assert audit_module(module, spec, **QUICK).status("reference") == "PASS"
    index = module.relative_position_bias.relative_position_index
    module.relative_position_bias.relative_position_index = index.view(4, 4).T.reshape(-1)
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name"), [
    ("deberta", "DisentangledSelfAttention"),  # in_proj split per head, q_bias and v_bias of their own; v1 rows
    ("deberta", "DebertaAttention"),
    ("deberta_v2", "DisentangledSelfAttention"),  # a boolean mask: masked_fill(~attention_mask, min); log buckets
    ("deberta_v2", "DebertaV2Attention"),
    ("sew_d", "DisentangledSelfAttention"),  # share_att_key: the content projections; XSoftmax's boolean mask
    ("sew_d", "SEWDAttention"),
])
def test_deberta_s_disentangled_attention_passes(model: str, name: str) -> None:
    module, spec, report = _passing(model, name)
    assert spec.disentangled is not None
    assert report.status("masking") == "PASS"  # its boolean mask
    assert hf_limits(module) == []
    off = hf_build(_class(model, name), {"relative_attention": False})
    assert hf_spec(off).disentangled is None
    assert any("disentangled attention is off" in note for note in hf_notes(off))


def test_log_bucket_is_deberta_v2_s() -> None:
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from typed_transformer.audit.modules.positions import log_bucket

    distance = torch.arange(-300, 301)
    for buckets, largest in ((8, 256), (256, 512), (32, 64)):
        assert torch.equal(log_bucket(distance, buckets, largest),
                           make_log_bucket_position(distance, buckets, largest).long())


@pytest.mark.parametrize(("model", "name", "t", "atol"), [
    # DeBERTa: distances up to 39, past v2's exact range (4) into its log-spaced buckets and its clamp
    ("deberta_v2", "DisentangledSelfAttention", 40, 1e-6), ("deberta", "DisentangledSelfAttention", 40, 1e-6),
    # the conformers: Shaw's distances clamped at 64, Transformer-XL's shift over 139 rows
    ("wav2vec2_conformer", "Wav2Vec2ConformerSelfAttention", 70, 1e-8),
    ("wav2vec2_bert", "Wav2Vec2BertSelfAttention", 70, 1e-8),
])
def test_position_terms_match_the_module_on_a_long_sequence(model: str, name: str, t: int, atol: float) -> None:
    from typed_transformer.audit.modules.adapter import ModuleAdapter

    module = randomize_parameters(hf_build(_class(model, name)), 0).double()
    adapter = ModuleAdapter(module, hf_spec(module))
    x = torch.randn(2, t, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = adapter.call((x, x, x), None, False, torch.float64)
    assert isinstance(out, Tensor)
    torch.testing.assert_close(out, adapter.reference((x, x, x), None, False, torch.float64), rtol=0, atol=atol)


def test_deberta_reading_its_distances_the_wrong_way_round_fails() -> None:
    """A DeBERTa v2 whose relative embeddings are read in reverse (distance -x for x) fails ``reference``."""
    module: Any = randomize_parameters(hf_build(_class("deberta_v2", "DisentangledSelfAttention")), 0)
    spec = hf_spec(module)
    assert audit_module(module, spec, **QUICK).status("reference") == "PASS"
    own = module.disentangled_attention_bias
    span = int(module.pos_ebd_size)
    module.disentangled_attention_bias = lambda q, k, pos, table, factor: own(q, k, pos, table[:2 * span].flip(0),
                                                                             factor)
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


def test_deberta_without_its_separate_biases_or_per_head_split_fails() -> None:
    """DeBERTa's in_proj is split per head (read in blocks, it fails), and its q_bias is added (a module that leaves
    it out, compared with the weights of one that adds it, fails)."""
    import copy
    import dataclasses

    module: Any = randomize_parameters(hf_build(_class("deberta", "DisentangledSelfAttention")), 0)
    spec = hf_spec(module)
    assert spec.qkv_layout == "heads"
    assert spec.weights is not None
    assert audit_module(module, spec, **QUICK).status("reference") == "PASS"
    blocks = dataclasses.replace(spec, weights=None, qkv_layout="blocks")

    def in_blocks(m: Any) -> Any:
        biases = {"bq": m.q_bias.detach().double(), "bv": m.v_bias.detach().double()}
        return dataclasses.replace(spec_weights(m, blocks), **biases)

    assert audit_module(module, dataclasses.replace(spec, weights=in_blocks), **QUICK).status("reference") == "FAIL"
    biased = copy.deepcopy(module)
    with torch.no_grad():
        module.q_bias.zero_()
        biased.q_bias.fill_(1.0)
    read = spec.weights
    assert audit_module(module, dataclasses.replace(spec, weights=lambda m: read(biased)),
                        **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name", "extra"), [
    ("dab_detr", "DetrAttention", {}),  # object_queries it needs for its values: zeros
    ("table_transformer", "TableTransformerAttention", {}),
    ("mask2former", "Mask2FormerAttention", {}),  # (t, b, e) tokens, a (b h, t, s) mask
    ("fsmt", "Attention", {}),  # (t, b, e) tokens, forward(query, key, ...), a mask named attn_mask
    ("ctrl", "MultiHeadAttention", {}),  # forward(v, k, q, ...): x three times
    ("pp_ocrv5_mobile_rec", "PPOCRV5MobileRecAttention", {}),  # passes attention_mask=None on: no masks
    ("hunyuan_vl", "HunYuanVLVisionAttention", {}),  # packed, eager needs attention_mask=None through **kwargs
    ("inkling2", "Inkling2VisionAttention", {}),  # rotate_pairwise: interleaved pairs
    ("moonshine", "MoonshineAttention", {"num_key_value_heads": 4}),  # partial rotary widened to an even count
])
def test_call_forms_found_by_diagnosis_pass(model: str, name: str, extra: dict[str, Any]) -> None:
    module = randomize_parameters(hf_build(_class(model, name), extra or None), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []


def test_zero_positions_a_detr_class_needs_are_named() -> None:
    module = hf_build(_class("dab_detr", "DetrAttention"))
    assert any("audited with zero" in note and "UnboundLocalError" in note for note in hf_notes(module))
    assert not any("audited with zero" in note for note in hf_notes(hf_build(_class("detr", "DetrSelfAttention"))))


def test_inkling_2_s_pairwise_rotary_read_as_half_fails() -> None:
    import dataclasses

    module = randomize_parameters(hf_build(_class("inkling2", "Inkling2VisionAttention")), 0)
    spec = hf_spec(module)
    assert spec.rotary is not None
    assert spec.rotary.style == "interleaved"
    half = dataclasses.replace(spec, rotary=dataclasses.replace(spec.rotary, style="half"))
    assert audit_module(module, half, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name"), [
    ("timesfm", "TimesFmAttention"),  # softplus(scaling) * c / sqrt(d) per feature, scaling=1.0
    ("timesfm2_5", "TimesFm2_5Attention"),  # the same after its rotary and q_norm
    ("muse_glimmer", "MuseGlimmerTextAttention"),  # a shared weightless qk_norm, then qk_scale_factor on q
    ("muse_spark", "MuseSparkTextAttention"),
])
def test_a_factor_on_the_queries_after_their_norm_passes(model: str, name: str) -> None:
    module, spec, _ = _passing(model, name)
    assert spec.norms is not None
    assert hf_limits(module) == []


def test_a_timesfm_that_drops_its_learned_query_scale_fails() -> None:
    module: Any = randomize_parameters(hf_build(_class("timesfm", "TimesFmAttention")), 0)
    spec = hf_spec(module)
    module._scale_query = lambda query: query / float(module.head_dim) ** 0.5  # the plain 1/sqrt(d) instead
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


def test_log_coordinates_are_swin_v2_s() -> None:
    from transformers.models.swinv2.modeling_swinv2 import Swinv2SelfAttention

    from typed_transformer.audit.modules.positions import log_coordinates

    module: Any = hf_build(Swinv2SelfAttention)
    for window, pretrained in (((3, 3), (0, 0)), ((2, 4), (0, 0)), ((3, 3), (6, 6))):
        module.window_size, module.pretrained_window_size = window, pretrained
        table, _ = module.create_coords_table_and_index()
        torch.testing.assert_close(log_coordinates(window, pretrained), table.double().reshape(-1, 2),
                                   rtol=0, atol=1e-6)


@pytest.mark.parametrize(("model", "name"), [("swinv2", "Swinv2SelfAttention"), ("swin2sr", "Swin2SRAttention")])
def test_swin_v2_s_cosine_attention_and_continuous_bias_pass_and_its_double_mask_is_named(model: str,
                                                                                          name: str) -> None:
    """Cosine attention with a learned scale per head, the bias of an MLP on log-spaced coordinates: the reference
    matches; the mask it adds twice makes a fully masked row NaN, a true behaviour with its cause named."""
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.status("reference") == "PASS"
    assert report.status("masking") == "PASS"
    assert report.conventions["fully_masked"] == "nan"
    assert any("adds its attention mask twice" in cause for cause in hf_causes(module))
    assert hf_limits(module) == []


def test_a_swin_v2_with_linear_coordinates_fails() -> None:
    """A Swin v2 whose bias MLP reads the offsets themselves (not their log-spaced form) fails ``reference``."""
    module: Any = randomize_parameters(hf_build(_class("swinv2", "Swinv2SelfAttention")), 0)
    spec = hf_spec(module)
    assert audit_module(module, spec, **QUICK).status("reference") == "PASS"
    coords = torch.stack(torch.meshgrid(torch.arange(-1.0, 2.0), torch.arange(-1.0, 2.0), indexing="ij"), dim=-1)
    module.relative_coords_table = coords[None] * 8
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name", "bias", "activation"), [
    ("beam", "BeamAttention", "gate_bias", "sigmoid"),  # a per-head bias on the gate's logits
    ("laguna", "LagunaAttention", None, "softplus"),
])
def test_gates_with_a_per_head_bias_or_softplus_pass_and_fail_without(model: str, name: str, bias: str | None,
                                                                      activation: str) -> None:
    import dataclasses

    module: Any = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec.gate is not None
    assert (spec.gate.bias, spec.gate.activation) == (bias, activation)
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert hf_limits(module) == []
    other: Literal["sigmoid", "softplus"] = "sigmoid" if activation == "softplus" else "softplus"
    wrong = dataclasses.replace(spec, gate=dataclasses.replace(spec.gate, bias=None, activation=other))
    assert audit_module(module, wrong, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name", "proj"), [
    ("wav2vec2_conformer", "Wav2Vec2ConformerSelfAttention", "linear_pos"),  # Transformer-XL: u, v, linear_pos
    ("seamless_m4t", "SeamlessM4TConformerSelfAttention", "linear_pos"),
    ("wav2vec2_bert", "Wav2Vec2BertSelfAttention", None),  # Shaw's relative keys: distance_embedding
    ("seamless_m4t_v2", "SeamlessM4Tv2ConformerSelfAttention", None),
])
def test_conformer_relative_positions_pass(model: str, name: str, proj: str | None) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec.relative_keys is not None
    assert spec.relative_keys.proj == proj
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []


def test_conformers_with_their_position_biases_swapped_or_distances_reversed_fail() -> None:
    """Transformer-XL with u and v swapped, Shaw's relative keys read at i - j for j - i: each fails ``reference``."""
    import dataclasses

    xl: Any = randomize_parameters(hf_build(_class("wav2vec2_conformer", "Wav2Vec2ConformerSelfAttention")), 0)
    spec = hf_spec(xl)
    assert spec.relative_keys is not None
    swapped = dataclasses.replace(spec, relative_keys=dataclasses.replace(
        spec.relative_keys, query_bias="pos_bias_u", content_bias="pos_bias_v"))
    assert audit_module(xl, swapped, **QUICK).status("reference") == "FAIL"
    shaw: Any = randomize_parameters(hf_build(_class("wav2vec2_bert", "Wav2Vec2BertSelfAttention")), 0)
    spec = hf_spec(shaw)
    assert spec.relative_keys is not None
    rows = spec.relative_keys.rows
    reversed_rows = dataclasses.replace(spec, relative_keys=dataclasses.replace(
        spec.relative_keys, rows=lambda t, s: rows(t, s).T))
    assert audit_module(shaw, reversed_rows, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name"), [("dinov3_vit", "DINOv3ViTAttention"),
                                             ("eomt_dinov3", "EomtDinov3Attention"), ("sapiens2", "Sapiens2Attention")])
def test_rotary_on_the_patch_tokens_only_passes_and_turning_the_prefix_fails(model: str, name: str) -> None:
    """DINOv3 turns the tokens after its class and register tokens (2 in the tiny config), their positions from 0:
    the reference leaves the prefix unturned; a spec that turns every token fails."""
    import dataclasses

    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec.rotary is not None
    assert spec.rotary.prefix == 2
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("rope") == "PASS"
    assert hf_limits(module) == []
    every = dataclasses.replace(spec, rotary=dataclasses.replace(spec.rotary, prefix=0))
    assert audit_module(module, every, **QUICK).status("reference") == "FAIL"


def test_proportional_rope_turns_every_pair_and_reading_it_as_partial_fails() -> None:
    """LFM 3's proportional rope: the first factor * d / 2 frequencies, then zeros, over the whole head."""
    import dataclasses

    module = randomize_parameters(hf_build(_class("lfm3", "Lfm3Attention")), 0)
    spec = hf_spec(module)
    assert spec.rotary is not None
    assert spec.rotary.fraction == 1.0
    assert spec.rotary.frequencies is not None
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert hf_limits(module) == []
    plain = dataclasses.replace(spec, rotary=dataclasses.replace(spec.rotary, frequencies=None))
    assert audit_module(module, plain, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name", "h"), [
    ("lw_detr", "LwDetrAttention", 8),  # its head count under a config field of its own (decoder_self_attention_heads)
    ("rf_detr", "RfDetrAttention", 8),
    ("hiera", "HieraMaskUnitAttention", 1),  # hidden_size_output, global attention (query stride 1)
    ("patchtsmixer", "PatchTSMixerAttention", 1),  # num_heads from self_attn_heads
    ("parakeet", "ParakeetEncoderAttention", 4),  # Transformer-XL terms under names of its own
    ("sam2_video", "Sam2VideoRoPEAttention", 1),  # (query, key, value) with SAM 2's shared axial rotary
    ("sam3_tracker_video", "Sam3TrackerVideoRoPEAttention", 1),
    ("edgetam_video", "EdgeTamVideoRoPESelfAttention", 1),
    ("sam3", "Sam3ViTRoPEAttention", 4),
])
def test_layouts_found_for_classes_that_did_not_build(model: str, name: str, h: int) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec_weights(module, spec).h == h
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []


def test_a_window_only_the_model_applies_is_a_note_and_decoding_keeps_every_key() -> None:
    """Nemotron ASR's model limits each query to 71 keys (its mask and its sliding-window cache); the layer has no
    window: decoding 100 tokens with a full cache matches the full causal pass and the reference."""
    from typed_transformer.audit.modules.adapter import ModuleAdapter

    module = randomize_parameters(hf_build(_class("nemotron_asr_streaming",
                                                  "NemotronAsrStreamingEncoderAttention")), 0).double()
    spec = hf_spec(module)
    assert spec.decode is not None
    assert any("window of 71 keys" in note for note in hf_notes(module))
    adapter = ModuleAdapter(module, spec)
    x = torch.randn(1, 100, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    decoded = spec.decode(adapter.module(torch.float64), x)
    # (its float32 scale: differences near 1e-6; a cache that drops keys past 71 differs by about 10)
    torch.testing.assert_close(decoded, adapter.reference((x, x, x), None, True, torch.float64), rtol=0, atol=1e-4)


def test_nemotron_s_minus_infinity_fill_is_a_named_cause() -> None:
    """Nemotron ASR fills masked logits with -inf: a fully masked row gives NaN, a true behaviour named as such."""
    module = randomize_parameters(hf_build(_class("nemotron_asr_streaming", "NemotronAsrStreamingEncoderAttention")), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.status("reference") == "PASS"
    assert report.conventions["fully_masked"] == "nan"
    assert any("-inf" in cause for cause in hf_causes(module))


def test_sam_3_s_shared_axial_frequencies_at_half_speed_fail() -> None:
    """SAM 3's axial rotary turns both coordinates by one set of d/4 frequencies, read from its rotary class and
    doubled: a spec whose frequencies are halved fails."""
    import dataclasses

    module = randomize_parameters(hf_build(_class("sam3", "Sam3ViTRoPEAttention")), 0)
    spec = hf_spec(module)
    assert spec.rotary is not None
    read = spec.rotary.frequencies
    assert read is not None
    inverse, _ = read(module)
    half = inverse.shape[0] // 2
    torch.testing.assert_close(inverse[:half], inverse[half:])  # the same set for both coordinates
    slow = dataclasses.replace(spec, rotary=dataclasses.replace(
        spec.rotary, frequencies=lambda m: (read(m)[0] * 0.5, read(m)[1])))
    assert audit_module(module, slow, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name"), [
    ("gemma3n", "Gemma3nTextAttention"),  # one layer raises in kv_sharing: every layer type built
    ("xlm", "MultiHeadAttention"),  # a required mask, read as (mask == 0)
    ("flaubert", "MultiHeadAttention"),
    ("luke", "LukeSelfAttention"),  # entity_hidden_states None, as its model passes it without entities
    ("ibert", "IBertSelfAttention"),  # quant_mode off: hidden_states_scaling_factor None
    ("perceiver", "PerceiverSelfAttention"),  # sized from its model's call sites, its input norm bypassed
    ("squeezebert", "SqueezeBertSelfAttention"),  # 1 x 1 Conv1d projections on (b, c, t)
    ("moonshine_streaming", "MoonshineStreamingAttention"),  # num_key_value_heads its config lacks
    ("gpt_neox_japanese", "GPTNeoXJapaneseAttention"),  # no .config: the one it was built from
    ("layoutlmv2", "LayoutLMv2SelfAttention"),  # rel_pos and rel_2d_pos as zeros, q_bias and v_bias
    ("evolla", "EvollaSaProtSelfAttention"),  # the rotary class named after the class
    ("exaone4_5", "Exaone4_5_Attention"),  # a text class whose module has only a vision rotary
    ("ernie4_5_vl_moe", "Ernie4_5_VLMoeTextAttention"),  # M-RoPE sections that need a head of 6
    ("blt", "BltCrossAttention"),  # norms of its inputs before the projections, bypassed
])
def test_classes_that_did_not_build_now_pass(model: str, name: str) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    if model == "luke":  # its entity projections serve the path not taken: a note says it is not tested
        assert any("not tested" in note for note in hf_notes(module))


def test_gpt_1_s_causal_fill_is_a_named_cause_and_its_unscaled_default_a_note() -> None:
    module = randomize_parameters(hf_build(_class("openai", "Attention")), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.status("reference") == "PASS"
    assert report.status("masking") == "FAIL"
    assert any("-1e4" in cause for cause in hf_causes(module))
    assert any("scale=False" in note for note in hf_notes(module))


def test_recurrences_and_channel_attention_are_listed_as_not_dot_product() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
    from benchmarks.audit_hf_sweep import not_dot_product

    for name in ("RwkvSelfAttention", "MobileViTV2LinearSelfAttention", "Florence2VisionChannelAttention",
                 "PatchTSMixerGatedAttention", "VisualBertRegionToPhraseAttention"):
        assert not_dot_product(name) is not None, name
    for name in ("LlamaAttention", "Florence2VisionWindowAttention", "PatchTSMixerAttention"):
        assert not_dot_product(name) is None, name


@pytest.mark.parametrize(("model", "name", "noted"), [
    ("llama4", "Llama4VisionAttention", "freqs_ci"),  # its complex table under a name of its own; no mask used
    ("fastspeech2_conformer", "FastSpeech2ConformerAttention", "padding"),  # Transformer-XL, (b, 1, s) masks only
    ("step3p7", "Step3p7VisionAttention", None),  # axial rotary, width first
])
def test_rotary_and_relative_tables_under_other_names_pass(model: str, name: str, noted: str | None) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    if noted is not None:
        assert any(noted in note for note in hf_notes(module)), hf_notes(module)


def test_step_3_7_s_axial_rotary_turned_height_first_fails() -> None:
    import dataclasses

    module = randomize_parameters(hf_build(_class("step3p7", "Step3p7VisionAttention")), 0)
    spec = hf_spec(module)
    assert spec.mrope is not None
    assert spec.mrope.axes is not None
    swapped = dataclasses.replace(spec, mrope=dataclasses.replace(spec.mrope, axes=spec.mrope.axes[::-1]))
    assert audit_module(module, swapped, **QUICK).status("reference") == "FAIL"


def test_the_module_adapter_s_methods_are_shape_checked() -> None:
    """A bias over 5 keys beside 3 keys is refused by ModuleAdapter's own check, naming the argument (unchecked,
    the sum would fail deep inside with a broadcasting error)."""
    from jaxtyping import TypeCheckError

    from typed_transformer.audit.modules.adapter import ModuleAdapter

    module = randomize_parameters(hf_build(_class("sam", "SamVisionAttention")), 0)
    adapter = ModuleAdapter(module, hf_spec(module))
    q = torch.zeros(2, 4, 3, 4, dtype=torch.float64)
    with pytest.raises(TypeCheckError, match="bias"):
        adapter.with_content(torch.zeros(1, 4, 3, 5, dtype=torch.float64), q, q)
