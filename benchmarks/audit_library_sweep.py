"""Audits one library's attention modules with zero lines of spec, and writes docs/audit-<library>-sweep.md.

    python benchmarks/audit_library_sweep.py timm          # writes docs/audit-timm-sweep.md
    python benchmarks/audit_library_sweep.py litgpt --print   # prints the page instead (in .venv-litgpt: see below)

Libraries: litgpt, diffusers, open_clip, timm, torchtune, x_transformers (torchtitan: see docs/audit.md for why
not). Each case builds one attention
module small, from the library's own configs and constructors (litgpt: every named config of ``litgpt.Config``, shrunk
to 4 heads and deduplicated by the options its attention reads; torchtune: its model builders; the others: their
constructors over several option combinations), randomizes its parameters (seed 0) and audits it with
``audit_module(module, "<library>")`` (float32 and float64, 4 examples per check, seed 0): the spec is read from the
module. A module with an option the spec does not model is refused by name before any check runs (listed, not
audited). Each FAIL is re-audited in a fresh interpreter before it is counted. litgpt runs in
``.venv-litgpt`` and timm and open_clip import through a torchvision shim: ``benchmarks/library_envs.sh`` sets them up.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHIM = "from typed_transformer.audit import import_without_torchvision\nimport_without_torchvision()\n"
#: the options of a litgpt config its attention reads (the key that deduplicates the named configs)
LITGPT_KEYS = ("n_query_groups", "bias", "attn_bias", "norm_qk", "norm_qk_type", "norm_class_name",
               "rope_interleave", "rotary_percentage", "rope_condense_ratio", "attention_scores_scalar",
               "attention_logit_softcapping", "rope_adjustments", "rope_local_base_freq", "sliding_window_size")


def _litgpt_cases() -> list[tuple[str, str, str]]:
    """Every named litgpt config, shrunk (4 heads of 8, or wider where its rotary fraction needs it, key/value groups
    1, 2 or 4 as the config groups them, a window of 3 where it has one, scalar scales kept), one per distinct set of
    the options attention reads."""
    from litgpt.config import name_to_config

    seen: dict[str, str] = {}
    cases = []
    for name in sorted(name_to_config):
        raw = name_to_config[name]
        groups = raw.get("n_query_groups") or raw.get("n_head", 1)
        heads = raw.get("n_head", 1)
        g = 4 if groups == heads else (1 if groups == 1 else 2)
        # heads of 8, or the smallest size whose rotated part is a whole number of pairs (phi-2's 0.4: 20)
        fraction = raw.get("rotary_percentage") or 0.25
        size = next(d for d in (8, 16, 20, 32, 40, 80) if (d * fraction) % 2 == 0)
        overrides = {"n_embd": 4 * size, "n_head": 4, "n_query_groups": g, "head_size": size, "n_layer": 1,
                     "intermediate_size": 64, "block_size": 64, "padded_vocab_size": 64}
        if raw.get("sliding_window_size"):
            overrides["sliding_window_size"] = 3
        key = json.dumps({k: raw.get(k) for k in LITGPT_KEYS if k != "sliding_window_size"} | {
            "groups": g, "size": size, "window": bool(raw.get("sliding_window_size"))}, sort_keys=True, default=str)
        if key in seen:
            continue
        seen[key] = name
        cases.append((name, "from litgpt import Config\nfrom litgpt.model import CausalSelfAttention\n",
                       f"CausalSelfAttention(Config.from_name({name!r}, **{overrides!r}), block_idx=0)"))
    return cases


def _diffusers_cases() -> list[tuple[str, str, str]]:
    imports = ("from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0, "
               "SlicedAttnProcessor\n")
    options = {"self": "", "self, bias": "bias=True", "cross": "cross_attention_dim=12",
               "cross, bias": "cross_attention_dim=12, bias=True", "qk layer_norm": "qk_norm='layer_norm'",
               "qk rms_norm": "qk_norm='rms_norm'", "qk fp32_layer_norm": "qk_norm='fp32_layer_norm'",
               "no scale_qk": "scale_qk=False", "rescale_output_factor=2": "rescale_output_factor=2.0",
               "upcast softmax and attention": "upcast_softmax=True, upcast_attention=True",
               "kv_heads=2": "kv_heads=2", "out_dim=32": "out_dim=32",
               "residual_connection": "residual_connection=True", "norm_num_groups=4": "norm_num_groups=4",
               "qk l2": "qk_norm='l2'"}
    processors = {"AttnProcessor2_0": "AttnProcessor2_0()", "AttnProcessor": "AttnProcessor()",
                  "SlicedAttnProcessor": "SlicedAttnProcessor(slice_size=2)"}
    cases = []
    for label, args in options.items():
        for kind, processor in processors.items():
            if kind != "AttnProcessor2_0" and label not in ("self", "cross, bias"):
                continue
            extra = f", {args}" if args else ""
            cases.append((f"{label} ({kind})", imports,
                          f"Attention(16, heads=4, dim_head=4{extra}, processor={processor})"))
    return cases


def _open_clip_cases() -> list[tuple[str, str, str]]:
    imports = SHIM + "from open_clip.transformer import Attention\n"
    options = {"default": "", "no qkv bias": "qkv_bias=False", "qk_norm": "qk_norm=True",
               "scale_heads": "scale_heads=True", "qk_norm, scale_heads": "qk_norm=True, scale_heads=True",
               "inner_norm": "inner_norm=True", "scaled_cosine": "scaled_cosine=True"}
    cases = [(label, imports, f"Attention(16, num_heads=4{', ' + args if args else ''})")
             for label, args in options.items()]
    cases.append(("default, use_fsdpa=False", imports,
                  "(lambda m: (setattr(m, 'use_fsdpa', False), m)[1])(Attention(16, num_heads=4))"))
    return cases


def _timm_cases() -> list[tuple[str, str, str]]:
    imports = SHIM + "import timm, torch\nfrom timm.layers import Attention\n"
    slow = "(lambda m: (setattr(m, 'fused_attn', False), m)[1])"
    cases = []
    for label, args in {"default": "", "qkv_bias": "qkv_bias=True",
                        "qk_norm (LayerNorm)": "qk_norm=True, norm_layer=torch.nn.LayerNorm",
                        "qk_norm (RmsNorm)": "qk_norm=True, norm_layer=timm.layers.RmsNorm",
                        "attn_head_dim=8": "attn_head_dim=8", "dim_out=12, no proj bias": "dim_out=12, proj_bias=False",
                        "scale_norm": "scale_norm=True, norm_layer=torch.nn.LayerNorm", "gated": "gated=True"}.items():
        module = f"Attention(16, num_heads=4{', ' + args if args else ''})"
        cases.append((f"{label} (SDPA)", imports, module))
        if label in ("qkv_bias", "qk_norm (LayerNorm)"):
            cases.append((f"{label} (own softmax)", imports, f"{slow}({module})"))
    # the attention of the vision transformers' blocks, built small from timm's registered models
    small = "embed_dim=16, depth=1, num_heads=4, img_size=32, patch_size=16, num_classes=0"
    for model in ("vit_tiny_patch16_224", "vit_base_patch16_clip_224", "vit_small_patch16_rope_224",
                  "deit_tiny_patch16_224", "vit_base_patch16_siglip_224", "vit_medium_patch16_reg4_gap_256",
                  "eva02_tiny_patch14_224", "vit_betwixt_patch16_rope_reg4_gap_256"):
        cases.append((f"{model}: blocks[0].attn", imports,
                      f"timm.create_model({model!r}, pretrained=False, {small}).blocks[0].attn"))
    return cases


def _torchtune_cases() -> list[tuple[str, str, str]]:
    imports = "import importlib\n"
    sizes = "vocab_size=64, num_layers=1, num_heads=4, num_kv_heads=2, embed_dim=16, max_seq_len=64"
    extra = {"gemma": ", head_dim=4"}
    cases = []
    for name in ("llama3", "llama3_1", "llama3_2", "qwen2", "qwen2_5", "mistral", "phi3", "gemma", "llama2"):
        args = sizes + extra.get(name, "") + ", intermediate_dim=32"
        if name == "phi3":
            args = args.replace("num_kv_heads=2, ", "num_kv_heads=4, ")
        builder = f"importlib.import_module('torchtune.models.{name}._component_builders').{name}"
        cases.append((f"{name} builder", imports, f"{builder}({args}).layers[0].attn"))
    direct = ("from torch import nn\nfrom torchtune.modules import MultiHeadAttention, RMSNorm, "
              "RotaryPositionalEmbeddings\n")
    cases.append(("MultiHeadAttention, q/k RMSNorm, rotary", direct,
                  "MultiHeadAttention(embed_dim=16, num_heads=4, num_kv_heads=2, head_dim=4, q_proj=nn.Linear(16, 16), "
                  "k_proj=nn.Linear(16, 8), v_proj=nn.Linear(16, 8), output_proj=nn.Linear(16, 16), "
                  "q_norm=RMSNorm(4), k_norm=RMSNorm(4), pos_embeddings=RotaryPositionalEmbeddings(4), "
                  "max_seq_len=64)"))
    return cases


def _x_transformers_cases() -> list[tuple[str, str, str]]:
    imports = "from x_transformers import Attention\n"
    options = {"default": "", "kv_heads=2": "kv_heads=2", "one_kv_head": "one_kv_head=True",
               "value_dim_head=6": "value_dim_head=6", "num_mem_kv=2": "num_mem_kv=2", "head_scale": "head_scale=True",
               "add_zero_kv": "add_zero_kv=True", "kv_heads=2, num_mem_kv=2, head_scale": "kv_heads=2, num_mem_kv=2, "
               "head_scale=True", "causal": "causal=True", "talking heads": "pre_talking_heads=True, "
               "post_talking_heads=True", "softclamp_logits": "softclamp_logits=True", "qk_norm": "qk_norm=True",
               "gate_value_heads": "gate_value_heads=True", "sparse_topk=2": "sparse_topk=2"}
    return [(label, imports, f"Attention(16, heads=4, dim_head=4{', ' + args if args else ''})")
            for label, args in options.items()]


CASES = {"litgpt": _litgpt_cases, "diffusers": _diffusers_cases, "open_clip": _open_clip_cases, "timm": _timm_cases,
         "torchtune": _torchtune_cases, "x_transformers": _x_transformers_cases}
#: the import that says whether the library is there
IMPORTS = {"litgpt": "litgpt.model", "diffusers": "diffusers.models.attention_processor", "open_clip": "open_clip",
           "timm": "timm", "torchtune": "torchtune.modules", "x_transformers": "x_transformers"}


def setup(library: str, imports: str, expression: str) -> str:
    """The lines that rebuild the audited module and its spec in a fresh interpreter (the top of every repro)."""
    return (f"{imports}from typed_transformer.audit import library_spec\n"
            f"from typed_transformer.strategies import randomize_parameters\n"
            f"module = randomize_parameters({expression}, 0)\n"
            f"spec = library_spec(module, {library!r})")


def audit_case(library: str, label: str, imports: str, expression: str, max_examples: int = 4,
               dtypes: tuple[str, ...] = ("float32", "float64")) -> dict[str, Any]:
    import torch

    from typed_transformer.audit import AuditUsageError, audit_module

    torch.set_num_threads(1)
    row: dict[str, Any] = {"label": label, "expression": expression}
    lines = setup(library, imports, expression)
    namespace: dict[str, Any] = {}
    try:
        exec(lines.rsplit("\nspec = ", 1)[0], namespace)
    except Exception as err:
        row["unbuildable"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
        return row
    module = namespace["module"]
    row["cls"] = f"{type(module).__module__}.{type(module).__qualname__}"
    start = time.perf_counter()
    try:
        report = audit_module(module, library, max_examples=max_examples, seed=0, setup=lines,
                              dtypes=[getattr(torch, d) for d in dtypes])
    except AuditUsageError as err:
        row["refused"] = str(err).split(": ", 1)[-1].split(". The reference")[0]
        return row
    row["statuses"] = {r.name: report.status(r.name) for r in report.results}
    row["fails"] = [{"check": r.name, "dtype": r.dtype, "message": r.message.splitlines()[0][:220],
                     "repro": r.repro or ""} for r in report.results if r.status == "FAIL"]
    row["causes"] = [(c.diagnosis or c.summary).splitlines()[0][:300] for c in report.causes]
    row["seconds"] = time.perf_counter() - start
    return row


def _fresh(library: str, label: str, dtypes: str) -> dict[str, Any]:
    """The case audited again, alone, in a fresh interpreter."""
    out = subprocess.run([sys.executable, __file__, library, "--case", label, "--dtypes", dtypes], capture_output=True,
                         text=True, check=False, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"fails": []}


def page(library: str, version: str, rows: list[dict[str, Any]], seconds: float, note: str,
         dtypes: str = "float32 and float64") -> tuple[str, str]:
    audited = [r for r in rows if "statuses" in r]
    clean = [r for r in audited if not r["fails"]]
    refused = [r for r in rows if "refused" in r]
    unbuildable = [r for r in rows if "unbuildable" in r]
    fails = sum(len(r["fails"]) for r in audited)
    failing = [r for r in audited if r["fails"]]
    counts = (f"counts: {len(rows)} modules built, {len(audited)} audited with zero lines of spec, {len(clean)} pass "
              f"every check; FAILs (true behaviours, confirmed in a fresh interpreter): {fails} in {len(failing)} "
              f"modules; refused by name (options the reference does not model): {len(refused)}; not buildable: "
              f"{len(unbuildable)}")
    checks = list(dict.fromkeys(name for r in audited for name in r["statuses"]))
    lines = [f"# {library}: attention modules audited with zero lines of spec", "",
             f"<!-- generated by benchmarks/audit_library_sweep.py {library}; do not edit by hand -->", "",
             f"`{library}` {version}. {note} Each module's parameters are randomized (seed 0) and audited with "
             f"`audit_module(module, {library!r})` ({dtypes}, 4 examples per check, seed 0): the spec is "
             f"read from the module; an option it does not model is refused by name before any check runs. Every "
             f"FAIL was re-audited in a fresh interpreter. The sweep took {seconds:.0f} s.", "",
             counts, ""]
    if audited:
        lines += ["Status letters, in order: " + ", ".join(f"`{c}`" for c in checks) + " (P pass, F fail, S skip).",
                  "", "| module | class | checks | FAILs |", "|---|---|---|---|"]
        for r in audited:
            letters = "".join(r["statuses"].get(c, "-")[0] for c in checks)
            failed = ", ".join(dict.fromkeys(f"{f['check']} ({f['dtype']})" for f in r["fails"])) or "none"
            lines.append(f"| {r['label']} | `{r['cls'].split('.')[-1]}` | `{letters}` | {failed} |")
    if failing:
        lines += ["", "## FAILs: true behaviours of the module", "",
                  "Each is a behaviour of the library's code on this input, confirmed in a fresh interpreter; "
                  "[audit-findings.md](audit-findings.md) explains the ones it lists.", ""]
        for r in failing:
            lines += [f"### {r['label']}", ""]
            lines += [f"- `{f['check']}` ({f['dtype']}): {f['message']}" for f in r["fails"]]
            if r.get("causes"):
                lines += [f"- diagnosis: {c}" for c in r["causes"]]
            first = r["fails"][0]
            if first["repro"]:
                where = "the audit-test extra" if library == "diffusers" else "benchmarks/library_envs.sh"
                skip = ([f'<!-- skip: next "{library} is not in the test environment: {where} installs it" -->']
                        if library in ("diffusers", "litgpt", "open_clip", "timm") else [])
                lines += ["", f"The repro of `{first['check']}`:", "", *skip, "```python", first["repro"], "```"]
            lines.append("")
    if refused:
        lines += ["", "## Refused by name: the reference does not model these options", "",
                  "| module | what the spec does not model |", "|---|---|"]
        lines += [f"| {r['label']} | {r['refused'].replace('|', '/')} |" for r in refused]
    if unbuildable:
        lines += ["", "## Not buildable here", "", "| module | error |", "|---|---|"]
        lines += [f"| {r['label']} | {r['unbuildable'].replace('|', '/')} |" for r in unbuildable]
    return "\n".join(lines) + "\n", counts


NOTES = {
    "litgpt": "Every named config of `litgpt.Config`, shrunk (hidden 32, 4 heads of 8, 1, 2 or 4 key/value groups as "
              "the config groups them, a window of 3 keys where it has one), one `CausalSelfAttention` per distinct "
              "set of the options its attention reads; called with litgpt's own rope cache (`GPT.rope_cache`) and "
              "decoded token by token through its KV cache (`build_kv_cache`). Run in `.venv-litgpt`.",
    "diffusers": "`Attention` (16 wide, 4 heads of 4) over its options, with the default `AttnProcessor2_0` and, for "
                 "some, `AttnProcessor` and `SlicedAttnProcessor`; self-attention, and cross-attention over a "
                 "12-wide memory. Masks go in as `(b, t, s)` (or `((b h), t, s)` per head) additive masks.",
    "open_clip": "`open_clip.transformer.Attention` (16 wide, 4 heads) over its options; open_clip imported through "
                 "the torchvision shim (`import_without_torchvision()`: the registry's torchvision is a CUDA build "
                 "that breaks on this CPU torch; attention never uses it).",
    "timm": "`timm.layers.Attention` (16 wide, 4 heads) over its options, with SDPA and with its own softmax "
            "(`fused_attn=False`), and the attention of the first block of several registered vision transformers "
            "built small (`timm.create_model(name, embed_dim=16, depth=1, num_heads=4, img_size=32, ...)`); timm "
            "imported through the torchvision shim (`import_without_torchvision()`: the registry's torchvision is a "
            "CUDA build that breaks `import timm` on this CPU torch; attention never uses it).",
    "torchtune": "The attention of the first layer of torchtune's model builders (`_component_builders`, 16 wide, "
                 "4 heads on 2 key/value heads), and a `MultiHeadAttention` with q/k norms; decoded token by token "
                 "through its KV cache (`setup_cache`).",
    "x_transformers": "`x_transformers.Attention` (16 wide, 4 heads of 4) over its options; every option the spec "
                      "does not model is found by comparing the module with a default `Attention` of its shape.",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", choices=sorted(CASES))
    parser.add_argument("--print", action="store_true", help="print the page instead of writing it")
    parser.add_argument("--case", default=None, help="audit one case and print its row as JSON (fresh interpreter)")
    parser.add_argument("--dtypes", default="float32,float64", help="comma-separated dtypes (default both)")
    args = parser.parse_args()
    import importlib

    sys.path.insert(0, str(ROOT / "src"))
    if args.library in ("timm", "open_clip"):
        from typed_transformer.audit import import_without_torchvision

        import_without_torchvision()
    try:
        importlib.import_module(IMPORTS[args.library])
    except Exception as err:
        print(f"{args.library} does not import here: {type(err).__name__}: {err}")
        return 1
    cases = CASES[args.library]()
    if args.case is not None:
        case = next(c for c in cases if c[0] == args.case)
        print(json.dumps(audit_case(args.library, *case, dtypes=tuple(args.dtypes.split(",")))))
        return 0
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    from typed_transformer.audit.specs.libraries import library_version

    version = library_version(args.library) or "?"

    def write(done: list[dict[str, Any]], final: bool) -> tuple[str, str]:
        note = NOTES[args.library] + ("" if final else f" (Partial: {len(done)} of {len(cases)} cases so far.)")
        text, counts = page(args.library, version, done, time.perf_counter() - start, note,
                            args.dtypes.replace(",", " and "))
        if not args.print:
            (ROOT / "docs" / f"audit-{args.library.replace('_', '-')}-sweep.md").write_text(text, encoding="utf-8")
        return text, counts

    for case in cases:
        row = audit_case(args.library, *case, dtypes=tuple(args.dtypes.split(",")))
        if row.get("fails"):  # only what comes back alone, in a fresh interpreter, is counted
            again = _fresh(args.library, row["label"], args.dtypes).get("fails", [])
            confirmed = {(f["check"], f["dtype"]) for f in again}
            row["fails"] = [f for f in row["fails"] if (f["check"], f["dtype"]) in confirmed]
        status = (row.get("unbuildable") or ("refused: " + row["refused"] if "refused" in row else None)
                  or ("PASS" if not row["fails"] else "FAIL " + ", ".join(f"{f['check']}/{f['dtype']}"
                                                                         for f in row["fails"])))
        print(f"{row['label']:<48} {status[:150]}", flush=True)
        rows.append(row)
        if not args.print:  # the page so far, rewritten after each module (a long sweep stopped early keeps it)
            write(rows, final=False)
    text, counts = write(rows, final=True)
    print(text if args.print else f"wrote docs/audit-{args.library.replace('_', '-')}-sweep.md")
    print(counts, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
