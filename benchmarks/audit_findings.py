"""The audit's true findings in third-party attention, each re-checked against the installed libraries.

    python benchmarks/audit_findings.py            # re-check every finding, rewrite docs/audit-findings.md
    python benchmarks/audit_findings.py --check    # exit 1 when the page differs from a fresh re-check

Each finding is a minimal repro that runs as printed (the page shows it with what it printed) and sets
``reproduced``; the page says, per finding, the library and version it was checked against and whether it still
reproduces: a finding fixed upstream shows as fixed, a library that is not installed as not re-checked. Run it
with the pinned test extras (``pip install -e '.[audit-test]'``); it takes about half a minute.
"""

import argparse
import contextlib
import importlib.metadata
import io
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import REPO, write_between

PAGE = REPO / "docs" / "audit-findings.md"


@dataclass(frozen=True)
class Finding:
    title: str
    library: str  # the distribution whose behaviour it is
    what: str  # one paragraph: what the audit reports and why it matters
    check: str  # the audit check that catches it
    repro: str  # runs as printed; sets ``reproduced``


FINDINGS = [
    Finding(
        "`nn.MultiheadAttention`'s fast path returns NaN for a fully padded batch element",
        "torch",
        "In eval mode without gradients, with `need_weights=False` and one tensor for query, key and value, the "
        "module takes its inference fast path. A batch element whose keys are all padding comes back as NaN there, "
        "while the same call in training mode (dropout 0) gives zeros: one module, two answers for one input. The "
        "audit's `fast_path` check fails when zero rows are declared (`fully_masked=\"zero\"`).",
        "fast_path",
        '''import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
x = torch.randn(2, 3, 8)
padded = torch.tensor([[True, True, True], [False, False, True]])  # element 0: every key is padding
with torch.no_grad():
    fast, _ = mha.eval()(x, x, x, key_padding_mask=padded, need_weights=False)
    ordinary, _ = mha.train()(x, x, x, key_padding_mask=padded, need_weights=False)
print("fast path, element 0:", fast[0, 0, :3].tolist())
print("training mode, element 0:", ordinary[0, 0, :3].tolist())
print("element 1 agrees:", torch.allclose(fast[1, :2], ordinary[1, :2], atol=1e-6))
reproduced = bool(fast[0].isnan().all()) and bool((ordinary[0] == 0).all())
'''),
    Finding(
        "torchtune's rotary embedding computes in float32 for float64 inputs",
        "torchtune",
        "`RotaryPositionalEmbeddings` builds its cos/sin cache in float32 and rotates in float32 whatever the input "
        "dtype: a float64 input comes back float64 with float32 precision (errors near 1e-7 where float64 allows "
        "about 1e-15). The audit's `rope` and `reference` checks fail in float64 only.",
        "rope",
        '''import torch
from einops import rearrange
from torchtune.modules import RotaryPositionalEmbeddings

from typed_transformer.audit import rotate  # the audit's reference rotation, written out in float64

x = torch.randn(1, 16, 1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # (b, s, h, d)
out = RotaryPositionalEmbeddings(dim=4, max_seq_len=16)(x)
exact = rearrange(rotate(rearrange(x, "b s h d -> b h s d"), 10000.0, "interleaved"), "b h s d -> b s h d")
error = float((out - exact).abs().max())
print("output dtype:", out.dtype, "| max error against a float64 rotation:", f"{error:.1e}")
reproduced = out.dtype == torch.float64 and error > 1e-10
'''),
    Finding(
        "Hugging Face's Llama and GPT-2 eager kernels overflow to NaN in float16 once a logit passes 65504",
        "transformers",
        "The eager attention computes `query @ key.T` in the input dtype before its float32 softmax: in float16 a "
        "logit above 65504 (float16's largest value) becomes inf and the row NaN, where a float64 computation of "
        "the same module is finite. The audit's `large_logits` check fails in float16.",
        "large_logits",
        '''import torch
from transformers import GPT2Config, LlamaConfig
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

torch.manual_seed(0)
llama_config = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2)
gpt2_config = GPT2Config(n_embd=16, n_head=4)
llama_config._attn_implementation = gpt2_config._attn_implementation = "eager"
llama, gpt2 = LlamaAttention(llama_config, layer_idx=0).eval(), GPT2Attention(gpt2_config, layer_idx=0).eval()
x = torch.randn(1, 4, 16)

def llama_out(dtype):  # inputs scaled so that its largest logit passes 65504
    module = llama.to(dtype)
    rotary = LlamaRotaryEmbedding(llama_config)(x.to(dtype), torch.arange(4)[None])
    return module(300 * x.to(dtype), position_embeddings=rotary, attention_mask=None)[0]

with torch.no_grad():  # GPT-2's initial weights are smaller: larger inputs reach the same logits
    outs = {"llama": (llama_out(torch.float16), llama_out(torch.float64)),
            "gpt2": (gpt2.half()(3000 * x.half())[0], gpt2.double()(3000 * x.double())[0])}
nan = {}
for name, (half, double) in outs.items():
    nan[name] = bool(half.isnan().any()) and bool(double.isfinite().all())
    print(f"{name}: float16 output has NaN: {bool(half.isnan().any())}; float64 output finite: "
          f"{bool(double.isfinite().all())}")
reproduced = all(nan.values())
'''),
    Finding(
        "Hugging Face's Llama eager attention is float32-precise in float64",
        "transformers",
        "Its rotary tables (`LlamaRotaryEmbedding`) and its eager softmax (`softmax(..., dtype=torch.float32)`) "
        "run in float32 whatever the model's dtype, so a float64 model differs from a float64 computation by about "
        "4e-7. The audit reports one root cause for every check that fails in float64, found by recomputing the "
        "reference with each candidate change: with float32 tables and a float32 softmax together the module "
        "matches to 1e-15 (either one alone does not).",
        "reference",
        '''import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention

from typed_transformer.audit import audit_module
from typed_transformer.strategies import randomize_parameters

config = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
config._attn_implementation = "eager"
llama = randomize_parameters(LlamaAttention(config, layer_idx=0), seed=0)
report = audit_module(llama, "llama", dtypes=[torch.float32, torch.float64], max_examples=3,
                      checks=["reference", "causality", "rope"])
print(report.table().splitlines()[-1])
print(report.causes[0].lines(1, 1)[0])
reproduced = report.causes[0].diagnosis == ("the module matches the reference when its cos/sin tables and its "
                                            "softmax are computed in float32 (float32 precision in a float64 run)")
'''),
    Finding(
        "x-transformers' `Attention` leaves a row that the mask and the causal flag empty together unzeroed",
        "x-transformers",
        "It zeroes a query row that its mask leaves without keys, but not one that the mask and the causal flag "
        "leave without keys together: that row gets an average of values it may not see. The audit's "
        "`mask_and_causal` check fails; its softmax also runs in float32 whatever the input dtype (every check "
        "fails in float64 by about 5e-7, one root cause: 'its softmax runs in float32').",
        "mask_and_causal",
        '''import torch
from x_transformers import Attention

from typed_transformer.audit import audit_module
from typed_transformer.strategies import randomize_parameters

attention = randomize_parameters(Attention(dim=16, dim_head=4, heads=4, kv_heads=2), seed=0)
report = audit_module(attention, "x_transformers", dtypes=[torch.float32, torch.float64], max_examples=5,
                      checks=["reference", "mask_and_causal"])
print(report.table().splitlines()[-1])
for cause in report.causes:
    print(f"{cause.check} explains {cause.explains()}" + (f"; {cause.diagnosis}" if cause.diagnosis else ""))
reproduced = report.status("mask_and_causal") == "FAIL" and report["mask_and_causal"].dtype == "float32"
'''),
    Finding(
        "diffusers' `Attention(kv_heads=...)` raises on any input with its default processor",
        "diffusers",
        "`Attention(query_dim, heads=4, kv_heads=2)` builds key and value projections for 2 heads, but the default "
        "`AttnProcessor2_0` splits them into `heads` heads of `inner_kv_dim // heads` features and hands the output "
        "projection a tensor of the wrong width: every call raises. The audit's zero-line spec reads the grouped "
        "heads; its every check fails with the error.",
        "reference",
        '''import torch
from diffusers.models.attention_processor import Attention

attention = Attention(16, heads=4, kv_heads=2, dim_head=4)
try:
    attention(torch.randn(2, 3, 16))
    raised = None
except RuntimeError as err:
    raised = str(err).splitlines()[0]
print(type(attention.processor).__name__, "raised:", raised)
reproduced = raised is not None
'''),
    Finding(
        "diffusers' `AttnProcessor2_0` ignores `Attention(scale_qk=False)`",
        "diffusers",
        "`scale_qk=False` sets the module's `scale` to 1 (logits `q.k`, not `q.k / sqrt(d)`), and diffusers then "
        "picks the classic `AttnProcessor`, which applies it. `AttnProcessor2_0`, set explicitly (`processor=` or "
        "`set_processor`, as pipelines do for speed), never passes `attn.scale` to `scaled_dot_product_attention`, "
        "which divides by `sqrt(d)` anyway: the same module gives another answer, with no warning. The audit's "
        "zero-line spec reads `scale`; every check of such a module fails.",
        "reference",
        '''import torch
from diffusers.models.attention_processor import Attention, AttnProcessor2_0

torch.manual_seed(0)
attention = Attention(16, heads=4, dim_head=4, scale_qk=False)
x = torch.randn(2, 3, 16)
with torch.no_grad():
    chosen = attention(x)
    attention.set_processor(AttnProcessor2_0())
    fast = attention(x)
difference = float((chosen - fast).abs().max())
print("scale:", attention.scale, f"| AttnProcessor2_0 against the chosen processor: max difference {difference:.3f}")
reproduced = difference > 1e-4
'''),
    Finding(
        "diffusers' `RMSNorm` q/k norm computes its variance in float32 for float64 inputs",
        "diffusers",
        "`Attention(..., qk_norm=\"rms_norm\")` normalises queries and keys with diffusers' `RMSNorm`, which takes the "
        "mean square in float32 whatever the input dtype: a float64 module is float32-precise (errors near 1e-8 where "
        "float64 allows about 1e-14). The audit's float64 checks fail; float32 passes.",
        "reference",
        '''import torch
from diffusers.models.normalization import RMSNorm

x = torch.randn(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
norm = RMSNorm(8, eps=1e-6).double()
exact = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
error = float((norm(x) - exact).abs().max())
print("output dtype:", norm(x).dtype, f"| max error against a float64 RMSNorm: {error:.1e}")
reproduced = error > 1e-12
'''),
    Finding(
        "x-transformers' `Attention(num_mem_kv=...)` raises on any `attn_mask`",
        "x-transformers",
        "With memory key/values the module prepends `num_mem_kv` keys and pads its key padding `mask` for them, but "
        "not an `attn_mask`: any `attn_mask` of the input's length raises a size mismatch. The audit's `masking` and "
        "`padding` checks fail with the error; calls without a mask and with `mask=` pass.",
        "masking",
        '''import torch
from x_transformers import Attention

attention = Attention(16, heads=4, dim_head=4, num_mem_kv=2)
x = torch.randn(1, 3, 16)
print("key padding mask works:", tuple(attention(x, mask=torch.tensor([[True, True, False]])).shape))
try:
    attention(x, attn_mask=torch.ones(3, 3, dtype=torch.bool))
    raised = None
except RuntimeError as err:
    raised = str(err).splitlines()[0]
print("attn_mask raised:", raised)
reproduced = raised is not None
'''),
    Finding(
        "Hugging Face's V-JEPA 2 pooler attention ignores its attention mask under eager attention",
        "transformers",
        "`VJEPA2PoolerSelfAttention` and `VJEPA2PoolerCrossAttention` take an `attention_mask` (their layers document "
        "it: padding as very large negative values) and pass it to the attention function. Under `sdpa` it is "
        "applied; the modeling module's own `eager_attention_forward` takes it and never adds it, so under eager "
        "attention every mask (padding, causal) is ignored: one module, two answers. V-JEPA 2's own pooler passes "
        "no mask, so the model's outputs are unaffected; a caller passing the documented mask is. The audit's "
        "`masking`, `padding`, `causality` and `conventions` (supports_mask) checks fail under eager attention.",
        "masking",
        '''import torch
from transformers import VJEPA2Config
from transformers.models.vjepa2.modeling_vjepa2 import VJEPA2PoolerSelfAttention

torch.manual_seed(0)
config = VJEPA2Config(pred_hidden_size=16, hidden_size=16, num_attention_heads=4)
outputs = {}
for implementation in ("eager", "sdpa"):
    config._attn_implementation = implementation
    torch.manual_seed(0)
    attention = VJEPA2PoolerSelfAttention(config).eval()
    x = torch.randn(1, 3, 16, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([True, True, False])  # the last key is padding
    mask = torch.zeros(1, 1, 3, 3).masked_fill(~keep, torch.finfo(torch.float32).min)
    masked, _ = attention(x, attention_mask=mask)
    unmasked, _ = attention(x)
    outputs[implementation] = (masked, unmasked)
    print(f"{implementation}: masked output differs from unmasked by {float((masked - unmasked).abs().max()):.3f}")
eager_ignores = torch.equal(outputs["eager"][0], outputs["eager"][1])
print("eager ignores the mask:", eager_ignores)
reproduced = eager_ignores and not torch.allclose(outputs["sdpa"][0], outputs["sdpa"][1])
'''),
]

