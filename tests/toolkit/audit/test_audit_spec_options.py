"""A shipped spec models every option of its class or refuses, by name and before any check, the ones it does not:
x-transformers' ``Attention`` with ``qk_norm`` and ``gate_value_heads`` audited by the shipped spec (false alarms
before), and options it does not model refused."""

import dataclasses
from typing import Any

import pytest
import torch

from typed_transformer.audit import AuditUsageError, audit_module, library_spec
from typed_transformer.strategies import randomize_parameters

x_transformers = pytest.importorskip("x_transformers", reason="x-transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 4, "dtypes": (torch.float32,), "seed": 0}
#: x-transformers applies its causal mask over a given mask differently (a true finding of the spec's audit)
KNOWN = {"mask_and_causal"}


def _attention(**options: Any) -> Any:
    return randomize_parameters(x_transformers.Attention(dim=16, dim_head=8, heads=4, kv_heads=2, **options), 0)


@pytest.mark.parametrize("options", [{"qk_norm": True}, {"qk_norm": True, "qk_norm_groups": 2},
                                     {"qk_norm": True, "qk_norm_dim_scale": True}, {"gate_value_heads": True},
                                     {"head_scale": True}, {"add_zero_kv": True},
                                     {"qk_norm": True, "gate_value_heads": True, "head_scale": True}])
def test_x_transformers_options_the_spec_models_pass(options: dict[str, Any]) -> None:
    report = audit_module(_attention(**options), "x_transformers", **QUICK)
    failed = {r.name for r in report.results if r.status == "FAIL"}
    assert failed <= KNOWN, report.table()
    assert report.status("reference") == "PASS"


def test_a_flipped_value_gate_fails_reference() -> None:
    gated: Any = _attention(gate_value_heads=True)
    gated.to_v_head_gate.register_forward_hook(lambda _m, _a, out: -out)  # sigmoid(-z): one minus the gate
    assert audit_module(gated, "x_transformers", checks=["reference"], **QUICK).status("reference") == "FAIL"


def test_a_causal_module_passes_but_on_the_rows_its_mask_and_causal_mask_empty_together() -> None:
    """``Attention(causal=True)``: always causal, called with its own flag (a call with causal=False switched its mask
    off: every check failed, a false alarm). Every mask now meets its causal mask, so the rows the two empty together
    (KNOWN's finding) fail the mask checks; declared ``fully_masked="any"``, every check passes."""
    causal = _attention(causal=True)
    report = audit_module(causal, "x_transformers", **QUICK)
    assert report.status("reference") == "PASS"
    assert report.status("causality") == "PASS"
    assert {r.name for r in report.results if r.status == "FAIL"} <= {"masking", "padding", "fully_masked",
                                                                       "mask_and_causal"}
    spec = library_spec(causal, "x_transformers")
    spec = dataclasses.replace(spec, conventions=dataclasses.replace(spec.conventions, fully_masked="any"))
    assert audit_module(causal, spec, **QUICK).passed


def test_a_causal_module_that_forgets_its_mask_fails_reference() -> None:
    """``causal=True`` is read as always causal (every reference causal, the module called with its own flag: a
    call with causal=False would switch the mask off, which was a false alarm on every check); the same weights
    built without ``causal`` audited as the causal module's fail."""
    spec = library_spec(_attention(causal=True), "x_transformers")
    assert spec.conventions.always_causal
    report = audit_module(_attention(), spec, checks=["reference"], **QUICK)
    assert report.status("reference") == "FAIL"


@pytest.mark.parametrize(("options", "named"), [
    ({"sparse_topk": 2}, "sparse_topk=2"), ({"pre_talking_heads": True}, "pre_talking_heads"),
    ({"num_mem_kv": 2}, "num_mem_kv"), ({"softclamp_logits": True}, "softclamp_logits=True"),
    ({"output_gate": True}, "output_gate"),
    ({"max_attend_past": 3}, "max_attend_past=3"), ({"sigmoid": True}, "sigmoid"),
])
def test_options_the_spec_does_not_model_are_refused_by_name(options: dict[str, Any], named: str) -> None:
    with pytest.raises(AuditUsageError, match=rf"spec 'x_transformers' does not model Attention's option .*{named}"):
        audit_module(_attention(**options), "x_transformers", **QUICK)
