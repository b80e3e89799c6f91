"""Auditing real attention modules with their own weights through the shipped specs (issue 10): each passes,
each with a bug planted in its own code fails the right check, and the caller's module is left untouched.

Third-party modules are skipped (with the reason) when their library is not installed; CI installs the
``audit-test`` extra, so they run there."""

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from typed_transformer import MultiHeadAttention, RotaryEmbedding
from typed_transformer.audit import (
    MODULE_CHECKS,
    SPECS,
    AuditReport,
    AuditUsageError,
    ModuleSpec,
    Rotary,
    additive_mask,
    audit_module,
    audit_multihead,
)
from typed_transformer.strategies import randomize_parameters

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 5}


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    return GPT2Attention(transformers.GPT2Config(n_embd=8, n_head=2), layer_idx=0)  # type: ignore[no-untyped-call]


def _bert() -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    from transformers.models.bert.modeling_bert import BertSelfAttention

    return BertSelfAttention(transformers.BertConfig(hidden_size=8, num_attention_heads=2))  # type: ignore[no-untyped-call]


def _llama() -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    from transformers.models.llama.modeling_llama import LlamaAttention

    config = transformers.LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                                      attention_bias=True)
    return LlamaAttention(config, layer_idx=0)


def _torchtune() -> nn.Module:
    modules = pytest.importorskip("torchtune.modules", reason="torchtune is not installed (extra audit-test)")
    return SPECS["torchtune"].build(modules.MultiHeadAttention,  # type: ignore[misc]
                                    {"embed_dim": 8, "num_heads": 4, "num_kv_heads": 2, "bias": True})


def _x_transformers() -> nn.Module:
    x_transformers = pytest.importorskip("x_transformers", reason="x-transformers is not installed (extra audit-test)")
    module: nn.Module = x_transformers.Attention(dim=8, dim_head=4, heads=4, kv_heads=2)
    return module


def _torch_mha() -> nn.Module:
    return nn.MultiheadAttention(8, 2, kdim=6, vdim=5, batch_first=True)


def _ours() -> nn.Module:
    return MultiHeadAttention(8, 2, num_kv_heads=1, rotary=RotaryEmbedding(4))


#: spec name -> (factory, dtypes in which it passes)
MODULES: dict[str, tuple[Callable[[], nn.Module], tuple[torch.dtype, ...]]] = {
    "torch_mha": (_torch_mha, (torch.float32, torch.float64)),
    "typed_transformer": (_ours, (torch.float32, torch.float64)),
    "gpt2": (_gpt2, (torch.float32, torch.float64)),
    "bert": (_bert, (torch.float32, torch.float64)),
    # float64: see test_float32_inside_float64_modules_is_reported
    "llama": (_llama, (torch.float32,)),
    "torchtune": (_torchtune, (torch.float32, torch.float64)),
    "x_transformers": (_x_transformers, (torch.float32,)),
}


def _module(spec: str, seed: int = 0) -> nn.Module:
    return randomize_parameters(MODULES[spec][0](), seed)


#: checks a correct module fails because of a real behaviour (see test_real_behaviours_are_reported)
FINDINGS = {"x_transformers": ["mask_and_causal"]}


@pytest.mark.parametrize("spec", list(MODULES))
def test_shipped_spec_audits_its_real_module(spec: str) -> None:
    checks = [c for c in MODULE_CHECKS if c not in FINDINGS.get(spec, [])]
    report = audit_module(_module(spec), spec, dtypes=MODULES[spec][1], checks=checks, **QUICK)
    assert report.passed, report.table()
    assert list(dict.fromkeys(r.name for r in report.results)) == checks
    ran = {r.name for r in report.results if r.status == "PASS"}
    assert {"reference", "masking", "padding", "large_logits", "gradients", "batch_independence"} <= ran
    if spec in ("llama", "typed_transformer"):
        assert {"rope", "incremental_decoding"} <= ran
    assert report.untested[-1].startswith("head counts and sizes other than the module's (h=")


