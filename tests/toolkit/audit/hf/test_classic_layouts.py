"""The classic Hugging Face families audited with zero lines of spec (``hf_spec`` reads their layouts: BERT's
``query/key/value`` and its block's ``output.dense``, GPT-2's ``Conv1D``, BART's ``(embed_dim, num_heads)``
constructor, T5's relative bias, CLIP, OPT, GPT-J's and CodeGen's interleaved partial rotary, DistilBERT,
ModernBERT), a planted bug in each kind failing, and constructors read through decorators."""

import importlib
from typing import Any

import pytest
import torch
from torch import nn

from typed_transformer.audit import AuditUsageError, audit_module
from typed_transformer.audit.hf.build import hf_build
from typed_transformer.audit.hf.notes import hf_limits
from typed_transformer.audit.hf.recognise import hf_spec
from typed_transformer.strategies import randomize_parameters

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

QUICK: dict[str, Any] = {"budget": "quick", "max_examples": 3, "dtypes": (torch.float32,), "seed": 0}


def _class(model: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("model", "name", "cross"), [
    ("bert", "BertAttention", False),  # the block: self-attention + output.dense (Add & Norm bypassed)
    ("bert", "BertAttention", True),  # the decoder's cross-attention block
    ("bert", "BertSelfAttention", False),
    ("gpt2", "GPT2Attention", False),  # Conv1D, stored (in, out)
    ("bart", "BartAttention", False),  # (embed_dim, num_heads) constructor
    ("bart", "BartAttention", True),  # the decoder's cross-attention over key_value_states
    ("t5", "T5Attention", False),  # relative position bias, no 1/sqrt(d)
    ("t5", "T5LayerSelfAttention", False),  # pre-norm + residual around T5Attention
    ("umt5", "UMT5Attention", False),  # its own bucket method (no bidirectional argument)
    ("clip", "CLIPAttention", False),
    ("gptj", "GPTJAttention", False),  # interleaved rotary on rotary_dim of head_dim
    ("codegen", "CodeGenAttention", False),  # fused [q v k] per model-parallel group
    ("opt", "OPTAttention", False),
    ("distilbert", "DistilBertSelfAttention", False),
    ("modernbert", "ModernBertAttention", False),  # fused Wqkv, Wo
    ("blip", "BlipAttention", False),  # vision attention of a composite config; forward takes no mask
    ("altclip", "AltCLIPAttention", False),  # AltCLIP's vision config (its text config lacks attention_dropout)
    ("blip_2", "Blip2QFormerMultiHeadAttention", False),  # the Q-Former's config, nested in Blip2Config
    ("roberta_prelayernorm", "RobertaPreLayerNormAttention", False),  # an output block named ...PreLayerNorm...
    ("esm", "EsmAttention", False),  # scaling 1.0 in the call, the query scaled by head_size**-0.5 before it
])
def test_classic_families_pass_with_zero_lines(model: str, name: str, cross: bool) -> None:
    cls = _class(model, name)
    module = randomize_parameters(hf_build(cls, cross=cross), 0)
    spec = hf_spec(module, cross=cross)
    assert spec.memory == cross
    report = audit_module(module, spec, conventions="infer", **QUICK)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert hf_limits(module) == []


def test_the_block_s_norm_and_residual_are_bypassed_not_ignored() -> None:
    """BertAttention returns LayerNorm(x + dense(attention)): the spec reads output.dense as the output projection
    and calls the block with its LayerNorm as the identity, minus the input."""
    from transformers.models.bert.modeling_bert import BertAttention

    spec = hf_spec(BertAttention)
    assert (spec.q, spec.k, spec.v, spec.out) == ("self.query", "self.key", "self.value", "output.dense")
    assert spec.num_heads == "self.num_attention_heads"  # the module's own count first, then its config's


def test_gpt2_conv1d_used_untransposed_fails() -> None:
    from transformers.pytorch_utils import Conv1D

    class Untransposed(Conv1D):
        """Bug: multiplies by the stored (in, out) weight as if it were (out, in)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight.T + self.bias

    module: Any = randomize_parameters(hf_build(_class("gpt2", "GPT2Attention")), 0)
    planted = Untransposed(module.c_proj.nf, module.c_proj.weight.shape[0])  # type: ignore[no-untyped-call]
    planted.load_state_dict(module.c_proj.state_dict())
    module.c_proj = planted
    report = audit_module(module, hf_spec(module), checks=["reference"], **QUICK)
    assert report.status("reference") == "FAIL"


def test_t5_relative_bias_the_wrong_way_round_fails() -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    class Flipped(T5Attention):
        """Bug: the bias of key j for query i is read at bucket(i - j) instead of bucket(j - i)."""

        def compute_bias(self, query_length: int, key_length: int, device: Any = None,
                         cache_position: Any = None) -> torch.Tensor:
            bias: torch.Tensor = super().compute_bias(  # type: ignore[no-untyped-call]
                query_length, key_length, device, cache_position)
            return bias.transpose(-1, -2)

    module = randomize_parameters(hf_build(Flipped), 0)
    report = audit_module(module, hf_spec(module), checks=["reference"], **QUICK)
    assert report.status("reference") == "FAIL"


def test_a_block_whose_output_projection_reads_the_input_fails() -> None:
    from transformers.models.bert.modeling_bert import BertAttention

    class InputToOutput(BertAttention):
        """Bug: the output module gets the block's input instead of the attention's output."""

        def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, **kwargs: Any) -> Any:
            attention, weights = self.self(hidden_states, attention_mask=attention_mask)
            return self.output(hidden_states + 0 * attention, hidden_states), weights

    module = randomize_parameters(hf_build(InputToOutput), 0)
    report = audit_module(module, hf_spec(module), checks=["reference"], **QUICK)
    assert report.status("reference") == "FAIL"


def _hiding(init: Any) -> Any:
    """A decorator that hides ``__init__``'s signature (no ``functools.wraps``): transformers wraps some
    constructors so, and a signature read without unwrapping sees ``(*args, **kwargs)``."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)

    return wrapper


