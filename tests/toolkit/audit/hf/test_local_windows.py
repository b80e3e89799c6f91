"""A two-sided local window (``ModuleSpec.radius``) and the classes it audits with zero lines of spec: LongT5's local
attention (its blocks of ``local_radius + 1`` tokens against a 3-block frame reduce to ``|i - j| <= radius``, checked
against the model's own mask builder; its fully masked rows a named cause) and Longformer's sliding chunks (Longformer,
LED's encoder); a radius off by one, in the class or in the reference, fails ``reference``."""

import dataclasses
import importlib
from typing import Any

import pytest
import torch

from typed_transformer.audit import audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.facts import _local_frames
from typed_transformer.audit.hf.known import hf_causes
from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.audit.modules.masking import local_mask
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _longt5() -> Any:
    return importlib.import_module("transformers.models.longt5.modeling_longt5")


def test_local_mask_is_two_sided_and_aligned_bottom_right() -> None:
    keep = local_mask(4, 4, 1)
    assert keep.tolist() == [[True, True, False, False], [True, True, True, False],
                             [False, True, True, True], [False, False, True, True]]
    # two queries on six keys: the last two positions (4 and 5)
    assert local_mask(2, 6, 1).tolist() == [[False, False, False, True, True, True],
                                            [False, False, False, False, True, True]]
    assert local_mask(3, 3, 0).equal(torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("t", [1, 2, 3, 5, 7, 9])
def test_longt5_blocks_reduce_to_the_local_window(t: int) -> None:
    """The model's own block mask (``_get_local_attention_mask`` of a key padding mask), laid back on the ``t x t``
    grid, is ``|i - j| <= local_radius`` and the padding; the audit's gather into the block form gives the same
    blocks."""
    modeling = _longt5()
    module: Any = hf_build(modeling.LongT5LocalAttention)
    block: int = module.block_len
    assert module.local_radius == 2
    assert block == 3
    padding = torch.rand(2, t, generator=torch.Generator().manual_seed(t)) > 0.3
    frames = modeling._get_local_attention_mask(padding, block, "cpu")[:, 0]  # (b, blocks, block, 3 block)
    dense = torch.zeros(2, t, t, dtype=torch.bool)
    for i in range(t):
        n, q = divmod(i, block)
        for j in range(t):
            k = j - (n - 1) * block
            if 0 <= k < 3 * block:
                dense[:, i, j] = frames[:, n, q, k]
    pair = padding[:, :, None] & padding[:, None, :]
    assert dense.equal(pair & local_mask(t, t, module.local_radius))
    ours = _local_frames(module, pair[:, None], torch.float32)
    assert ours[:, 0].equal(frames.float())


@pytest.mark.parametrize("name", ["LongT5LocalAttention", "LongT5LayerLocalSelfAttention"])
def test_longt5_local_attention_matches_and_its_fully_masked_rows_are_named(name: str) -> None:
    module = randomize_parameters(hf_build(getattr(_longt5(), name)), 0)
    spec = hf_spec(module)
    assert spec.radius is not None
    assert spec.position_bias is not None
    report = audit_module(module, spec, conventions="infer", **QUICK)
    for check in ("reference", "causality", "batch_independence", "masking", "large_logits"):
        assert report.status(check) == "PASS", report.table()
    # a fully masked row weighs its whole 3-block frame (-1e10 added): a true behaviour, its cause named
    assert report.status("fully_masked") == "FAIL"
    assert any("LongT5's local attention adds -1e10" in cause for cause in hf_causes(module))
    assert hf_limits(module) == []
    assert any("local_radius 2" in note for note in hf_notes(module))
    assert not any("forward adds position_bias" in note for note in hf_notes(module))


def test_longt5_local_attention_passes_where_every_row_has_a_key() -> None:
    """With fully masked rows left unchecked, every check passes."""
    module = randomize_parameters(hf_build(_longt5().LongT5LocalAttention), 0)
    spec = hf_spec(module)
    conventions = dataclasses.replace(spec.conventions, fully_masked="any", scale=1.0)
    report = audit_module(module, spec, conventions=conventions, **QUICK)
    assert report.passed, report.table()


def test_a_longt5_with_its_radius_off_by_one_fails() -> None:
    """Blocks of 4 on a radius of 2 (the class sees keys 3 away) fail ``reference``."""
    module: Any = randomize_parameters(hf_build(_longt5().LongT5LocalAttention), 0)
    spec = hf_spec(module)
    assert audit_module(module, spec, **QUICK).status("reference") == "PASS"
    module.block_len = module.local_radius + 2
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


def test_a_longt5_whose_locality_keeps_one_key_too_many_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    modeling = _longt5()
    module: Any = randomize_parameters(hf_build(modeling.LongT5LocalAttention), 0)
    spec = hf_spec(module)

    def loose(mask: torch.Tensor, block: int) -> torch.Tensor:
        relative = modeling._make_3block_relative_position_ids(block)
        return torch.logical_and(mask, (relative.abs() <= block)[None, None])

    monkeypatch.setattr(modeling, "_mask_local_attention_mask", loose)
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name"), [
    ("longformer", "LongformerSelfAttention"),
    ("longformer", "LongformerAttention"),  # + LongformerSelfOutput (dense, its Add & Norm bypassed)
    ("led", "LEDEncoderSelfAttention"),
    ("led", "LEDEncoderAttention"),  # + its output Linear
])
def test_longformer_sliding_chunks_pass_as_a_local_window(model: str, name: str) -> None:
    """Built with windows of 4 (radius 2) and padded to a multiple of the window as its model does: every check
    that runs without masks passes; the masks and the global attention it is not given are named in notes."""
    module = randomize_parameters(hf_build(getattr(importlib.import_module(
        f"transformers.models.{model}.modeling_{model}"), name)), 0)
    spec = hf_spec(module)
    assert spec.radius is not None
    assert not spec.conventions.supports_mask
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []
    assert any("is_global_attn=False" in note for note in hf_notes(module))