def test_real_behaviours_are_reported() -> None:
    """Real behaviours the audit finds in these libraries (pinned versions): Hugging Face's Llama rotary tables
    and x-transformers' softmax are computed in float32 for float64 inputs (errors ~1e-7 where float64 allows
    ~1e-12); x-transformers zeroes a row that its mask alone leaves empty, but not one that the mask and the
    causal flag empty together."""
    for spec in ("llama", "x_transformers"):
        report = audit_module(_module(spec), spec, dtypes=[torch.float64], checks=["reference"], **QUICK)
        assert report.failed == ["reference"], report.table()
        assert 1e-9 < float(report["reference"].message.split("max error ")[1].split()[0]) < 1e-4
    report = audit_module(_module("x_transformers"), "x_transformers", dtypes=[torch.float32],
                          checks=["fully_masked", "mask_and_causal"], **QUICK)
    assert report.failed == ["mask_and_causal"], report.table()
    example = report["mask_and_causal"].counterexample
    assert example is not None
    keep = torch.tensor(example["keep"]) & torch.ones(example["t"], example["s"], dtype=torch.bool).tril()
    assert not keep.any(dim=-1).all()  # a query row that mask and causal flag leave without keys


def _fails(report: AuditReport, *checks: str) -> None:
    assert set(checks) <= set(report.failed), report.table()
    assert report["dtype"].status == "PASS"


def test_torch_mha_that_ignores_attn_mask_fails_masking_and_causality() -> None:
    class IgnoresAttnMask(nn.MultiheadAttention):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            kwargs["attn_mask"] = None
            return super().forward(*args, **kwargs)

    report = audit_multihead(randomize_parameters(IgnoresAttnMask(8, 2, batch_first=True), 0), **QUICK)
    _fails(report, "masking", "causality", "mask_and_causal")
    assert report.status("padding") == "PASS"  # key padding still works


