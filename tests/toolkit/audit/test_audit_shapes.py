"""Attention shapes beyond plain self-attention, each audited on a real module (PASS) and with a bug planted in
that very feature (FAIL in the right check): cross-attention with one memory tensor, an additive position bias
(T5's relative bias without 1/sqrt(d), ALiBi), partial rotary, sliding windows, q/k norms and
``nn.MultiheadAttention``'s ``add_bias_kv``/``add_zero_attn``.

Hugging Face modules come from tiny configs (nothing is downloaded); they are skipped when transformers is not
installed (CI installs the ``audit-test`` extra). Float32 only: Hugging Face's rotary tables are float32, which a
float64 audit reports (see the module audit tests)."""

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from typed_transformer import MultiHeadAttention
from typed_transformer.audit import SPECS, AuditReport, Conventions, ModuleSpec, alibi_bias, audit_module
from typed_transformer.positions import ALiBiPositionalBias
from typed_transformer.strategies import randomize_parameters

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 5, "dtypes": (torch.float32,)}


def _transformers() -> Any:
    return pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")


def _hf(config_name: str, module_path: str, cls: str, *args: Any, **config: Any) -> nn.Module:
    import importlib

    transformers = _transformers()
    hf_config = getattr(transformers, config_name)(**config)
    hf_config._attn_implementation = "eager"
    module: nn.Module = getattr(importlib.import_module(module_path), cls)(hf_config, *args)
    return randomize_parameters(module, 0)


def gpt2_cross() -> nn.Module:
    return _hf("GPT2Config", "transformers.models.gpt2.modeling_gpt2", "GPT2Attention", True, 0, n_embd=8, n_head=2)


def _seq2seq(config_name: str, module_path: str, cls: str) -> nn.Module:
    import importlib

    transformers = _transformers()
    hf_config = getattr(transformers, config_name)()
    hf_config._attn_implementation = "eager"
    module: nn.Module = getattr(importlib.import_module(module_path), cls)(8, 2, is_decoder=True, config=hf_config,
                                                                          layer_idx=0)
    return randomize_parameters(module, 0)


def bart() -> nn.Module:
    return _seq2seq("BartConfig", "transformers.models.bart.modeling_bart", "BartAttention")


def whisper() -> nn.Module:
    return _seq2seq("WhisperConfig", "transformers.models.whisper.modeling_whisper", "WhisperAttention")


def t5(is_decoder: bool = False) -> Any:
    # few buckets and a short max distance: lengths up to 6 reach several buckets, and the log-spaced ones
    module = _hf("T5Config", "transformers.models.t5.modeling_t5", "T5Attention", True, d_model=8, d_kv=4,
                 num_heads=2, relative_attention_num_buckets=6, relative_attention_max_distance=8,
                 is_decoder=is_decoder)
    return module


def bloom(heads: int = 4) -> nn.Module:
    return _hf("BloomConfig", "transformers.models.bloom.modeling_bloom", "BloomAttention", 0,
               hidden_size=3 * heads, n_head=heads)


def falcon(**layout: Any) -> nn.Module:
    """Falcon's newer layout by default: four query heads in two key/value groups, fused per group."""
    layout = layout or {"new_decoder_architecture": True, "num_kv_heads": 2}
    return _hf("FalconConfig", "transformers.models.falcon.modeling_falcon", "FalconAttention", 0, hidden_size=16,
               num_attention_heads=4, bias=True, **layout)


def gpt_neox() -> nn.Module:
    return _hf("GPTNeoXConfig", "transformers.models.gpt_neox.modeling_gpt_neox", "GPTNeoXAttention", 0,
               hidden_size=16, num_attention_heads=2, rotary_pct=0.5)


def phi() -> nn.Module:
    return _hf("PhiConfig", "transformers.models.phi.modeling_phi", "PhiAttention", 0, hidden_size=16,
               num_attention_heads=2, num_key_value_heads=2, partial_rotary_factor=0.5, qk_layernorm=True)


def mistral() -> nn.Module:
    return _hf("MistralConfig", "transformers.models.mistral.modeling_mistral", "MistralAttention", 0,
               hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4, sliding_window=3)


