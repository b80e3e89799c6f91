"""Relative positions of speech models, audited with zero lines of spec: Shaw's relative values (VITS: the
reference's ``RelativeKeys.values`` against VITS's own helpers), block-local attention with relative keys (Granite
Speech's conformers: ``block_mask`` and the distances its encoder computes) and WavLM's gated relative bias
(``t5_buckets`` against WavLM's and T5's bucket functions); each class passing, and planted bugs in its relative terms
failing ``reference``."""

import importlib
from typing import Any

import pytest
import torch
from einops import einsum

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.notes import hf_limits
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _class(model: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)  # type: ignore[no-any-return]


def _vits() -> Any:
    return randomize_parameters(hf_build(_class("vits", "VitsAttention")), 0)


@pytest.mark.parametrize("length", [1, 3, 5, 6, 11])
def test_vits_rows_and_tables_are_its_own_relative_terms(length: int) -> None:
    """The reference's keys ``q . K[row(i, j)]`` and values ``sum_j p_ij V[row(i, j)]`` against VITS's own
    ``_get_relative_embeddings`` and its relative/absolute shifts (window 4: lengths within it and past it)."""
    module, generator = _vits(), torch.Generator().manual_seed(length)
    spec = hf_spec(module)
    rk = spec.relative_keys
    assert rk is not None
    assert rk.values is not None
    rows = rk.rows(length, length)
    q = torch.randn(3, length, module.head_dim, generator=generator)
    p = torch.softmax(torch.randn(3, length, length, generator=generator), dim=-1)
    with torch.no_grad():
        keys = module._relative_position_to_absolute_position(
            q @ module._get_relative_embeddings(module.emb_rel_k, length).transpose(-2, -1))
        values = module._absolute_position_to_relative_position(p) @ module._get_relative_embeddings(
            module.emb_rel_v, length)
        ours_keys = einsum(q, rk.table(module)[rows], "b t d, t s d -> b t s")
        ours_values = einsum(p, rk.values(module)[rows], "b t s, t s d -> b t d")
    torch.testing.assert_close(ours_keys, keys, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours_values, values, rtol=0, atol=1e-6)


def test_vits_passes_with_zero_lines() -> None:
    module = _vits()
    spec = hf_spec(module)
    assert hf_limits(module) == []
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"


def test_vits_with_its_relative_values_dropped_fails() -> None:
    """A VITS whose relative values add nothing (its absolute-to-relative shift zeroed) fails ``reference``."""
    module = _vits()
    module._absolute_position_to_relative_position = lambda x: torch.zeros(
        x.shape[0], x.shape[1], 2 * x.shape[1] - 1, dtype=x.dtype)
    assert audit_module(module, hf_spec(module), conventions="infer", **QUICK).status("reference") == "FAIL"


def test_vits_clipping_distances_past_its_window_fails() -> None:
    """A VITS that clips distances past its window to the last embedding (Shaw's clipping, where VITS pads with
    zeros) fails ``reference``."""
    module = _vits()

    def clipped(table: torch.Tensor, length: int) -> torch.Tensor:
        index = (torch.arange(2 * length - 1) - (length - 1)).clamp(-module.window_size, module.window_size)
        return table[:, index + module.window_size]

    module._get_relative_embeddings = clipped
    assert audit_module(module, hf_spec(module), conventions="infer", **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name"), [
    ("granite_speech", "GraniteSpeechConformerAttention"),  # to_q, a fused [k; v] to_kv, a pre-norm, no mask
    ("granite_speech_plus", "GraniteSpeechPlusConformerAttention"),
    ("granite_speech5", "GraniteSpeech5EncoderAttention"),  # q/k/v/o_proj, distances passed as position_embeddings
])
def test_granite_speech_block_attention_passes_with_zero_lines(model: str, name: str) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert spec.blocks is not None
    assert spec.relative_keys is not None
    assert module.context_size == 3
    assert hf_limits(module) == []
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"