@pytest.mark.parametrize("radius", [1, 3])
def test_a_reference_whose_radius_is_off_by_one_fails_on_longformer(radius: int) -> None:
    """Longformer's window is exactly radius 2: a reference of radius 1 or 3 fails ``reference``."""
    module = randomize_parameters(hf_build(importlib.import_module(
        "transformers.models.longformer.modeling_longformer").LongformerSelfAttention), 0)
    spec = dataclasses.replace(hf_spec(module), radius=radius)
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"


@pytest.mark.parametrize(("model", "name", "note"), [
    ("prophetnet", "ProphetNetAttention", "key padding mask per head (b, h, 1, s)"),  # refuses (b, 1, t, s) masks
    ("reformer", "LocalSelfAttention", "sequences of one chunk (64 tokens) at most"),  # plain attention up to a chunk
    ("reformer", "ReformerAttention", "sequences of one chunk (64 tokens) at most"),  # + its pre-norm, bypassed
])
def test_key_padding_only_classes_pass_without_masks(model: str, name: str, note: str) -> None:
    """Classes that take only a key padding mask of their own form are audited without masks, named in notes;
    Reformer's local attention on sequences no longer than one chunk (``max_length``)."""
    module = randomize_parameters(hf_build(getattr(importlib.import_module(
        f"transformers.models.{model}.modeling_{model}"), name)), 0)
    spec = hf_spec(module)
    assert not spec.conventions.supports_mask
    assert spec.decode is None
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []
    assert any(note in n for n in hf_notes(module))


def test_a_reformer_that_applies_a_causal_mask_of_its_own_fails() -> None:
    """A Reformer local attention switched to a decoder (its own causal mask, which the audit does not ask for)
    fails ``reference``: the audit without masks still sees what the class does to its keys."""
    modeling = importlib.import_module("transformers.models.reformer.modeling_reformer")
    module: Any = randomize_parameters(hf_build(modeling.LocalSelfAttention), 0)
    spec = hf_spec(module)
    module.is_decoder = True
    assert audit_module(module, spec, **QUICK).status("reference") == "FAIL"