#: Findings in libraries outside the test extras, each library's in a block of its own that the script rewrites
#: where the library is installed (``--library litgpt`` in .venv-litgpt; open_clip in .venv, installed without its
#: dependencies by benchmarks/library_envs.sh and imported through the torchvision shim).
LIBRARY_FINDINGS: dict[str, list[Finding]] = {
    "litgpt": [
        Finding(
            "litgpt's rope cache is float32-precise in a float64 model",
            "litgpt",
            "`build_rope_cache` computes its frequencies and angles in float32; a model moved to float64 holds "
            "float64 cos/sin buffers with float32 values (errors near 1e-7 where float64 allows about 1e-16), and "
            "its rotary embedding is float32-precise. The audit's float64 `rope` and `reference` checks fail "
            "(with the rope cache litgpt's `GPT.rope_cache` builds); float32 passes.",
            "rope",
            '''import torch
from litgpt import Config
from litgpt.model import GPT

config = Config(n_embd=32, n_head=4, head_size=8, n_layer=1, block_size=16, padded_vocab_size=64,
                rotary_percentage=1.0)
model = GPT(config).double()  # a float64 model: its rope cache buffers become float64
angles = torch.arange(16, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 8, 2).double() / 8)
exact = torch.cat([angles.cos(), angles.cos()], dim=-1)  # (position, head size): pairs i and i + 4
error = float((model.cos - exact).abs().max())
print("rope cache:", tuple(model.cos.shape), model.cos.dtype, f"| max error against float64 cosines: {error:.1e}")
reproduced = model.cos.dtype == torch.float64 and error > 1e-10
'''),
        Finding(
            "litgpt's sliding-window layers ignore the mask they are given",
            "litgpt",
            "A `CausalSelfAttention` whose layer has a sliding window (`sliding_window_size`, without a KV cache) "
            "replaces the mask it is called with by its own causal window mask: a padding mask, or any mask, has "
            "no effect (and the layer is causal whatever the caller asked). The audit's `masking` and `padding` "
            "checks fail on such layers; layers without a window pass.",
            "masking",
            '''import types

import torch
from litgpt import Config
from litgpt.model import GPT, CausalSelfAttention

torch.manual_seed(0)
x = torch.randn(1, 5, 16)
causal = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()
hidden = causal.clone()
hidden[..., 1:, 0] = False  # queries 1.. may no longer see key 0
for window in (None, 4):
    config = Config(n_embd=16, n_head=2, head_size=8, n_layer=1, block_size=16, sliding_window_size=window)
    attention = CausalSelfAttention(config, block_idx=0)
    cos, sin = GPT.rope_cache(types.SimpleNamespace(config=config, max_seq_length=5))
    with torch.no_grad():
        seen, masked = attention(x, cos[None], sin[None], causal), attention(x, cos[None], sin[None], hidden)
    change = float((seen - masked).abs().max())
    print(f"sliding_window_size={window}: window layer {attention.apply_sliding_window_attention}, "
          f"output change when key 0 is masked: {change:.3g}")
reproduced = change == 0.0
'''),
    ],
    "open_clip_torch": [
        Finding(
            "open_clip's `Attention(scaled_cosine=True)` raises on any input",
            "open_clip_torch",
            "The cosine-attention branch multiplies the `(b, h, t, d)` queries and keys with `torch.bmm`, which takes "
            "3-D tensors only: every call raises (the `use_fsdpa=False` branch does the same). The zero-line spec "
            "refuses `scaled_cosine` by name (the reference has no cosine attention); this repro is the call itself.",
            "reference",
            '''import torch

from typed_transformer.audit import import_without_torchvision

import_without_torchvision()  # open_clip imports torchvision at import time; its attention never uses it
from open_clip.transformer import Attention

attention = Attention(16, num_heads=4, scaled_cosine=True)
try:
    attention(torch.randn(2, 3, 16))
    raised = None
except RuntimeError as err:
    raised = str(err).splitlines()[0]
print("raised:", raised)
reproduced = raised is not None
'''),
        Finding(
            "open_clip's `Attention(qk_norm=True)` raises on float64 modules",
            "open_clip_torch",
            "The q/k norms are `LayerNormFp32`, which casts its input to float32 but keeps the module's weights: a "
            "module moved to float64 raises a mixed-dtype error on every call. The audit's float64 checks fail with "
            "the error; float32 passes.",
            "reference",
            '''import torch

from typed_transformer.audit import import_without_torchvision

import_without_torchvision()
from open_clip.transformer import Attention

attention = Attention(16, num_heads=4, qk_norm=True).double()
try:
    attention(torch.randn(2, 3, 16, dtype=torch.float64))
    raised = None
except RuntimeError as err:
    raised = str(err).splitlines()[0]
print("float64 call raised:", raised)
reproduced = raised is not None
'''),
    ],
    "timm": [
        Finding(
            "timm's `Attention` manual (non-fused) path drops `attn_mask` when `is_causal=True`",
            "timm",
            "With `fused_attn=False` (timm's own softmax, as under `TIMM_FUSED_ATTN=0` or on exporters) the module "
            "applies the causal mask and ignores `attn_mask` whenever `is_causal=True`; the SDPA path honours both. "
            "The audit's `mask_and_causal` check fails on the manual path only.",
            "mask_and_causal",
            '''import torch
from typed_transformer.audit import import_without_torchvision

import_without_torchvision()  # the registry's torchvision is a CUDA build; attention never uses it
from timm.layers.attention import Attention

torch.manual_seed(0)
attention = Attention(16, num_heads=4).eval()
x = torch.randn(1, 4, 16)
keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)
keep[..., 1:, 0] = False  # queries 1.. may not see key 0
with torch.no_grad():
    fused = attention(x, attn_mask=keep & torch.ones(4, 4, dtype=torch.bool).tril())  # SDPA: mask and causal
    attention.fused_attn = False
    manual = attention(x, attn_mask=keep, is_causal=True)
    causal_only = attention(x, is_causal=True)
print(f"manual path against mask and causal together: max difference {float((manual - fused).abs().max()):.3f}")
print(f"manual path against the causal flag alone: max difference {float((manual - causal_only).abs().max()):.3f}")
reproduced = float((manual - causal_only).abs().max()) == 0.0 and float((manual - fused).abs().max()) > 1e-4
'''),
    ],
}