def qwen2() -> nn.Module:
    return _hf("Qwen2Config", "transformers.models.qwen2.modeling_qwen2", "Qwen2Attention", 0, hidden_size=16,
               num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=3,
               max_window_layers=0)


def qwen3() -> nn.Module:
    return _hf("Qwen3Config", "transformers.models.qwen3.modeling_qwen3", "Qwen3Attention", 0, hidden_size=16,
               num_attention_heads=4, num_key_value_heads=2, head_dim=4)


def olmo2() -> nn.Module:
    return _hf("Olmo2Config", "transformers.models.olmo2.modeling_olmo2", "Olmo2Attention", 0, hidden_size=16,
               num_attention_heads=4, num_key_value_heads=2)


def torch_mha_bias_kv() -> nn.Module:
    module = nn.MultiheadAttention(8, 2, kdim=6, vdim=5, add_bias_kv=True, add_zero_attn=True, batch_first=True)
    return randomize_parameters(module, 0)


class ALiBiAttention(nn.Module):
    """Our attention with ALiBi's bias, as a decoder block holds them."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.alibi = ALiBiPositionalBias(num_heads)

    def forward(self, x: Tensor, keep: Tensor | None, is_causal: bool) -> Tensor:
        bias = self.alibi(x.shape[1], dtype=x.dtype)
        out: Tensor = self.attn(x, attn_mask=keep, attn_bias=bias, is_causal=is_causal)[0]
        return out


def _alibi_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                   is_causal: bool) -> Tensor:
    out: Tensor = m(x, keep, is_causal)
    return out


ALIBI = ModuleSpec("alibi", _alibi_forward, Conventions(self_attention=True), qkv="attn.in_proj", q=None, k=None,
                   v=None, out="attn.out_proj", num_heads="attn.num_heads", num_kv_heads="attn.num_kv_heads",
                   head_dim="attn.head_dim",
                   position_bias=lambda m, t, s: alibi_bias(m.attn.num_heads, t, s))


def alibi() -> ALiBiAttention:
    return randomize_parameters(ALiBiAttention(8, 4), 0)


#: (spec, factory): each passes every check it runs in float32
CASES: list[tuple[ModuleSpec | str, Callable[[], nn.Module]]] = [
    ("gpt2_cross", gpt2_cross), ("bart", bart), ("whisper", whisper), ("t5", t5), ("t5", lambda: t5(True)),
    (ALIBI, alibi), ("bloom", bloom), ("bloom", lambda: bloom(6)),
    ("falcon", falcon), ("falcon", lambda: falcon(multi_query=True)), ("falcon", lambda: falcon(multi_query=False)),
    ("gpt_neox", gpt_neox), ("phi", phi), ("mistral", mistral), ("qwen2", qwen2), ("qwen3", qwen3),
    ("olmo2", olmo2), ("torch_mha", torch_mha_bias_kv)]


@pytest.mark.parametrize(("spec", "factory"), CASES,
                         ids=[f"{s if isinstance(s, str) else s.name}-{i}" for i, (s, _) in enumerate(CASES)])
def test_each_shape_audits_its_real_module(spec: ModuleSpec | str, factory: Callable[[], nn.Module]) -> None:
    report = audit_module(factory(), spec, **QUICK)
    assert report.passed, report.table()
    ran = {r.name for r in report.results if r.status == "PASS"}
    assert {"reference", "causality", "masking", "padding", "gradients"} <= ran


def _fails(report: AuditReport, check: str) -> None:
    assert report.status(check) == "FAIL", report.table()


# ----------------------------------------------------------------------------------------------------
# Cross-attention with one memory tensor
# ----------------------------------------------------------------------------------------------------


def test_the_spec_feeds_one_memory_tensor_as_keys_and_values() -> None:
    module = gpt2_cross()
    adapter_ins = (torch.randn(1, 3, 8, dtype=torch.float64), torch.randn(1, 4, 8, dtype=torch.float64),
                   torch.randn(1, 4, 8, dtype=torch.float64))
    from typed_transformer.audit import ModuleAdapter

    adapter = ModuleAdapter(module, SPECS["gpt2_cross"])
    out = adapter.call(adapter_ins, None, False, torch.float64)
    by_hand = module.double().eval()(adapter_ins[0], encoder_hidden_states=adapter_ins[1])[0]
    torch.testing.assert_close(out, by_hand, rtol=0.0, atol=0.0)
    torch.testing.assert_close(adapter.reference(adapter_ins, None, False, torch.float64), by_hand)


def test_gpt2_cross_attention_that_forgets_the_last_memory_position_fails_reference() -> None:
    modeling = pytest.importorskip("transformers.models.gpt2.modeling_gpt2")

    class Forgetful(modeling.GPT2Attention):  # type: ignore[misc,name-defined]
        def forward(self, x: Tensor, encoder_hidden_states: Tensor, encoder_attention_mask: Tensor,
                    **kwargs: Any) -> Any:
            return super().forward(x, encoder_hidden_states=encoder_hidden_states[:, :-1],
                                   encoder_attention_mask=encoder_attention_mask[..., :-1])

    module = gpt2_cross()
    module.__class__ = Forgetful
    report = audit_module(module, "gpt2_cross", **QUICK)
    _fails(report, "reference")


def test_bart_cross_attention_that_drops_its_mask_fails_masking() -> None:
    module = bart()
    forward = module.forward

    def no_mask(x: Tensor, key_value_states: Tensor, attention_mask: Tensor, **kwargs: Any) -> Any:
        return forward(x, key_value_states=key_value_states, attention_mask=None)

    module.forward = no_mask
    report = audit_module(module, "bart", **QUICK)
    _fails(report, "masking")
    assert report.status("reference") == "PASS"


# ----------------------------------------------------------------------------------------------------
# Additive position bias
# ----------------------------------------------------------------------------------------------------


def test_t5_scaled_by_one_over_sqrt_d_fails_reference() -> None:
    module = t5()
    project = module.q.forward
    module.q.forward = lambda x: project(x) / 2.0  # 1/sqrt(d_kv = 4)
    _fails(audit_module(module, "t5", **QUICK), "reference")


def test_t5_with_its_relative_positions_reversed_fails_reference() -> None:
    module = t5()
    compute = module.compute_bias

    def reversed_bias(query_length: int, key_length: int, *args: Any, **kwargs: Any) -> Tensor:
        bias: Tensor = compute(query_length, key_length, *args, **kwargs)
        return bias.transpose(-1, -2) if query_length == key_length else bias

    module.compute_bias = reversed_bias
    _fails(audit_module(module, "t5", **QUICK), "reference")


def test_alibi_with_its_slopes_in_reverse_head_order_fails_reference() -> None:
    module = alibi()
    module.alibi.slopes = module.alibi.slopes.flip(0)
    _fails(audit_module(module, ALIBI, **QUICK), "reference")


def test_bloom_with_its_slopes_in_reverse_head_order_fails_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    module = bloom(6)  # six heads: the paper's interpolated slopes
    modeling = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    slopes = modeling._get_alibi_slopes
    monkeypatch.setattr(modeling, "_get_alibi_slopes", lambda heads, device: slopes(heads, device).flip(0))
    _fails(audit_module(module, "bloom", checks=["reference"], **QUICK), "reference")


def test_alibi_bias_is_the_papers() -> None:
    bias = alibi_bias(2, 2, 3)  # slopes 2^-4, 2^-8; queries at positions 1 and 2
    distance = torch.tensor([[[-1, 0, -1], [-2, -1, 0]]], dtype=torch.float64)
    expected = distance * torch.tensor([2**-4, 2**-8], dtype=torch.float64)[:, None, None]
    torch.testing.assert_close(bias, expected, rtol=0.0, atol=0.0)
    # BLOOM's form: m_i * j, one constant per query row away from the paper's under the causal mask
    key = alibi_bias(2, 2, 3, form="key")
    torch.testing.assert_close(key, torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64).expand(2, 3)
                               * torch.tensor([2**-4, 2**-8], dtype=torch.float64)[:, None, None], rtol=0.0, atol=0.0)
    # three heads: the two slopes of two heads, then the first of four's odd ones (the paper's interpolation)
    assert alibi_bias(3, 1, 2, form="key")[:, 0, 1].tolist() == [2**-4, 2**-8, 2**-2]


# ----------------------------------------------------------------------------------------------------
# Partial rotary, q/k norms
# ----------------------------------------------------------------------------------------------------


def test_gpt_neox_rotating_the_last_dimensions_instead_of_the_first_fails_rope(
        monkeypatch: pytest.MonkeyPatch) -> None:
    module = gpt_neox()
    modeling = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")
    rotate = modeling.apply_rotary_pos_emb

    def last(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, *args: Any) -> tuple[Tensor, Tensor]:
        r = cos.shape[-1]
        qr, kr = rotate(q[..., -r:], k[..., -r:], cos, sin, *args)
        return torch.cat([q[..., :-r], qr], dim=-1), torch.cat([k[..., :-r], kr], dim=-1)

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", last)
    report = audit_module(module, "gpt_neox", **QUICK)
    _fails(report, "rope")
    assert report["rope"].message.endswith("; the rotation itself: it rotates the last 4 of 8 dimensions of each head "
                                           "instead of the first")


def test_phi_rotating_the_whole_head_fails_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    module = phi()
    modeling = pytest.importorskip("transformers.models.phi.modeling_phi")
    embedding = modeling.PhiRotaryEmbedding

    class WholeHead(embedding):  # type: ignore[misc,valid-type]
        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            import copy

            config = copy.deepcopy(config)
            config.rope_parameters["partial_rotary_factor"] = 1.0
            super().__init__(config, *args, **kwargs)

    monkeypatch.setattr(modeling, "PhiRotaryEmbedding", WholeHead)
    module.rotary_ndims = module.head_dim
    report = audit_module(module, "phi", **QUICK)
    _fails(report, "rope")
    assert report["rope"].message.endswith("; the rotation itself: it rotates all 8 dimensions of each head, where the "
                                           "spec says the first 4")


def test_a_rope_failure_caused_by_a_dropped_key_bias_is_not_blamed_on_the_rotation() -> None:
    """The rope check compares outputs, so it fails with whatever breaks them: a bias the key projection forgets
    (which the rotation then turns with each key) is named as such, and as what fails reference too."""
    module: Any = qwen2()
    module.k_proj.forward = lambda x: torch.nn.functional.linear(x, module.k_proj.weight)
    report = audit_module(module, "qwen2", checks=["reference", "rope"], **QUICK)
    assert report.failed == ["reference", "rope"], report.table()
    assert report["rope"].message.endswith("; not the rotation: the k projection's bias is left out, which the rope "
                                           "check depends on (reference fails the same way)")
    [cause] = report.causes
    assert cause.diagnosis == "the module matches the reference when the k projection's bias is left out"


def test_olmo2_normalising_each_head_alone_fails_reference() -> None:
    """OLMo-2's norm runs over every head at once; per head is another function of the same weight."""
    module: Any = olmo2()
    norm = module.q_norm
    weight = norm.weight.detach()

    def per_head(x: Tensor) -> Tensor:
        from einops import rearrange

        heads = rearrange(x, "... (h d) -> ... h d", h=4)
        y = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        result: Tensor = rearrange(y, "... h d -> ... (h d)") * weight
        return result

    norm.forward = per_head
    _fails(audit_module(module, "olmo2", checks=["reference"], **QUICK), "reference")


