"""Every shipped library spec models every constructor option of its class or refuses it by name before any check
runs (issue 29, part 4): the options each spec lists (``LIBRARY_OPTIONS``) are the class's own, a module built with
a refused option is refused with a message naming it and its forward never runs, and a module built with a modelled
option passes against the real library.

Each library is skipped (with the reason) where it is not installed (``benchmarks/library_envs.sh`` for litgpt,
timm and open_clip; the ``audit-test`` extra for the others)."""

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tests.toolkit.audit.test_audit_libraries import _import
from typed_transformer.audit import AuditUsageError, audit_module
from typed_transformer.audit.specs.libraries import LIBRARY_OPTIONS
from typed_transformer.strategies import randomize_parameters

# budget "quick": these tests are about the options, not the sizes (the deep lengths: the rotary cache test)
QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 2, "dtypes": [torch.float32],
                         "checks": ["reference", "masking"]}


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    cls: type = getattr(__import__(module, fromlist=[name]), name)
    return cls


def _listed(library: str) -> set[str]:
    options = LIBRARY_OPTIONS[library]
    return {*options.modelled, *options.refused, *options.inert}


#: the shipped specs of classes outside any third-party library (nothing to import)
OWN = ("torch_mha", "typed_transformer")


def _need(library: str) -> None:
    if library not in OWN:
        _import(library)


@pytest.mark.parametrize("library", ["timm", "open_clip", "diffusers", "torchtune", *OWN])
def test_every_constructor_option_is_listed(library: str) -> None:
    _need(library)
    cls = _class(LIBRARY_OPTIONS[library].cls)
    signature = set(inspect.signature(inspect.unwrap(vars(cls)["__init__"])).parameters) - {"self"}
    assert signature == _listed(library)


def test_every_config_field_litgpt_attention_reads_is_listed() -> None:
    _import("litgpt")
    from litgpt.model import GPT, CausalSelfAttention

    read = {field for code in (CausalSelfAttention, GPT.rope_cache)
            for field in re.findall(r"config\.(\w+)", inspect.getsource(code))}
    assert read
    assert read <= _listed("litgpt"), sorted(read - _listed("litgpt"))


def _diffusers(query_dim: int = 16, **options: Any) -> nn.Module:
    from diffusers.models.attention_processor import Attention

    module: nn.Module = Attention(query_dim, heads=4, dim_head=4, **options)
    return module


def _timm(**options: Any) -> nn.Module:
    from timm.layers.attention import Attention

    module: nn.Module = Attention(16, num_heads=4, **options)
    return module


def _open_clip(**options: Any) -> nn.Module:
    from open_clip.transformer import Attention

    module: nn.Module = Attention(16, num_heads=4, **options)
    return module


def _torchtune(**options: Any) -> nn.Module:
    from torchtune.modules import MultiHeadAttention

    projections = {"q_proj": nn.Linear(16, 16), "k_proj": nn.Linear(16, 8), "v_proj": nn.Linear(16, 8),
                   "output_proj": nn.Linear(16, 16)}
    module: nn.Module = MultiHeadAttention(embed_dim=16, num_heads=4, num_kv_heads=2, head_dim=4,
                                           **{**projections, **options})
    return module


def _litgpt(name: str, **options: Any) -> nn.Module:
    from litgpt import Config
    from litgpt.model import CausalSelfAttention

    sizes = {"n_embd": 32, "n_head": 4, "n_query_groups": 2, "head_size": 8, "n_layer": 1, "block_size": 64}
    module: nn.Module = CausalSelfAttention(Config.from_name(name, **{**sizes, **options}), block_idx=0)
    return module


def _ours(**options: Any) -> nn.Module:
    from typed_transformer.multihead import MultiHeadAttention

    module: nn.Module = MultiHeadAttention(16, 4, **options)
    return module


def _torch_mha(**options: Any) -> nn.Module:
    return nn.MultiheadAttention(16, 4, **options)


def _lora(width: int) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        from torchtune.modules.peft import LoRALinear

        module: nn.Module = LoRALinear(16, width, rank=2, alpha=4.0)
        return module

    return make


def _vision_rope() -> nn.Module:
    from torchtune.modules.position_embeddings import VisionRotaryPositionalEmbeddings

    module: nn.Module = VisionRotaryPositionalEmbeddings(patch_size=4, tile_size=8, max_num_tiles=1, dim=4)
    return module


def _layer_norm() -> type:
    return nn.LayerNorm


def _processor(name: str) -> Callable[[], Any]:
    def make() -> Any:
        import diffusers.models.attention_processor as processors

        return getattr(processors, name)()

    return make