#: Findings without a repro this script can run (none today: timm's moved to LIBRARY_FINDINGS once it imported
#: through the torchvision shim).
NOT_INSTALLABLE: list[tuple[str, str, str]] = []


def version(library: str) -> str | None:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def recheck(finding: Finding) -> tuple[str, str]:
    """``(status, printed)``: reproduced, FIXED (runs, no longer reproduces) or not re-checked (not installed)."""
    installed = version(finding.library)
    if installed is None:
        return f"not re-checked: {finding.library} is not installed", ""
    buffer, namespace = io.StringIO(), {"__name__": "__finding__"}
    with contextlib.redirect_stdout(buffer):
        exec(compile(finding.repro, finding.title, "exec"), namespace)  # the page's own repro, as printed
    if namespace.get("reproduced"):
        return f"**reproduced** with {finding.library} {installed}", buffer.getvalue()
    return f"**FIXED upstream**: no longer reproduces with {finding.library} {installed}", buffer.getvalue()


#: libraries of the main list that the main venv (where tests/docs runs the pages) does not install
NOT_IN_MAIN_VENV = ("diffusers",)


def page_block() -> str:
    import torch

    lines = [f"Re-checked by `benchmarks/audit_findings.py` with torch {torch.__version__.split('+')[0]}"
             + "".join(f", {lib} {version(lib)}" for lib in ("transformers", "torchtune", "x-transformers", "diffusers")
                       if version(lib)) + ".", ""]
    for number, finding in enumerate(FINDINGS, start=1):
        status, printed = recheck(finding)
        skip = ([f'<!-- skip: next "{finding.library} is not in the test environment: the audit-test extra '
                 f'installs it" -->'] if finding.library in NOT_IN_MAIN_VENV else [])
        lines += [f"### {number}. {finding.title}", "", f"{status} (caught by the `{finding.check}` check).", "",
                  finding.what, "", *skip, "```python", finding.repro.rstrip(), "```", ""]
        if printed:
            lines += ["```text", printed.rstrip(), "```", ""]
    for number, (library, title, why) in enumerate(NOT_INSTALLABLE, start=len(FINDINGS) + 1):
        lines += [f"### {number}. {title}", "", f"not re-checked: {library} is not installed. {why}", ""]
    return "\n".join(lines).rstrip() + "\n"