@pytest.mark.parametrize(("factory", "spec", "norm"), [(qwen3, "qwen3", "k_norm"), (phi, "phi", "q_layernorm"),
                                                    (olmo2, "olmo2", "k_norm")])
def test_a_module_that_skips_its_q_or_k_norm_fails_reference(factory: Callable[[], nn.Module], spec: str,
                                                              norm: str) -> None:
    module = factory()
    getattr(module, norm).forward = lambda x: x
    _fails(audit_module(module, spec, **QUICK), "reference")


# ----------------------------------------------------------------------------------------------------
# Sliding window
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "spec"), [(mistral, "mistral"), (qwen2, "qwen2")])
def test_a_cache_that_forgets_the_window_fails_incremental_decoding(
        factory: Callable[[], nn.Module], spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = factory()
    transformers = _transformers()
    cache = transformers.DynamicCache
    monkeypatch.setattr(transformers, "DynamicCache", lambda config: cache())  # keeps every key
    report = audit_module(module, spec, **QUICK)
    _fails(report, "incremental_decoding")
    assert report.status("reference") == "PASS"


def test_the_reference_applies_the_window() -> None:
    from typed_transformer.audit import ModuleAdapter

    module = mistral()
    windowed = ModuleAdapter(module, SPECS["mistral"])
    whole = ModuleAdapter(module, dataclasses.replace(SPECS["mistral"], window=None))
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    ins = (x, x, x)
    out = windowed.call(ins, None, True, torch.float64)
    # the module's rotary table is float32
    torch.testing.assert_close(out, windowed.reference(ins, None, True, torch.float64), rtol=0.0, atol=1e-5)
    # the first 3 queries see at most 3 keys either way; the later ones differ without the window
    torch.testing.assert_close(out[:, :3], whole.reference(ins, None, True, torch.float64)[:, :3], rtol=0.0,
                               atol=1e-5)
    assert (out[:, 3:] - whole.reference(ins, None, True, torch.float64)[:, 3:]).abs().max() > 1e-3


# ----------------------------------------------------------------------------------------------------
# nn.MultiheadAttention with add_bias_kv and add_zero_attn
# ----------------------------------------------------------------------------------------------------


def test_torch_mha_that_forgets_bias_kv_fails_reference() -> None:
    module = torch_mha_bias_kv()

    class Forgetful(nn.MultiheadAttention):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            bias_k, bias_v = self.bias_k, self.bias_v
            self.bias_k = self.bias_v = None
            try:
                return super().forward(*args, **kwargs)
            finally:
                self.bias_k, self.bias_v = bias_k, bias_v

    module.__class__ = Forgetful
    _fails(audit_module(module, "torch_mha", **QUICK), "reference")


# ----------------------------------------------------------------------------------------------------
# Fused qkv laid out per head
# ----------------------------------------------------------------------------------------------------


def test_a_per_head_fused_qkv_read_as_blocks_gets_a_layout_hint() -> None:
    blocks = dataclasses.replace(SPECS["gpt_neox"], qkv_layout="blocks")
    report = audit_module(gpt_neox(), blocks, **QUICK)
    _fails(report, "reference")
    assert "declare qkv_layout='heads'" in report["reference"].message, report.table()


def test_a_blocks_fused_qkv_read_per_head_gets_the_hint_the_other_way() -> None:
    class Fused(nn.Module):  # [q; k; v] blocks, as our MultiHeadAttention's in_proj
        def __init__(self) -> None:
            super().__init__()
            self.attn = MultiHeadAttention(8, 2)

        def forward(self, x: Tensor, keep: Tensor | None, is_causal: bool) -> Tensor:
            out: Tensor = self.attn(x, attn_mask=keep, is_causal=is_causal)[0]
            return out

    per_head = dataclasses.replace(ALIBI, name="fused", position_bias=None, qkv_layout="heads")
    report = audit_module(randomize_parameters(Fused(), 0), per_head, **QUICK)
    assert "declare qkv_layout='blocks'" in report["reference"].message, report.table()


class GroupFused(nn.Module):
    """Grouped-query attention whose fused projection is laid out per key/value group: Falcon's
    ``(g [q_1 .. q_r k v] d)``, or with ``kv_first`` ``(g [k v q_1 .. q_r] d)``, a layout no field describes."""

    def __init__(self, kv_first: bool = False) -> None:
        super().__init__()
        self.h, self.g, self.d, self.kv_first = 4, 2, 4, kv_first
        self.qkv = nn.Linear(16, (self.h + 2 * self.g) * self.d)
        self.out = nn.Linear(self.h * self.d, 16)

    def forward(self, x: Tensor, keep: Tensor | None, is_causal: bool) -> Tensor:
        from einops import rearrange

        r = self.h // self.g
        y = rearrange(self.qkv(x), "b t (g n d) -> b g n t d", g=self.g, d=self.d)
        q, k, v = (y[:, :, 2:], y[:, :, 0], y[:, :, 1]) if self.kv_first else (y[:, :, :r], y[:, :, r], y[:, :, r + 1])
        q = rearrange(q, "b g r t d -> b (g r) t d")
        k, v = (z.repeat_interleave(r, dim=1) for z in (k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=is_causal)
        result: Tensor = self.out(rearrange(out, "b h t d -> b t (h d)"))
        return result


GROUP_FUSED = ModuleSpec("group_fused", _alibi_forward, Conventions(self_attention=True), qkv="qkv", q=None, k=None,
                         v=None, out="out", num_heads="h", num_kv_heads="g", head_dim="d")


def test_a_per_group_fused_qkv_is_audited_and_read_as_blocks_gets_the_hint() -> None:
    module = randomize_parameters(GroupFused(), 0)
    report = audit_module(module, dataclasses.replace(GROUP_FUSED, qkv_layout="groups"), **QUICK)
    assert report.passed, report.table()
    report = audit_module(module, GROUP_FUSED, checks=["reference"], **QUICK)
    _fails(report, "reference")
    assert report["reference"].message.endswith(
        "; hint: the module matches the reference with its fused 'qkv' weights split per key/value group, "
        "(g [q_1 .. q_r k v] d): declare qkv_layout='groups' in the spec"), report.table()


def test_falcon_whose_group_split_swaps_key_and_value_fails_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    modeling = pytest.importorskip("transformers.models.falcon.modeling_falcon")
    if hasattr(modeling.FalconAttention, "_split_heads"):  # transformers up to 5.24: the split is a method
        split = modeling.FalconAttention._split_heads

        def swapped(self: Any, fused: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            q, k, v = split(self, fused)
            return q, v, k

        monkeypatch.setattr(modeling.FalconAttention, "_split_heads", swapped)
    else:  # from 5.25 the split is inline in forward: swap its key and value where they reach the kernel
        kernel = modeling.eager_attention_forward

        def swapped_kernel(module: Any, q: Tensor, k: Tensor, v: Tensor, *args: Any, **kwargs: Any) -> Any:
            return kernel(module, q, v, k, *args, **kwargs)

        monkeypatch.setattr(modeling, "eager_attention_forward", swapped_kernel)
    _fails(audit_module(falcon(), "falcon", checks=["reference"], **QUICK), "reference")


def test_a_fused_qkv_in_a_layout_no_field_describes_is_suspected() -> None:
    report = audit_module(randomize_parameters(GroupFused(kv_first=True), 0), GROUP_FUSED,
                          checks=["reference", "causality"], **QUICK)
    _fails(report, "reference")
    assert report["reference"].message.endswith("; hint: the weights may be split in another layout (per-head qkv?)")
    assert "hint: the weights may be split" in report.table()  # in its root cause's block


def test_a_correct_spec_gets_no_layout_hint_for_a_real_bug() -> None:
    module: Any = gpt_neox()
    module.dense.forward = lambda x: torch.nn.functional.linear(x, module.dense.weight)  # drops the output bias
    report = audit_module(module, "gpt_neox", **QUICK)
    _fails(report, "reference")
    assert "hint" not in report["reference"].message


def test_a_class_of_the_same_shape_is_refused_with_the_one_line_that_reuses_the_spec() -> None:
    from typed_transformer.audit import AuditUsageError

    module = mistral()  # Llama-shaped: the llama spec describes it once its class check is lifted
    with pytest.raises(AuditUsageError, match=r"dataclasses\.replace\(SPECS\['llama'\], module_type=''\)"):
        audit_module(module, "llama", **QUICK)
    llama_shaped = dataclasses.replace(SPECS["llama"], module_type="")
    # the module itself never windows (its model builds the window into the mask): as Llama, it passes
    report = audit_module(module, llama_shaped, checks=["reference", "masking", "incremental_decoding"], **QUICK)
    assert report.status("reference") == "PASS", report.table()
