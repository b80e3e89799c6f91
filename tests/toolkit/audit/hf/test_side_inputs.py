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
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.facts import _XL_LENGTH, _layout_bias, _layout_inputs
from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.audit.modules.weights import spec_weights
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


#: planted bugs in a side input, each a change to one keyword argument of the call (a forward pre-hook): Bros
#: ignoring its pair embedding or reading R[j, i] for R[i, j]; LiLT's layout inputs the same for every token (its
#: layout logits then the same for every key, which the softmax cancels); MobileBERT's block adding zeros for its
#: residual layer_input before its Add & Norm
_SIDE_INPUT_BUGS = [
    ("bros", "BrosSelfAttention", "bbox_pos_emb", torch.zeros_like),
    ("bros", "BrosSelfAttention", "bbox_pos_emb", lambda r: r.transpose(0, 1).contiguous()),
    ("lilt", "LiltSelfAttention", "layout_inputs", torch.zeros_like),
    ("mobilebert", "MobileBertAttention", "layer_input", torch.zeros_like),
]


@pytest.mark.parametrize(("model", "name", "argument", "change"), _SIDE_INPUT_BUGS,
                         ids=["bros-ignored", "bros-transposed", "lilt-flat", "mobilebert-no-residual"])
def test_a_side_input_bug_fails_the_reference(model: str, name: str, argument: str, change: Any) -> None:
    """The audit against the spec read from the sound class, once the hook plants the bug."""
    module = randomize_parameters(hf_build(_class(model, name)), 0)
    spec = hf_spec(module)

    def planted(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, argument: change(kwargs[argument])}

    module.register_forward_pre_hook(planted, with_kwargs=True)
    assert audit_module(module, spec, conventions="infer", **QUICK).status("reference") == "FAIL"


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