def library_block(library: str) -> str:
    """The block of one library's findings (``LIBRARY_FINDINGS``), numbered after the page's main list."""
    first = len(FINDINGS) + len(NOT_INSTALLABLE) + 1 + sum(
        len(found) for name, found in LIBRARY_FINDINGS.items() if list(LIBRARY_FINDINGS).index(name) <
        list(LIBRARY_FINDINGS).index(library))
    lines = []
    for number, finding in enumerate(LIBRARY_FINDINGS[library], start=first):
        status, printed = recheck(finding)
        lines += [f"### {number}. {finding.title}", "", f"{status} (caught by the `{finding.check}` check).", "",
                  finding.what, "", f'<!-- skip: next "{library} is not in the test environment: '
                  f'benchmarks/library_envs.sh installs it" -->', "```python", finding.repro.rstrip(), "```", ""]
        if printed:
            lines += ["```text", printed.rstrip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def library_markers(library: str) -> tuple[str, str]:
    return (f"<!-- begin: audit-findings-{library} (generated by benchmarks/audit_findings.py --library {library}; "
            f"do not edit by hand) -->", f"<!-- end: audit-findings-{library} -->")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from a fresh re-check")
    parser.add_argument("--library", choices=sorted(LIBRARY_FINDINGS), default=None,
                        help="rewrite only this library's block (run where it is installed)")
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    if args.library is not None:
        write_between(PAGE, *library_markers(args.library), library_block(args.library))
        print(f"docs/audit-findings.md: {len(LIBRARY_FINDINGS[args.library])} {args.library} findings re-checked")
        return 0
    block = page_block()
    if args.check:
        text = PAGE.read_text(encoding="utf-8")
        fresh = text.split(_BEGIN, 1)[0] + _BEGIN + "\n" + block + "\n" + _END + text.split(_END, 1)[1]
        if fresh != text:
            print("docs/audit-findings.md is out of date: python benchmarks/audit_findings.py")
            return 1
        print("docs/audit-findings.md is up to date")
        return 0
    write_between(PAGE, _BEGIN, _END, block)
    print(f"docs/audit-findings.md: {len(FINDINGS)} findings re-checked")
    return 0


_BEGIN = "<!-- begin: audit-findings (generated by benchmarks/audit_findings.py; do not edit by hand) -->"
_END = "<!-- end: audit-findings -->"

if __name__ == "__main__":
    raise SystemExit(main())
