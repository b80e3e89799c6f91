"""The other libraries' attention modules audited with zero lines of spec (issue 29, part 4): each library's spec,
read from the module, passes a real module and fails one with a planted bug; options a spec does not model are
refused by name; ``"auto"`` picks the spec from the module's class.

Each library is skipped (with the reason) where it is not installed: CI installs diffusers, torchtune and
x-transformers (extra ``audit-test``); litgpt lives in its own environment and timm and open_clip install without
their dependencies (``benchmarks/library_envs.sh``), where their sweeps (``benchmarks/audit_library_sweep.py``) run."""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from typed_transformer.audit import AuditUsageError, audit_module, import_without_torchvision, library_spec
from typed_transformer.strategies import randomize_parameters

ROOT = Path(__file__).resolve().parents[3]
QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 4, "dtypes": [torch.float32],
                         "checks": ["reference", "causality", "masking", "padding", "gradients", "rope",
                                    "incremental_decoding"]}
ENVS = "benchmarks/library_envs.sh"


def _import(name: str) -> Any:
    if name in ("timm", "open_clip"):
        import_without_torchvision()  # the registry's torchvision is a CUDA build: never imported by attention
    reasons = {"litgpt": f"litgpt is not installed (its own environment: {ENVS})",
               "timm": f"timm is not installed ({ENVS} installs it without torchvision)",
               "open_clip": f"open_clip is not installed ({ENVS} installs it without torchvision)"}
    return pytest.importorskip(name, reason=reasons.get(name, f"{name} is not installed (extra audit-test)"))


def _litgpt() -> nn.Module:
    _import("litgpt")
    from litgpt import Config
    from litgpt.model import CausalSelfAttention

    config = Config.from_name("Qwen2.5-0.5B", n_embd=32, n_head=4, n_query_groups=2, head_size=8, n_layer=1,
                              block_size=64)
    module: nn.Module = CausalSelfAttention(config, block_idx=0)
    return module


def _diffusers() -> nn.Module:
    _import("diffusers")
    from diffusers.models.attention_processor import Attention

    module: nn.Module = Attention(16, cross_attention_dim=12, heads=4, dim_head=4, bias=True, qk_norm="layer_norm")
    return module


def _open_clip() -> nn.Module:
    _import("open_clip")
    from open_clip.transformer import Attention

    module: nn.Module = Attention(16, num_heads=4, scale_heads=True)
    return module


def _timm() -> nn.Module:
    timm = _import("timm")
    module: nn.Module = timm.create_model("vit_tiny_patch16_224", pretrained=False, embed_dim=16, depth=1, num_heads=4,
                             img_size=32, patch_size=16, num_classes=0, qkv_bias=True).blocks[0].attn
    return module


def _torchtune() -> nn.Module:
    _import("torchtune")
    from torchtune.models.llama3_1._component_builders import llama3_1

    module: nn.Module = llama3_1(vocab_size=64, num_layers=1, num_heads=4, num_kv_heads=2, embed_dim=16,
                                 max_seq_len=64, intermediate_dim=32).layers[0].attn
    return module


def _x_transformers() -> nn.Module:
    x_transformers = _import("x_transformers")
    module: nn.Module = x_transformers.Attention(16, heads=4, dim_head=4, kv_heads=2, head_scale=True,
                                                              add_zero_kv=True)
    return module


#: library -> (factory, the output projection's attribute path)
LIBRARIES: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "litgpt": (_litgpt, "proj"), "diffusers": (_diffusers, "to_out.0"), "open_clip": (_open_clip, "out_proj"),
    "timm": (_timm, "proj"), "torchtune": (_torchtune, "output_proj"), "x_transformers": (_x_transformers, "to_out")}


def _module(library: str) -> nn.Module:
    return randomize_parameters(LIBRARIES[library][0](), 0)


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_zero_line_spec_passes_the_real_module(library: str) -> None:
    module = _module(library)
    report = audit_module(module, library, **QUICK)
    assert report.passed, report.table()
    ran = {r.name for r in report.results if r.status == "PASS"}
    assert {"reference", "masking", "padding", "gradients"} <= ran
    if library in ("litgpt", "torchtune"):  # the rope cache and the KV cache are what the spec calls
        assert {"rope", "incremental_decoding"} <= ran
    assert audit_module(module, "auto", **{**QUICK, "checks": ["reference"]}).passed
    assert library_spec(module).name == library


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_zero_line_spec_fails_a_swapped_output_projection(library: str) -> None:
    module = _module(library)
    layer: Any = module
    for part in LIBRARIES[library][1].split("."):
        layer = getattr(layer, part)

    def swapped(_: nn.Module, __: Any, out: Tensor) -> Tensor:  # the output features in reverse order
        return out.flip(-1)

    layer.register_forward_hook(swapped)
    report = audit_module(module, library, **{**QUICK, "checks": ["reference"]})
    assert report.failed == ["reference"], report.table()