#: (library, the builder, its options: a value that is a function is called to make the option, the option the
#: refusal must name)
REFUSED: list[tuple[str, Callable[..., nn.Module], dict[str, Any], str]] = [
    ("timm", _timm, {"scale_norm": True, "norm_layer": _layer_norm}, "scale_norm"),
    ("timm", _timm, {"gated": True}, "gated"),
    ("open_clip", _open_clip, {"scaled_cosine": True}, "scaled_cosine"),
    ("open_clip", _open_clip, {"inner_norm": True}, "inner_norm"),
    ("diffusers", _diffusers, {"qk_norm": "l2"}, "qk_norm='l2'"),
    # kv_heads given: without it diffusers' constructor raises for these two (kv_heads * dim_head with None)
    ("diffusers", _diffusers, {"qk_norm": "layer_norm_across_heads", "kv_heads": 4},
     "qk_norm='layer_norm_across_heads'"),
    ("diffusers", _diffusers, {"qk_norm": "rms_norm_across_heads", "kv_heads": 4}, "qk_norm='rms_norm_across_heads'"),
    ("diffusers", _diffusers, {"processor": _processor("AttnAddedKVProcessor2_0")},
     "processor AttnAddedKVProcessor2_0"),
    ("diffusers", _diffusers, {"cross_attention_dim": 12, "cross_attention_norm": "layer_norm"},
     "cross_attention_norm"),
    ("diffusers", _diffusers, {"added_kv_proj_dim": 8}, "added_kv_proj_dim"),
    ("diffusers", _diffusers, {"norm_num_groups": 4}, "norm_num_groups"),
    ("diffusers", _diffusers, {"query_dim": 32, "spatial_norm_dim": 8}, "spatial_norm_dim"),  # 32 groups
    ("diffusers", _diffusers, {"added_kv_proj_dim": 8, "only_cross_attention": True}, "only_cross_attention"),
    ("diffusers", _diffusers, {"residual_connection": True}, "residual_connection"),
    ("diffusers", _diffusers, {"pre_only": True}, "pre_only"),
    ("torchtune", _torchtune, {"q_proj": _lora(16)}, "q_proj=LoRALinear"),
    ("torchtune", _torchtune, {"k_proj": _lora(8)}, "k_proj=LoRALinear"),
    ("torchtune", _torchtune, {"v_proj": _lora(8)}, "v_proj=LoRALinear"),
    ("torchtune", _torchtune, {"output_proj": _lora(16)}, "output_proj=LoRALinear"),
    ("torchtune", _torchtune, {"pos_embeddings": _vision_rope}, "pos_embeddings=VisionRotaryPositionalEmbeddings"),
    ("typed_transformer", _ours, {"add_bias_kv": True}, "add_bias_kv=True"),
    ("typed_transformer", _ours, {"add_zero_attn": True}, "add_zero_attn=True"),
    ("typed_transformer", _ours, {"kdim": 10}, "kdim"),
    ("typed_transformer", _ours, {"vdim": 10}, "vdim"),
    ("litgpt", lambda **o: _litgpt("gemma-2-2b", **o), {}, "attention_logit_softcapping"),
    ("litgpt", lambda **o: _litgpt("Llama-3.1-8B", **o), {}, "rope_adjustments"),
    ("litgpt", lambda **o: _litgpt("Gemma-3-1b-it", **o), {}, "rope_local_base_freq"),
]


def _made(options: dict[str, Any]) -> dict[str, Any]:
    return {name: value() if callable(value) and not isinstance(value, type) else value
            for name, value in options.items()}


@pytest.mark.parametrize(("library", "build", "options", "named"), REFUSED,
                         ids=[f"{case[0]}-{case[3]}" for case in REFUSED])
def test_an_unmodelled_option_is_refused_by_name_before_any_check(
        library: str, build: Callable[..., nn.Module], options: dict[str, Any], named: str) -> None:
    _need(library)
    module = build(**_made(options))
    calls: list[int] = []
    module.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(AuditUsageError, match=rf"does not model\b.*{re.escape(named)}"):
        audit_module(module, library, **QUICK)
    assert calls == []  # refused before any check ran the module


def test_every_refused_option_has_a_refusal_test() -> None:
    tested = {(case[0], re.split(r"[ =]", case[3])[-1 if case[3].startswith("processor ") else 0])
              for case in REFUSED}
    tested = {(library, "processor" if name.startswith("AttnAdded") else name) for library, name in tested}
    listed = {(library, name) for library, options in LIBRARY_OPTIONS.items() for name in options.refused}
    assert listed <= tested, sorted(listed - tested)


def _rope(name: str) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import torchtune.models.phi3._position_embeddings as phi3
        import torchtune.models.qwen2._positional_embeddings as qwen2
        import torchtune.modules as modules
        from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

        cls = {"RotaryPositionalEmbeddings": modules.RotaryPositionalEmbeddings,
               "Llama3ScaledRoPE": Llama3ScaledRoPE, "Phi3RotaryPositionalEmbeddings":
               phi3.Phi3RotaryPositionalEmbeddings, "Qwen2RotaryPositionalEmbeddings":
               qwen2.Qwen2RotaryPositionalEmbeddings}[name]
        module: nn.Module = cls(4, max_seq_len=64)
        return module

    return make


def _rms(size: int) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        from torchtune.modules import RMSNorm

        module: nn.Module = RMSNorm(size)
        return module

    return make


def _rotary() -> nn.Module:
    from typed_transformer.positions import RotaryEmbedding

    return RotaryEmbedding(4, base=500.0)


