"""DETR decoders' attention with content and position projections (Conditional DETR's ``q_content_proj`` /
``q_pos_proj``, DAB-DETR's ``self_attn_query_content_proj`` / ...), audited with zero lines of spec and zero
positions: the four classes pass, the biases the reference adds are the class's own queries and keys, and planted bugs
(the wrong position projection on the queries, the positional half of the keys concatenated first) fail. DAB-DETR's
inner ``DabDetrAttention`` over keys and values already projected: identity projections, passing, and failing with
keys and values swapped. Perceiver resamplers (IDEFICS 2's, Evolla's compressor): keys and values over the memory
followed by the latents (``keys_with_input``), passing, and failing with the latents left out of the keys. Evolla's
gated aligner block: its gate folded into the output projection, passing, and failing without the gate's tanh."""

import dataclasses
import importlib
from typing import Any

import pytest
import torch
from einops import rearrange
from torch import Tensor

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.layout import content_zero_args
from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.audit.modules.weights import spec_weights
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _modeling(model: str) -> Any:
    return importlib.import_module(f"transformers.models.{model}.modeling_{model}")


def _class(model: str, name: str) -> type:
    return getattr(_modeling(model), name)  # type: ignore[no-any-return]


def _audit(module: Any, spec: Any = None) -> Any:
    return audit_module(module, hf_spec(module) if spec is None else spec, conventions="infer", **QUICK)


@pytest.mark.parametrize(("model", "name", "zeros", "concatenated"), [
    ("conditional_detr", "ConditionalDetrDecoderSelfAttention", {"query_position_embeddings": "both"}, False),
    ("conditional_detr", "ConditionalDetrDecoderCrossAttention",
     {"encoder_position_embeddings": "key", "query_sine_embed": "query"}, True),
    ("dab_detr", "DabDetrDecoderLayerSelfAttention", {"query_position_embeddings": "both"}, False),
    ("dab_detr", "DabDetrDecoderLayerCrossAttention",
     {"object_queries": "key", "query_position_embeddings": "query", "query_sine_embed": "query"}, True),
])
def test_detr_decoder_content_and_position_projections_pass(model: str, name: str, zeros: dict[str, str],
                                                           concatenated: bool) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    assert content_zero_args(type(module)) == zeros
    report = _audit(module)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []
    notes = hf_notes(module)
    assert any("audited with zero" in n and "positions add is not tested" in n for n in notes)
    assert any("positional half concatenated" in n for n in notes) == concatenated


@pytest.mark.parametrize("name", ["ConditionalDetrDecoderSelfAttention", "ConditionalDetrDecoderCrossAttention"])
def test_conditional_detr_s_head_count_is_the_module_s_own(name: str) -> None:
    """Its decoder layer builds the class with ``decoder_attention_heads``, not the config's
    ``num_attention_heads`` (the encoder's): the heads are read from the module's head size, so 2 heads pass."""
    cls = _class("conditional_detr", name)
    built: Any = hf_build(cls)
    module = randomize_parameters(cls(built.config, 16, 2), 0)
    w = spec_weights(module, hf_spec(module))
    assert (w.h, w.d) == (2, 8)
    assert _audit(module).passed