@pytest.mark.parametrize("library", ["litgpt", "torchtune"])
def test_zero_line_spec_fails_a_shifted_rotary(library: str) -> None:
    module: Any = _module(library)
    if library == "litgpt":
        def shifted(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:  # cos/sin one position late
            x, cos, sin, *rest = args
            return (x, torch.roll(cos, 1, dims=1), torch.roll(sin, 1, dims=1), *rest)

        module.register_forward_pre_hook(shifted)
    else:
        calls = [0]

        # the keys' rotation one position late (every second call: torchtune rotates q, then k); a shift of both
        # would leave every q.k product, and so the output, as it was
        def late(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            calls[0] += 1
            positions = kwargs.get("input_pos")
            t = args[0].shape[1]
            kwargs["input_pos"] = (torch.arange(t)[None] if positions is None else positions) + (1 - calls[0] % 2)
            return args, kwargs

        module.pos_embeddings.register_forward_pre_hook(late, with_kwargs=True)
    report = audit_module(module, library, **{**QUICK, "checks": ["reference", "rope"]})
    assert "rope" in report.failed, report.table()


@pytest.mark.parametrize(("library", "build", "named"), [
    ("timm", lambda timm: timm.layers.Attention(16, num_heads=4, gated=True), "gated=True"),
    ("open_clip", lambda oc: oc.transformer.Attention(16, num_heads=4, scaled_cosine=True), "scaled_cosine=True"),
    ("diffusers", lambda d: d.models.attention_processor.Attention(16, heads=4, dim_head=4, residual_connection=True),
     "residual_connection=True"),
    ("x_transformers", lambda x: x.Attention(16, heads=4, dim_head=4, pre_talking_heads=True),
     "pre_talking_heads"),
])
def test_an_option_the_spec_does_not_model_is_refused_by_name(library: str, build: Callable[[Any], nn.Module],
                                                               named: str) -> None:
    package = _import(library)
    if library == "diffusers":
        import diffusers.models.attention_processor  # noqa: F401
    if library == "open_clip":
        import open_clip.transformer  # noqa: F401
    with pytest.raises(AuditUsageError, match=rf"does not model\b.*{re.escape(named)}"):
        audit_module(build(package), library, budget="quick")


def test_litgpt_options_the_spec_does_not_model_are_refused_by_name() -> None:
    _import("litgpt")
    from litgpt import Config
    from litgpt.model import CausalSelfAttention

    config = Config.from_name("gemma-2-2b", n_embd=32, n_head=4, n_query_groups=2, head_size=8, n_layer=1)
    with pytest.raises(AuditUsageError, match=r"attention_logit_softcapping=50\.0"):
        library_spec(CausalSelfAttention(config, block_idx=0), "litgpt")


def test_a_module_of_another_class_is_refused() -> None:
    with pytest.raises(AuditUsageError, match="no spec describes this class"):
        library_spec(nn.Linear(2, 2))
    _import("x_transformers")
    with pytest.raises(AuditUsageError, match=r"expected a timm\.layers\.attention\.Attention"):
        library_spec(_module("x_transformers"), "timm")


def test_the_repro_rebuilds_the_library_spec() -> None:
    module = _module("x_transformers")
    report = audit_module(lambda: module, "x_transformers", max_examples=2, dtypes=[torch.float64],
                          checks=["reference"], budget="quick")
    repro = report["reference"].repro or ""
    assert "spec = library_spec(module, 'x_transformers')" in repro


_COUNTS = re.compile(r"^counts: (\d+) modules built, (\d+) audited with zero lines of spec, (\d+) pass every check; "
                     r"FAILs \(true behaviours, confirmed in a fresh interpreter\): (\d+) in (\d+) modules; refused "
                     r"by name \(options the reference does not model\): (\d+); not buildable: (\d+)$", re.M)


@pytest.mark.parametrize("library", ["litgpt", "diffusers", "open_clip", "timm", "torchtune", "x_transformers"])
def test_each_sweep_page_has_the_scripts_counts_line(library: str) -> None:
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks import audit_library_sweep

    page = ROOT / "docs" / f"audit-{library.replace('_', '-')}-sweep.md"
    text = page.read_text(encoding="utf-8")
    found = _COUNTS.search(text)
    assert found is not None, f"{page.name} has no counts line in the script's format"
    built, audited, clean, fails, failing, refused, unbuildable = map(int, found.groups())
    assert built == audited + refused + unbuildable
    assert clean + failing == audited
    assert (fails == 0) == (failing == 0)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.count("`") >= 4]
    assert len(rows) == audited
    _, counts = audit_library_sweep.page(library, "0", [], 0.0, "")
    assert _COUNTS.fullmatch(counts)  # the script writes what this test reads