def test_a_decorator_wrapped_init_is_read_through() -> None:
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    class Wrapped(Qwen2Attention):
        @_hiding
        def __init__(self, config: Qwen2Config, layer_idx: int) -> None:
            super().__init__(config, layer_idx)

    module = hf_build(Wrapped)
    assert module.layer_idx == 0
    assert audit_module(randomize_parameters(module, 0), hf_spec(module), checks=["reference"], **QUICK).passed


def test_a_base_config_annotation_falls_back_to_the_model_s_config() -> None:
    """DistilBERT on transformers 5.0 annotates ``config: PreTrainedConfig``, the base class: no sizes."""
    from transformers import PretrainedConfig
    from transformers.models.distilbert.modeling_distilbert import DistilBertSelfAttention

    from typed_transformer.audit.hf.build import hf_config_class

    class Annotated(DistilBertSelfAttention):
        def __init__(self, config: PretrainedConfig) -> None:
            super().__init__(config)  # type: ignore[arg-type]

    assert hf_config_class(Annotated).__name__ == "DistilBertConfig"


def test_a_module_of_no_known_layout_is_refused_with_what_was_looked_for() -> None:
    class Mixer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mix = nn.Linear(8, 8)

        def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
            out: torch.Tensor = self.mix(hidden_states)
            return out

    with pytest.raises(AuditUsageError, match=r"Mixer: no query/key/value projections \(looked for q_proj/query"):
        hf_spec(Mixer())


def test_fused_layouts_per_head_and_per_group_get_their_shipped_spec() -> None:
    from transformers.models.falcon.modeling_falcon import FalconAttention
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention

    assert hf_spec(GPTNeoXAttention).qkv_layout == "heads"
    assert hf_spec(FalconAttention).qkv_layout == "groups"


def test_gpt_neo_s_unscaled_logits_are_read_and_its_fully_masked_rows_named() -> None:
    """GPT-Neo takes ``q k^T`` unscaled; its attention (as ImageGPT's) fills the logits its own causal mask
    excludes with the dtype's minimum, then adds the mask: rows with an allowed key are exact, rows without one are
    a true behaviour with a named cause."""
    from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoAttention

    from typed_transformer.audit.hf.known import hf_causes

    module = randomize_parameters(hf_build(GPTNeoAttention), 0)
    spec = hf_spec(module)
    assert spec.scale == 1.0
    report = audit_module(module, spec, conventions="infer", checks=["reference", "causality"], **QUICK)
    assert (report.status("reference"), report.status("causality")) == ("PASS", "PASS"), report.table()
    assert hf_causes(module)
    assert "min + min overflows to -inf" in hf_causes(module)[0]
    assert not hf_causes(hf_build(_class("gpt2", "GPT2Attention")))


def test_a_forward_that_takes_no_mask_is_audited_without_masks() -> None:
    """ViT on transformers 5.0: ``forward(hidden_states)``; a mask passed would raise (or, through **kwargs, be
    ignored): the spec says the class takes none."""
    from transformers.models.vit.modeling_vit import ViTAttention

    class NoMask(ViTAttention):
        def forward(self, hidden_states: torch.Tensor) -> Any:  # type: ignore[override]
            return super().forward(hidden_states)

    spec = hf_spec(NoMask)
    assert (spec.conventions.supports_mask, spec.conventions.supports_causal) == (False, False)
    module = randomize_parameters(hf_build(NoMask), 0)
    assert audit_module(module, spec, conventions="infer", **QUICK).passed


def test_codegen_s_groups_are_read_from_its_forward_where_no_attribute_holds_them() -> None:
    """CodeGen on transformers 5.0 sets ``mp_num = 4`` in forward, not as an attribute."""
    from typed_transformer.audit.hf.layout import _mp_num

    class Literal(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mp_num = 4
            return x * mp_num

    class Attribute(Literal):
        mp_num = 8

    assert (_mp_num(Literal()), _mp_num(Attribute()), _mp_num(nn.Linear(2, 2))) == (4, 8, None)