def test_granite_speech_distances_are_its_encoder_s() -> None:
    """The distances the audit passes (and the reference's rows within a block) are Granite Speech 5's encoder's own
    ``compute_attention_dists``."""
    from types import SimpleNamespace

    from typed_transformer.audit.hf.facts import _block_distances

    module = hf_build(_class("granite_speech5", "GraniteSpeech5EncoderAttention"))
    encoder = _class("granite_speech5", "GraniteSpeech5Encoder")
    own = encoder.compute_attention_dists(SimpleNamespace(config=module.config))  # type: ignore[attr-defined]
    torch.testing.assert_close(_block_distances(module), own, rtol=0, atol=0)
    spec = hf_spec(module)
    assert spec.relative_keys is not None
    torch.testing.assert_close(spec.relative_keys.rows(3, 3), own, rtol=0, atol=0)


def test_block_mask_is_one_block_per_size_tokens() -> None:
    from typed_transformer.audit.modules.masking import block_mask

    expected = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]])
    assert torch.equal(block_mask(5, 5, 2), expected.bool())


def test_granite_speech_with_wrong_blocks_or_reversed_distances_fails() -> None:
    """A Granite Speech 5 cutting blocks of 6 where it was built with 3, and one reading its Shaw table at j - i
    for i - j: each fails ``reference``."""
    import dataclasses

    module: Any = randomize_parameters(hf_build(_class("granite_speech5", "GraniteSpeech5EncoderAttention")), 0)
    spec = dataclasses.replace(hf_spec(module), blocks=3)
    module.context_size = 6
    assert audit_module(module, spec, conventions="infer", **QUICK).status("reference") == "FAIL"
    module = randomize_parameters(hf_build(_class("granite_speech", "GraniteSpeechConformerAttention")), 0)
    table = module.rel_pos_emb

    class Reversed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = table
            self.weight = table.weight  # the table the spec reads

        def forward(self, distances: torch.Tensor) -> torch.Tensor:
            return self.inner(distances.T)  # type: ignore[no-any-return]

    spec = hf_spec(module)
    module.rel_pos_emb = Reversed()
    assert audit_module(module, spec, conventions="infer", **QUICK).status("reference") == "FAIL"


def test_t5_buckets_are_wavlm_s_and_t5_s() -> None:
    """The reference's bidirectional buckets against WavLM's own ``_relative_positions_bucket`` and T5's
    ``_relative_position_bucket`` (exact, log-spaced and capped distances)."""
    from typed_transformer.audit.modules.positions import t5_buckets

    distance = torch.arange(-1000, 1001)[None, :]
    wavlm: Any = hf_build(_class("wavlm", "WavLMAttention"))
    assert torch.equal(t5_buckets(distance, wavlm.num_buckets, wavlm.max_distance),
                       wavlm._relative_positions_bucket(distance))
    t5 = _class("t5", "T5Attention")
    for buckets, largest in ((32, 128), (8, 20), (320, 800)):
        assert torch.equal(t5_buckets(distance, buckets, largest), t5._relative_position_bucket(  # type: ignore[attr-defined]
            distance, bidirectional=True, num_buckets=buckets, max_distance=largest))


def test_wavlm_passes_with_zero_lines() -> None:
    module = randomize_parameters(hf_build(_class("wavlm", "WavLMAttention")), 0)
    spec = hf_spec(module)
    assert spec.position_bias is not None
    assert spec.position_gate is not None
    assert hf_limits(module) == []
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert report.status("gradients") == "PASS"  # through the gate too: it is a function of the input


def test_wavlm_with_its_gate_halves_swapped_or_distances_reversed_fails() -> None:
    """A WavLM whose gate reads the two halves of ``gru_rel_pos_linear`` the other way round, and one whose bias is
    read at ``i - j`` for ``j - i``: each fails ``reference``."""
    module: Any = randomize_parameters(hf_build(_class("wavlm", "WavLMAttention")), 0)
    spec = hf_spec(module)
    linear = module.gru_rel_pos_linear

    class Swapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = linear
            self.weight, self.bias = linear.weight, linear.bias  # what the spec reads

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)[..., [4, 5, 6, 7, 0, 1, 2, 3]]  # type: ignore[no-any-return]

    module.gru_rel_pos_linear = Swapped()
    assert audit_module(module, spec, conventions="infer", **QUICK).status("reference") == "FAIL"
    module = randomize_parameters(hf_build(_class("wavlm", "WavLMAttention")), 0)
    own = module.compute_bias
    module.compute_bias = lambda t, s: own(t, s).transpose(1, 2)
    assert audit_module(module, hf_spec(module), conventions="infer", **QUICK).status("reference") == "FAIL"