def _captured(module: Any, modeling: Any, call: Any) -> dict[str, Tensor]:
    """The query and key heads the class passes to its attention function."""
    seen: dict[str, Tensor] = {}
    original = modeling.eager_attention_forward

    def capture(m: Any, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["q"], seen["k"] = query, key
        return original(m, query, key, value, *args, **kwargs)

    modeling.eager_attention_forward = capture
    try:
        call()
    finally:
        modeling.eager_attention_forward = original
    return seen


def test_the_reference_s_biases_are_the_class_s_own_queries_and_keys() -> None:
    """With zero positions, Conditional DETR's self-attention queries are ``q_content_proj(x) + q_pos_proj(0)``: the
    weights the reference reads (content weights, both biases) give the very heads the class computes."""
    modeling = _modeling("conditional_detr")
    module = randomize_parameters(hf_build(modeling.ConditionalDetrDecoderSelfAttention), 0).double().eval()
    w = spec_weights(module, hf_spec(module))
    x = torch.randn(2, 5, w.wq.shape[1], dtype=torch.float64)
    seen = _captured(module, modeling, lambda: module(x, query_position_embeddings=torch.zeros_like(x)))
    assert w.bq is not None
    assert w.bk is not None
    for side, weight, bias in (("q", w.wq, w.bq), ("k", w.wk, w.bk)):
        heads = rearrange(x @ weight.T + bias, "b t (h d) -> b h t d", h=w.h)
        torch.testing.assert_close(seen[side], heads)


def test_dab_detr_s_first_layer_adds_its_query_positions() -> None:
    """DAB-DETR's first decoder layer (``is_first=True``) adds the query and key position projections to the content
    ones: the reference adds their biases then (and only then), and the layer passes."""
    cls = _class("dab_detr", "DabDetrDecoderLayerCrossAttention")
    later: Any = randomize_parameters(hf_build(cls), 0)
    first: Any = randomize_parameters(cls(later.cross_attn.config, is_first=True), 0)
    for module, added in ((later, False), (first, True)):
        w = spec_weights(module, hf_spec(module))
        content: Tensor = module.cross_attn_query_content_proj.bias.double()
        expected = content + module.cross_attn_query_pos_proj.bias.double() if added else content
        assert w.bq is not None
        torch.testing.assert_close(w.bq, expected)
    report = _audit(first)
    assert report.passed, report.table()
    assert not any("is None in this layer" in n for n in hf_notes(first))


def test_a_query_given_the_key_s_position_projection_fails() -> None:
    """A Conditional DETR self-attention that adds ``k_pos_proj`` to its queries (with zero positions: the wrong bias
    on every query) fails the reference check."""
    base = _class("conditional_detr", "ConditionalDetrDecoderSelfAttention")

    class Swapped(base):  # type: ignore[misc, valid-type]
        def forward(self, hidden_states: Tensor, query_position_embeddings: Tensor, attention_mask: Any = None,
                    **kwargs: Any) -> Any:
            own = getattr(self, "q_pos_proj")  # noqa: B009 (typed Any: a class of an Any base)
            setattr(self, "q_pos_proj", getattr(self, "k_pos_proj"))  # noqa: B009, B010
            try:
                return super().forward(hidden_states, query_position_embeddings, attention_mask, **kwargs)
            finally:
                setattr(self, "q_pos_proj", own)  # noqa: B010

    module = randomize_parameters(hf_build(base), 0)
    spec = hf_spec(module)
    module.__class__ = Swapped
    assert _audit(module, spec).status("reference") == "FAIL"


def test_a_key_with_its_positional_half_first_fails() -> None:
    """A Conditional DETR cross-attention that concatenates each key head as ``[position, content]`` (the query's
    halves ``[content, sine]``) pairs the content of the queries with the keys' positions: the reference check
    fails."""
    modeling = _modeling("conditional_detr")
    base = modeling.ConditionalDetrDecoderCrossAttention
    module = randomize_parameters(hf_build(base), 0)
    spec = hf_spec(module)
    original = modeling.eager_attention_forward

    def flipped(m: Any, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Any:
        content, position = key.chunk(2, dim=-1)
        return original(m, query, torch.cat([position, content], dim=-1), value, *args, **kwargs)

    modeling.eager_attention_forward = flipped
    try:
        report = _audit(module, spec)
    finally:
        modeling.eager_attention_forward = original
    assert report.status("reference") == "FAIL"


@pytest.mark.parametrize("is_cross", [False, True])
def test_attention_over_projected_keys_and_values_passes(is_cross: bool) -> None:
    """DAB-DETR's ``DabDetrAttention`` takes queries, keys and values its decoder layer projected: audited with
    identity projections over separate inputs, in its self-attention form and its cross-attention one (query and key
    heads twice as wide as the value heads)."""
    cls = _class("dab_detr", "DabDetrAttention")
    built: Any = hf_build(cls)
    module = randomize_parameters(cls(built.config, is_cross=True) if is_cross else built, 0)
    w = spec_weights(module, hf_spec(module))
    assert (w.d, w.dv) == ((2 if is_cross else 1) * w.dv, w.dv)
    report = _audit(module)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []
    assert any("identity projections" in n for n in hf_notes(module))


def test_attention_over_projected_keys_that_reads_the_values_as_keys_fails() -> None:
    base = _class("dab_detr", "DabDetrAttention")

    class Swapped(base):  # type: ignore[misc, valid-type]
        def forward(self, hidden_states: Tensor, attention_mask: Any = None, key_states: Any = None,
                    value_states: Any = None, output_attentions: Any = None) -> Any:
            return super().forward(hidden_states, attention_mask, value_states, key_states, output_attentions)

    module = randomize_parameters(hf_build(base), 0)
    spec = hf_spec(module)
    module.__class__ = Swapped
    assert _audit(module, spec).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name", "masks"), [
    ("idefics2", "Idefics2PerceiverAttention", True),  # forward(latents, context, attention_mask (b, 1, t, s + t))
    ("evolla", "EvollaSequenceCompressorAttention", False),  # forward(x, latents, mask (b, s + t)), to_kv halved
])
def test_perceiver_resamplers_pass_with_the_latents_among_their_keys(model: str, name: str, masks: bool) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec.keys_with_input
    assert spec.memory
    report = _audit(module, spec)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert (report.status("masking") == "PASS") == masks
    assert hf_limits(module) == []
    assert any("key padding mask" in n for n in hf_notes(module)) == (not masks)
    # without the latents' keys the reference is another attention: the module fails it
    assert _audit(module, dataclasses.replace(spec, keys_with_input=False)).status("reference") == "FAIL"