def _rms_layer() -> type:
    from timm.layers.norm import RmsNorm

    layer: type = RmsNorm
    return layer


#: (library, builder, modelled options set away from their defaults)
MODELLED: list[tuple[str, Callable[..., nn.Module], dict[str, Any]]] = [
    ("timm", _timm, {"attn_head_dim": 8, "qkv_bias": True}),
    ("timm", _timm, {"dim_out": 12, "proj_bias": False}),
    ("timm", _timm, {"qk_norm": True, "norm_layer": _layer_norm}),
    ("timm", _timm, {"qk_norm": True, "norm_layer": _rms_layer}),
    ("open_clip", _open_clip, {"qkv_bias": False, "scale_heads": True}),
    ("open_clip", _open_clip, {"qk_norm": True, "norm_layer": _layer_norm}),
    ("diffusers", _diffusers, {"cross_attention_dim": 12, "bias": True, "out_bias": False}),
    ("diffusers", _diffusers, {"upcast_attention": True, "upcast_softmax": True, "rescale_output_factor": 2.0}),
    ("diffusers", _diffusers, {"qk_norm": "rms_norm", "eps": 1e-3}),
    ("diffusers", _diffusers, {"qk_norm": "layer_norm", "elementwise_affine": False}),
    ("diffusers", _diffusers, {"qk_norm": "fp32_layer_norm"}),
    ("diffusers", _diffusers, {"out_dim": 32, "processor": _processor("AttnProcessor")}),
    ("diffusers", _diffusers, {"scale_qk": False, "processor": _processor("AttnProcessor")}),
    ("torchtune", _torchtune, {"pos_embeddings": _rope("RotaryPositionalEmbeddings"), "is_causal": False}),
    ("torchtune", _torchtune, {"pos_embeddings": _rope("Llama3ScaledRoPE"), "max_seq_len": 32}),
    ("torchtune", _torchtune, {"pos_embeddings": _rope("Phi3RotaryPositionalEmbeddings")}),
    ("torchtune", _torchtune, {"pos_embeddings": _rope("Qwen2RotaryPositionalEmbeddings")}),
    ("torchtune", _torchtune, {"q_norm": _rms(4), "k_norm": _rms(4)}),
    ("torch_mha", _torch_mha, {"kdim": 12, "vdim": 10, "bias": False}),
    ("torch_mha", _torch_mha, {"add_bias_kv": True, "add_zero_attn": True, "batch_first": True}),
    ("typed_transformer", _ours, {"input_dim": 12, "kdim": 12, "vdim": 12, "bias": False}),
    ("typed_transformer", _ours, {"num_kv_heads": 2, "backend": "sdpa", "rotary": _rotary}),
    ("litgpt", lambda **o: _litgpt("Qwen3-0.6B", **o), {}),  # per-head q/k RMSNorm
    ("litgpt", lambda **o: _litgpt("OLMo-2-1124-7B", **o), {}),  # OLMo-2's q/k norm over every head
    ("litgpt", lambda **o: _litgpt("phi-2", **o), {"head_size": 20, "n_embd": 80}),  # partial rotary, biases
    ("litgpt", lambda **o: _litgpt("Qwen2.5-0.5B", **o), {"rope_interleave": True, "attention_scores_scalar": 4,
                                                            "rope_condense_ratio": 2}),
]


@pytest.mark.parametrize(("library", "build", "options"), MODELLED,
                         ids=[f"{case[0]}-{','.join(case[2]) or 'named config'}" for case in MODELLED])
def test_a_modelled_option_passes_against_the_real_module(
        library: str, build: Callable[..., nn.Module], options: dict[str, Any]) -> None:
    _need(library)
    module = randomize_parameters(build(**_made(options)), 0)
    report = audit_module(module, library, **QUICK)
    assert report.passed, report.table()


def test_a_rotary_cache_caps_the_lengths_the_default_budget_draws() -> None:
    """torchtune's rotary classes hold ``max_seq_len`` positions and raise past them: the spec's ``max_length``
    keeps the deep lengths (up to 129) within the cache, and the report says what was not drawn. Without it every
    check failed with the module's own RuntimeError (shape '[-1, 65, 1, 2, 2]' is invalid)."""
    _need("torchtune")
    rope = _rope("RotaryPositionalEmbeddings")()
    module = randomize_parameters(_torchtune(pos_embeddings=rope), 0)
    report = audit_module(module, "torchtune", seed=0, max_examples=3, dtypes=[torch.float32],
                          checks=["reference", "masking"])
    assert report.passed, report.table()
    assert "sequences longer than 64 (the module's longest: its spec's max_length)" in report.untested
    drawn = [r.examples for r in report.results]
    assert all(n > 3 for n in drawn), drawn  # the deep examples were drawn, within the cache


def test_every_option_entry_names_its_class() -> None:
    for library, options in LIBRARY_OPTIONS.items():
        assert dataclasses.is_dataclass(options)
        assert options.cls.count(".") >= 2, library
        assert not set(options.inert) & ({*options.modelled} | {*options.refused}), library