def test_torch_mha_that_detaches_value_fails_gradients() -> None:
    class DetachesValue(nn.MultiheadAttention):
        def forward(self, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Any:
            return super().forward(query, key, value.detach(), *args, **kwargs)

    report = audit_multihead(randomize_parameters(DetachesValue(8, 2, batch_first=True), 0), **QUICK)
    assert report.failed == ["gradients"], report.table()


def test_gpt2_with_a_mask_dropping_kernel_fails_masking(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module("gpt2")
    from transformers.models.gpt2 import modeling_gpt2

    original = modeling_gpt2.eager_attention_forward

    def drops_mask(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                   *args: Any, **kwargs: Any) -> Any:
        return original(module, query, key, value, None, *args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(modeling_gpt2, "eager_attention_forward", drops_mask)
    _fails(audit_module(module, "gpt2", **QUICK), "masking", "padding", "causality")


def test_bert_whose_value_projection_drops_its_bias_fails_reference() -> None:
    class NoBias(nn.Linear):
        def forward(self, x: Tensor) -> Tensor:
            return F.linear(x, self.weight)  # planted: the bias is never added

    module: Any = _module("bert")
    planted = NoBias(8, 8)
    planted.load_state_dict(module.value.state_dict())
    module.value = planted
    _fails(audit_module(module, "bert", **QUICK), "reference", "masking")


def _interleaved_rotate_half(x: Tensor) -> Tensor:
    """The wrong pairing for Llama's weights: (x[2i], x[2i+1]) instead of (x[i], x[i + d/2])."""
    pairs = rearrange(x, "... (i two) -> ... i two", two=2)
    return rearrange(torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1), "... i two -> ... (i two)")


def test_llama_with_the_wrong_rotary_pairing_fails_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module("llama")
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama, "rotate_half", _interleaved_rotate_half)
    report = audit_module(module, "llama", dtypes=[torch.float32], **QUICK)
    _fails(report, "rope", "reference")
    # a pairing that is no rotation at all (each half of a pair turns by another angle): named by what it breaks
    assert ("; the rotation itself: it makes the logits depend on absolute positions, which a rotary embedding never "
            "does (t=") in report["rope"].message
    assert ("the same tokens one position later, after a padded token, change the outputs by"
            in report["rope"].message)


def test_a_rope_failure_caused_by_the_scale_is_not_blamed_on_the_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module("llama")
    from transformers.models.llama import modeling_llama

    eager = modeling_llama.eager_attention_forward

    def unscaled(module: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scaling: float,
                 **kwargs: Any) -> Any:
        return eager(module, q, k, v, mask, 1.0, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", unscaled)
    report = audit_module(module, "llama", checks=["reference", "rope"], dtypes=[torch.float32], max_examples=5,
                          budget="quick")
    assert report.failed == ["reference", "rope"]
    assert report["rope"].message.endswith("; not the rotation: the logit scale is 1 (no 1/sqrt(d)) instead of 0.5, "
                                           "which the rope check depends on (reference fails the same way)")
    assert [cause.lines(1, 1)[0] for cause in report.causes] == [
        "root cause 1 of 1: the output differs from the reference with no mask and no causal flag; the module matches "
        "the reference when the logit scale is 1 (no 1/sqrt(d)) instead of 0.5"]


def test_a_softmax_over_the_query_axis_is_named_as_such_before_the_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before (issue 42): reported as "rope: the rotation itself ..." on a module whose rotation is right."""
    module = _module("llama")
    from transformers.models.llama import modeling_llama

    def wrong_axis(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                   scaling: float, dropout: float = 0.0, **kwargs: Any) -> Any:
        k = modeling_llama.repeat_kv(key, module.num_key_value_groups)
        v = modeling_llama.repeat_kv(value, module.num_key_value_groups)
        logits = query @ k.transpose(2, 3) * scaling
        if attention_mask is not None:
            logits = logits + attention_mask
        weights = logits.softmax(dim=-2, dtype=torch.float32).to(query.dtype)  # planted: over the queries
        return (weights @ v).transpose(1, 2).contiguous(), weights

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", wrong_axis)
    report = audit_module(module, "llama", checks=["reference", "rope"], dtypes=[torch.float32], max_examples=5,
                          budget="quick")
    assert report.failed == ["reference", "rope"]
    axis = "its softmax runs over the query axis (each key's column sums to 1) instead of the keys"
    assert [cause.lines(1, 1)[0] for cause in report.causes] == [
        f"root cause 1 of 1: the output differs from the reference with no mask and no causal flag; the module "
        f"matches the reference when {axis}"]
    assert report["rope"].message.endswith(f"; not the rotation: {axis}, which the rope check depends on "
                                           f"(reference fails the same way)")


def test_a_squared_scale_is_named_by_the_config_field_it_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 2's scale is query_pre_attn_scalar**-0.5, not 1/sqrt(d): a kernel that applies it twice is named so
    (before, issue 42: "1/sqrt(d) twice")."""
    pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    from transformers.models.gemma2 import modeling_gemma2

    from tests.toolkit.audit.hf.test_traits import _built
    from typed_transformer.audit.hf.recognise import hf_spec

    eager = modeling_gemma2.eager_attention_forward

    def squared(module: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float = 0.0,
                scaling: float | None = None, softcap: float | None = None, **kwargs: Any) -> Any:
        assert scaling is not None
        return eager(module, q, k, v, mask, dropout=dropout, scaling=scaling ** 2, softcap=softcap, **kwargs)

    monkeypatch.setattr(modeling_gemma2, "eager_attention_forward", squared)
    module = _built("gemma2.Gemma2Attention")
    assert module.config.query_pre_attn_scalar == 256  # the scale 1/16; d = 4 (1/sqrt(d) = 0.5)
    report = audit_module(module, hf_spec(module), checks=["reference"], dtypes=[torch.float32], max_examples=5,
                          budget="quick")
    assert report.causes[0].lines(1, 1)[0].endswith(
        "the module matches the reference when the logit scale is 0.003906 (config.query_pre_attn_scalar**-0.5 = "
        "256**-0.5 twice) instead of 0.0625 (config.query_pre_attn_scalar**-0.5 = 256**-0.5)")


def test_llama_in_float64_is_one_root_cause_counted_per_dtype() -> None:
    """Correct in float32; in float64 its float32 rotary tables and float32 softmax fail every check that compares
    outputs: one block, and the closing line counts per dtype."""
    report = audit_module(_module("llama"), "llama", checks=["reference", "causality", "masking", "dtype", "rope"],
                          max_examples=3, budget="quick")
    table = report.table()
    assert table.endswith("\nfloat32: 5 passed; float64: 1 passed, 4 failed; 1 root cause")
    [cause] = report.causes
    assert cause.explains() == "reference, causality, masking, rope [float64]"
    assert cause.lines(1, 1)[0] == (
        "root cause 1 of 1: the output differs from the reference with no mask and no causal flag; the module matches "
        "the reference when its cos/sin tables and its softmax are computed in float32 (float32 precision in a "
        "float64 run)")
    assert [line for line in table.splitlines() if "counterexample" in line] == [
        '  counterexample {"b": 1, "h": 4, "g": 2, "t": 2, "s": 2, "d": 4, "dv": 4, "seed": 0, "dtype": "float64", '
        '"keep": null, "is_causal": false, "amplitude": 1.0, "widths": [16, 16, 16], "tied": true}']
    assert sum(line.startswith("example = Example(") for line in table.splitlines()) == 1  # one repro
    assert report["rope"].message.endswith(
        "; not a wrong rotation: its cos/sin tables and its softmax are computed in float32 (float32 precision in a "
        "float64 run) (reference, causality, masking fail the same way)")
    assert report.to_dict()["causes"][0]["explains"] == [["reference", "float64"], ["causality", "float64"],
                                                         ["masking", "float64"], ["rope", "float64"]]


def test_llama_whose_cache_forgets_a_position_fails_incremental_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module("llama")
    from transformers import cache_utils

    original = cache_utils.DynamicLayer.update

    def forgetful(self: Any, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> Any:
        keys, values = original(self, key_states, value_states, *args, **kwargs)
        if keys.shape[-2] > 2:  # planted: the oldest position falls out once three are cached
            return keys[..., 1:, :], values[..., 1:, :]
        return keys, values

    monkeypatch.setattr(cache_utils.DynamicLayer, "update", forgetful)
    report = audit_module(module, "llama", dtypes=[torch.float32], **QUICK)
    assert report.failed == ["incremental_decoding"], report.table()


def test_ours_whose_cache_forgets_a_position_fails_incremental_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    from typed_transformer.multihead import KVCache

    original = KVCache.append

    def forgetful(self: KVCache, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        keys, values = original(self, k, v)
        return (keys[:, :, 1:], values[:, :, 1:]) if keys.shape[2] > 2 else (keys, values)

    monkeypatch.setattr(KVCache, "append", forgetful)
    report = audit_module(_module("typed_transformer"), "typed_transformer", **QUICK)
    assert report.failed == ["incremental_decoding"], report.table()
    assert "worst at position" in report["incremental_decoding"].message


def test_ours_with_interleaved_rotary_pairs_fails_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    def interleaved(self: RotaryEmbedding, x: Tensor, offset: int = 0) -> Tensor:
        positions = torch.arange(offset, offset + x.shape[2])
        cos, sin = self.angles(positions)
        cos = rearrange(cos[:, : self.head_dim // 2], "t i -> t i 1")
        sin = rearrange(sin[:, : self.head_dim // 2], "t i -> t i 1")
        pairs = rearrange(x, "b h t (i two) -> b h t i two", two=2)
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1)
        out = pairs * cos.to(x.dtype) + rotated * sin.to(x.dtype)
        return rearrange(out, "b h t i two -> b h t (i two)")

    monkeypatch.setattr(RotaryEmbedding, "forward", interleaved)
    report = audit_module(_module("typed_transformer"), "typed_transformer", **QUICK)
    _fails(report, "rope", "reference", "incremental_decoding")


def test_torchtune_whose_kernel_ignores_the_mask_fails_masking() -> None:
    module: Any = _module("torchtune")
    original = module._attention_call

    def ignores_mask(q: Tensor, k: Tensor, v: Tensor, *, mask: Any = None, **kwargs: Any) -> Tensor:
        kwargs["is_causal"] = False
        out: Tensor = original(q, k, v, mask=None, **kwargs)
        return out

    module._attention_call = ignores_mask
    _fails(audit_module(module, "torchtune", **QUICK), "masking", "padding", "causality")


def test_x_transformers_whose_attend_drops_the_mask_fails_masking() -> None:
    module: Any = _module("x_transformers")
    original = module.attend.forward

    def drops(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
        return original(q, k, v, None, *args, **kwargs)

    module.attend.forward = drops
    _fails(audit_module(module, "x_transformers", dtypes=[torch.float32], **QUICK), "masking", "padding")


# ----------------------------------------------------------------------------------------------------
# The fast path of nn.MultiheadAttention
# ----------------------------------------------------------------------------------------------------


def test_fast_path_nan_for_a_fully_padded_element_is_reported_when_zero_is_declared() -> None:
    module = randomize_parameters(nn.MultiheadAttention(8, 2), 0)  # sequence-first: the check goes batch-first
    report = audit_multihead(module, checks=["fast_path"], **QUICK)
    assert report.failed == ["fast_path"], report.table()
    assert "a fully padded batch element gave [nan" in report["fast_path"].message
    report = audit_multihead(module, checks=["fast_path"], fully_masked="nan", **QUICK)
    assert report.passed, report.table()
    assert {r.status for r in report.results} == {"PASS"}


def test_fast_path_is_skipped_when_torch_cannot_take_it() -> None:
    report = audit_multihead(nn.MultiheadAttention(6, 3, batch_first=True), checks=["fast_path"], **QUICK)
    assert report.status("fast_path") == "SKIP"  # an odd number of heads never takes the fast path


# ----------------------------------------------------------------------------------------------------
# Specs that do not match, deep copies, a spec of your own
# ----------------------------------------------------------------------------------------------------


def test_a_module_that_does_not_match_its_spec_names_what_is_missing() -> None:
    with pytest.raises(AuditUsageError, match=r"Linear does not match spec 'torch_mha': expected a torch\.nn\."):
        audit_multihead(nn.Linear(4, 4), budget="quick")
    with pytest.raises(AuditUsageError, match=r"does not match spec 'llama': expected a transformers\.models"):
        audit_module(nn.Linear(4, 4), "llama", budget="quick")
    spec = ModuleSpec("mine", lambda m, x, k, v, keep, causal: m(x), q="query", k="key", v="value", out=None,
                      num_heads="in_features")
    with pytest.raises(AuditUsageError, match=r"Linear does not match spec 'mine': it has no attribute 'query'"):
        audit_module(nn.Linear(4, 4), spec, budget="quick")
    with pytest.raises(KeyError, match="unknown spec 'nope'; shipped specs: torch_mha, typed_transformer"):
        audit_module(nn.Linear(4, 4), "nope", budget="quick")


def test_the_callers_module_is_left_exactly_as_it_was() -> None:
    module = randomize_parameters(nn.MultiheadAttention(8, 2, batch_first=True), 0).train()
    before = copy.deepcopy(module.state_dict())
    report = audit_multihead(module, checks=["reference", "gradients", "fast_path"], fully_masked="nan",
                             dtypes=[torch.float64, torch.float32], **QUICK)
    assert report.passed, report.table()
    assert module.training
    assert module.batch_first
    assert all(p.dtype == torch.float32 and p.grad is None for p in module.parameters())
    after = module.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


class FusedAttention(nn.Module):
    """A user's own module: fused qkv, no output projection, additive masks, self-attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = (rearrange(z, "b t (h d) -> b h t d", h=self.heads) for z in self.qkv(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return rearrange(out, "b h t d -> b t (h d)")


def test_a_spec_for_your_own_module_in_a_few_lines() -> None:
    from typed_transformer.audit import Conventions, with_causal

    def call(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
             is_causal: bool) -> Tensor:
        keep = with_causal(keep, is_causal, x.shape[1], x.shape[1])
        out: Tensor = m(x, mask=additive_mask(keep, x.dtype, fill=float("-inf")))
        return out

    spec = ModuleSpec("fused", call, Conventions(self_attention=True, fully_masked="any"), qkv="qkv", out=None,
                      num_heads="heads")
    report = audit_module(randomize_parameters(FusedAttention(8, 2), 0), spec, **QUICK)
    assert report.passed, report.table()


def test_torchtune_with_its_interleaved_rotary_embedding() -> None:
    """torchtune rotates pairs (x[2i], x[2i+1]): its spec declares so and passes; declaring Llama's half-split pairs
    instead fails ``rope``."""
    modules = pytest.importorskip("torchtune.modules", reason="torchtune is not installed (extra audit-test)")
    module = randomize_parameters(SPECS["torchtune"].build(  # type: ignore[misc]
        modules.MultiHeadAttention, {"embed_dim": 16, "num_heads": 4, "num_kv_heads": 2, "bias": True,
                                     "rotary_base": 500}), 0)
    report = audit_module(module, "torchtune", dtypes=[torch.float32], **QUICK)
    assert report.passed, report.table()
    assert report.status("rope") == "PASS"
    half = dataclasses.replace(SPECS["torchtune"], rotary=Rotary("pos_embeddings.base", "half", when="pos_embeddings"))
    report = audit_module(module, half, dtypes=[torch.float32], checks=["reference", "rope"], **QUICK)
    assert report.failed == ["reference", "rope"], report.table()


class TextbookCrossAttention(nn.Module):
    """Cross-attention with a textbook -inf fill and softmax: a query row without keys gives NaN."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x: Tensor, key: Tensor, value: Tensor, keep: Tensor | None = None) -> Tensor:
        q = rearrange(self.q_proj(x), "b t (h d) -> b h t d", h=self.heads)
        k = rearrange(self.k_proj(key), "b s (h d) -> b h s d", h=self.heads)
        v = rearrange(self.v_proj(value), "b s (h d) -> b h s d", h=self.heads)
        logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if keep is not None:
            logits = logits.masked_fill(~keep, float("-inf"))
        out: Tensor = rearrange(logits.softmax(dim=-1) @ v, "b h t d -> b t (h d)")
        return out


def test_module_declaring_nan_rows_does_not_fail_gradients_through_them() -> None:
    from typed_transformer.audit import Conventions, with_causal

    def call(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
             is_causal: bool) -> Tensor:
        assert key is not None
        assert value is not None
        out: Tensor = m(x, key, value, with_causal(keep, is_causal, x.shape[1], key.shape[1]))
        return out

    spec = ModuleSpec("textbook_cross", call, Conventions(fully_masked="nan"), out=None, num_heads="heads")
    module = randomize_parameters(TextbookCrossAttention(8, 2), 0)
    report = audit_module(module, spec, checks=["gradients", "causality"], max_examples=25, budget="quick")
    assert report.passed, report.table()
    assert any("gradients through fully masked rows" in note for note in report.untested)
