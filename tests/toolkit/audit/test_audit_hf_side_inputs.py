"""Hugging Face classes that took glue to audit with zero lines of spec: EsmFold2's atom and diffusion attention (a
sub-config constructor argument, heads implied by its reshape, a pair bias passed in the mask's place, a rotary class
built from coordinates), MobileBERT's (query_tensor, key_tensor, value_tensor) of one sequence and its block's
layer_input, Bros's relative embedding per query-key pair (``bbox_pos_emb``) and LiLT's layout stream (its logits added
to the text logits); each passing, a planted bug failing, and the reference pieces checked against the class's own
code."""

import importlib
import math
from typing import Any

import pytest
import torch
from torch import nn

from typed_transformer.audit import audit_module
from typed_transformer.audit._hf import (
    _XL_LENGTH,
    _layout_bias,
    _layout_inputs,
    hf_build,
    hf_limits,
    hf_notes,
    hf_spec,
)
from typed_transformer.audit._modules import spec_weights
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _class(model: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("model", "name", "note"), [
    ("esmfold2", "EsmFold2AtomAttention", "makes its cos/sin from coordinates"),
    ("esmfold2", "EsmFold2DiffusionAttention", "forward takes attention_bias"),
    ("mobilebert", "MobileBertSelfAttention", "views its keys and values with the queries' shape"),
    ("mobilebert", "MobileBertAttention", "as layer_input, its block's residual"),
    ("bros", "BrosSelfAttention", "bbox_pos_emb (t, t, b, d)"),
    ("bros", "BrosAttention", "bbox_pos_emb (t, t, b, d)"),
    ("lilt", "LiltSelfAttention", "LiLT's layout stream"),
    ("lilt", "LiltAttention", "LiLT's layout stream"),
])
def test_glued_classes_pass_with_zero_lines(model: str, name: str, note: str) -> None:
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)
    assert not spec.memory
    assert (spec_weights(module, spec).h, spec_weights(module, spec).g) == (4, 4)
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []
    assert any(note in line for line in hf_notes(module)), hf_notes(module)


def test_esmfold2_takes_its_sub_config_and_its_gate() -> None:
    """The sub-config of the annotated class (the model's ``structure_head.diffusion_module.atom_encoder``), at the
    tiny sizes; the gated output and the weightless q/k norms read."""
    module: Any = hf_build(_class("esmfold2", "EsmFold2AtomAttention"))
    assert module.q_proj.in_features == 16
    assert module.head_dim == 4
    spec = hf_spec(module)
    assert spec.gate is not None
    assert spec.q_norm == "q_norm"
    assert spec.rotary is not None
    assert spec.num_heads.endswith("atom_encoder.num_attention_heads")


def _audit_patched(module: nn.Module, spec: Any, hook: Any) -> Any:
    """The audit of ``module`` against the spec read from the sound class, once ``hook`` (a forward pre-hook with
    kwargs) plants a bug."""
    module.register_forward_pre_hook(hook, with_kwargs=True)
    return audit_module(module, spec, conventions="infer", **QUICK)


def test_a_bros_that_ignores_its_pair_embedding_fails() -> None:
    module = randomize_parameters(hf_build(_class("bros", "BrosSelfAttention")), 0)
    spec = hf_spec(module)

    def zeroed(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, "bbox_pos_emb": torch.zeros_like(kwargs["bbox_pos_emb"])}

    report = _audit_patched(module, spec, zeroed)
    assert report.status("reference") == "FAIL"


def test_a_bros_that_reads_its_pairs_transposed_fails() -> None:
    """R[j, i] for R[i, j]: the relative embedding of the other direction."""
    module = randomize_parameters(hf_build(_class("bros", "BrosSelfAttention")), 0)
    spec = hf_spec(module)

    def transposed(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, "bbox_pos_emb": kwargs["bbox_pos_emb"].transpose(0, 1).contiguous()}

    report = _audit_patched(module, spec, transposed)
    assert report.status("reference") == "FAIL"


def test_bros_pair_term_is_its_own_einsum() -> None:
    """The reference's term ``q_i . R[i, j]`` (RelativeKeys over the audit's table, ``rows(t, s)``) is what the
    class's own einsum computes from the ``(t, t, b, d)`` tensor the audit passes."""
    module: Any = hf_build(_class("bros", "BrosSelfAttention"))
    keys = hf_spec(module).relative_keys
    assert keys is not None
    assert keys.proj is None
    assert keys.query_bias is None
    t, b, d = 5, 2, int(module.attention_head_size)
    table = keys.table(module)
    passed = table.view(_XL_LENGTH, _XL_LENGTH, -1)[:t, :t][:, :, None].expand(-1, -1, b, -1).contiguous()
    q = torch.randn(b, 4, t, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    theirs = torch.einsum("bnid,bijd->bnij", (q, passed.view(t, t, b, d).permute([2, 0, 1, 3])))
    ours = torch.einsum("bhtd,tsd->bhts", q, table[keys.rows(t, t)])
    torch.testing.assert_close(ours, theirs)


def test_lilt_layout_bias_is_its_own_layout_scores() -> None:
    """The position bias the spec declares is the class's own layout logits (its transpose_for_scores of
    layout_query and layout_key over the same inputs, scaled by sqrt(d // r))."""
    module: Any = randomize_parameters(hf_build(_class("lilt", "LiltSelfAttention")), 0).double()
    t = 6
    inputs = _layout_inputs(module, "", t)[None]
    r = module.channel_shrink_ratio
    ql = module.transpose_for_scores(module.layout_query(inputs), r=r)
    kl = module.transpose_for_scores(module.layout_key(inputs), r=r)
    theirs = (ql @ kl.transpose(-1, -2) / math.sqrt(module.attention_head_size // r))[0]
    torch.testing.assert_close(_layout_bias("")(module, t, t), theirs)
    assert hf_spec(module).position_bias is not None


def test_a_lilt_without_its_layout_logits_fails() -> None:
    """Layout inputs the same for every token (zeros) make the layout logits the same for every key, which the
    softmax cancels: the class then computes the text logits alone, and the audit says so."""
    module = randomize_parameters(hf_build(_class("lilt", "LiltSelfAttention")), 0)
    spec = hf_spec(module)

    def flat(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, "layout_inputs": torch.zeros_like(kwargs["layout_inputs"])}

    report = _audit_patched(module, spec, flat)
    assert report.status("reference") == "FAIL"


def test_a_mobilebert_block_that_drops_its_residual_fails() -> None:
    """MobileBERT's block adds layer_input before its Add & Norm: one that adds zeros instead fails."""
    module = randomize_parameters(hf_build(_class("mobilebert", "MobileBertAttention")), 0)
    spec = hf_spec(module)

    def dropped(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, "layer_input": torch.zeros_like(kwargs["layer_input"])}

    report = _audit_patched(module, spec, dropped)
    assert report.status("reference") == "FAIL"


def test_mobilebert_builds_at_the_tiny_width() -> None:
    module: Any = hf_build(_class("mobilebert", "MobileBertSelfAttention"))
    assert module.query.in_features == module.value.in_features == 16


def test_funnel_is_built_and_refused_for_its_layout() -> None:
    """Funnel's relative attention is built (``block_index`` 0) and refused by name, not by its constructor."""
    from typed_transformer.audit import AuditUsageError

    module = hf_build(_class("funnel", "FunnelRelMultiheadAttention"))
    assert module.block_index == 0
    with pytest.raises(AuditUsageError, match="no query/key/value projections"):
        hf_spec(module)