def test_evolla_s_fused_keys_and_values_are_its_own_halves() -> None:
    """The reference's keys and values of Evolla's compressor are ``to_kv``'s halves, as the class's
    ``self.to_kv(kv_input).chunk(2, dim=-1)`` reads them."""
    module: Any = randomize_parameters(hf_build(_class("evolla", "EvollaSequenceCompressorAttention")), 0).double()
    w = spec_weights(module, hf_spec(module))
    z = torch.randn(2, 5, w.wk.shape[1], dtype=torch.float64)
    k, v = module.to_kv(z).chunk(2, dim=-1)
    torch.testing.assert_close(k, z @ w.wk.T)
    torch.testing.assert_close(v, z @ w.wv.T)


def test_a_perceiver_that_leaves_the_latents_out_of_its_keys_fails() -> None:
    """Evolla's compressor with keys and values from the memory alone (the latents only as queries): the reference
    (keys over ``[memory; latents]``) fails it."""
    base = _class("evolla", "EvollaSequenceCompressorAttention")

    class MemoryOnly(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Tensor, latents: Tensor, mask: Tensor) -> Tensor:
            x, latents = self.norm_media(x), self.norm_latents(latents)
            q = rearrange(self.to_q(latents), "b t (h d) -> b h t d", h=self.heads)
            k, v = (rearrange(z, "b s (h d) -> b h s d", h=self.heads) for z in self.to_kv(x).chunk(2, dim=-1))
            attention = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
            return self.to_out(rearrange(attention @ v, "b h t d -> b t (h d)"))  # type: ignore[no-any-return]

    module = randomize_parameters(hf_build(base), 0)
    spec = hf_spec(module)
    module.__class__ = MemoryOnly
    assert _audit(module, spec).status("reference") == "FAIL"


def test_evolla_s_gated_aligner_passes_with_its_gate_folded_into_the_output() -> None:
    """Evolla's aligner block, ``x + tanh(gate_attention) * cross_attention(x)`` then a gated feed-forward: audited
    with the feed-forward's gate zeroed, the residual subtracted and ``tanh(gate_attention)`` folded into the output
    projection, which is what the class's own ``cross_attention`` method times its gate gives."""
    module: Any = randomize_parameters(hf_build(_class("evolla", "EvollaSequenceAlignerCrossAttention")), 0)
    spec = hf_spec(module)
    report = _audit(module, spec)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []
    notes = hf_notes(module)
    assert any("gate_ffw zeroed" in n for n in notes)
    assert any("num_attention_heads**-0.5" in n for n in notes)
    # the folded gate against the class's own method (its norm bypassed, as the spec's call bypasses it)
    m = module.double().eval()
    x, memory = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    out = spec.forward(m, x, memory, memory, None, False)
    ones = torch.ones(2, 5, dtype=torch.float64)
    inner = m.cross_attention(x, memory, None, None, None, ones, None, None)
    torch.testing.assert_close(out, torch.tanh(m.gate_attention) * inner)


def test_an_aligner_that_drops_the_tanh_of_its_gate_fails() -> None:
    """An aligner that multiplies its attention by the raw ``gate_attention`` (1 here), not by its tanh: the
    reference (the output projection times ``tanh(1)``) fails it."""
    base = _class("evolla", "EvollaSequenceAlignerCrossAttention")

    class Ungated(base):  # type: ignore[misc, valid-type]
        def forward(self, query_states: Tensor, protein_kv_states: Tensor, structure_kv_states: Any,
                    msa_kv_states: Any, query_attn_mask: Any, protein_kv_attn_mask: Any = None, **kwargs: Any
                    ) -> Tensor:
            inner = self.cross_attention(query_states, protein_kv_states, None, None, query_attn_mask,
                                         protein_kv_attn_mask, None, None)
            hidden = query_states + getattr(self, "gate_attention") * inner  # noqa: B009 (an Any base's attribute)
            out: Tensor = hidden + self.ff(hidden) * torch.tanh(getattr(self, "gate_ffw"))  # noqa: B009
            return out

    module: Any = randomize_parameters(hf_build(base), 0)
    with torch.no_grad():
        module.gate_attention.fill_(1.0)
    spec = hf_spec(module)
    assert _audit(module, spec).status("reference") == "PASS"
    module.__class__ = Ungated
    assert _audit(module, spec).status("reference") == "FAIL"
