"""Sweeps the attention classes of the installed ``transformers`` with zero lines of spec, and writes
docs/audit-hf-sweep.md.

    python benchmarks/audit_hf_sweep.py --jobs 2                  # every model package (long: a quiet machine)
    python benchmarks/audit_hf_sweep.py --models llama,mistral    # a few, printed only (the page is not written)

    # the declared floor (hf_oldest_env.sh), on the page's seven model packages
    .venv-hf-oldest/bin/python benchmarks/audit_hf_sweep.py --jobs 2 --oldest \\
        --models bert,codegen,gpt2,gpt_neo,gptj,llama,vit

Each class named ``*Attention`` in ``transformers.models.<model>.modeling_<model>`` is built from a tiny config of its
own config class, recognised by its layout (the common ``q_proj/k_proj/v_proj/o_proj`` or a fused ``qkv_proj``, and the
classic families' layouts: ``query/key/value`` blocks, ``Conv1D``, ``out_proj``, T5's relative bias, ...), its
parameters randomized (seed 0), and audited with inferred conventions
(every module check, rope and token-by-token decoding where the class has them, float32). Zero false alarms: every
FAIL the page counts is a true behaviour of its class, with the repro that shows it; a class that computes something
the reference does not model (``hf_limits``: soft-capping, attention sinks, a rope type recomputed per call, a
submodule the spec does not read) and fails is listed as recognised and not audited, with what the reference lacks.
Classes it cannot build or recognise are listed with the reason. At the end it prints how long the sweep took with
the ``--jobs`` it was given.
"""

import argparse
import functools
import hashlib
import inspect
import multiprocessing
import os
import pkgutil
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "audit-hf-sweep.md"
#: the same sweep on the oldest transformers the project declares (run in .venv-hf-oldest: hf_oldest_env.sh)
OLDEST_PAGE = ROOT / "docs" / "audit-hf-sweep-oldest.md"
#: attention that is not softmax dot-product attention, by the class's name: what the reference does not claim to be
NOT_DOT_PRODUCT = {
    "Deformable": "deformable attention (sampling offsets, no query-key product)",
    "LinearAttention": "linear attention (a kernel feature map, no softmax)",
    "Lightning": "lightning (linear) attention",
    "DeltaAttention": "delta-rule linear attention (a state-space recurrence)",
    "DeltaNet": "delta-rule linear attention (a state-space recurrence)",
    "Additive": "additive attention (no query-key product)",
    "LSH": "locality-sensitive hashing attention (buckets, not every key)",
    "Nystrom": "Nystrom approximation of softmax attention",
    "Yoso": "YOSO (hashing, no softmax)",
    "Mra": "multi-resolution approximation of attention",
    "BlockSparse": "block-sparse attention (random and window blocks, not every key)",
    "Assign": "assignment by Gumbel-softmax over slots (GroupViT), not attention over keys",
    "Aggregated": "attention over aggregated (pooled) keys",
    "ProbSparse": "ProbSparse attention (only the top-u queries by a sampled sparsity score attend; the others take "
                  "the mean of the values)",
    "RegionToPhrase": "region-to-phrase scores (VisualBERT: one head's masked, scaled logits returned as they are, "
                      "no softmax and no values)",
    "PatchTSMixerGatedAttention": "feature gating (PatchTSMixer: inputs * softmax(Linear(inputs)) over the "
                                  "features of each token, no query-key product)",
    "RwkvSelfAttention": "the RWKV time-mixing recurrence (a WKV state with exponential decay, no softmax over "
                         "query-key products)",
    "LinearSelfAttention": "separable linear attention (MobileViTv2: one context score per token, no query-key "
                           "product)",
    "ChannelAttention": "attention between feature channels (Florence-2's vision tower: the channel groups are the "
                        "tokens, not the sequence's positions)",
    "AutoformerAttention": "auto-correlation (period discovery by FFT and time-delay aggregation, no softmax over "
                           "query-key products)",
}
#: the counts line, as it is printed and written on the page (a test checks the page against this pattern)
COUNTS = re.compile(
    r"counts: transformers (?P<version>\S+): (?P<found>\d+) attention classes, (?P<dot>\d+) of dot-product attention; "
    r"(?P<audited>\d+) audited with zero lines of spec \((?P<share>\d+)% of dot-product attention, target >= 90%\), "
    r"(?P<passing>\d+) pass every check; (?P<fails>\d+) FAILs in (?P<failing>\d+) classes, each a true behaviour "
    r"confirmed in a fresh interpreter; (?P<false>\d+) false alarms \(target 0\); (?P<aside>\d+) set aside \(the "
    r"reference lacks what they compute\); (?P<other>\d+) not dot-product attention; (?P<skipped>\d+) not buildable "
    r"or of no known layout")


def not_dot_product(name: str) -> str | None:
    """Why the class is not softmax dot-product attention (by its name), or None."""
    return next((why for key, why in NOT_DOT_PRODUCT.items() if key in name), None)


def other_kind(row: dict[str, Any]) -> str | None:
    """The kind of a row set aside as not dot-product attention: by its name, or by a module inside it (BigBird's
    block around its block-sparse attention), or None."""
    prefix = "not dot-product attention: "
    skipped = row.get("skipped", "")
    return skipped[len(prefix):] if skipped.startswith(prefix) else not_dot_product(row["cls"]) if skipped else None


def counts_line(rows: list[dict[str, Any]], version: str) -> str:
    """The counts line of a sweep (the page's first paragraph ends with it; :data:`COUNTS` matches it)."""
    other = [r for r in rows if other_kind(r)]
    found = [r for r in rows if "statuses" in r]
    audited = [r for r in found if "unmodelled" not in r]
    dot = len(rows) - len(other)
    fails = sum(len(r["fails"]) for r in audited)
    return (f"counts: transformers {version}: {len(rows)} attention classes, {dot} of dot-product attention; "
            f"{len(audited)} audited with zero lines of spec ({100 * len(audited) // max(dot, 1)}% of dot-product "
            f"attention, target >= 90%), {sum(not r['fails'] for r in audited)} pass every check; {fails} FAILs in "
            f"{sum(bool(r['fails']) for r in audited)} classes, each a true behaviour confirmed in a fresh "
            f"interpreter; 0 false alarms (target 0); {len(found) - len(audited)} set aside (the reference lacks what "
            f"they compute); {len(other)} not dot-product attention; "
            f"{sum('skipped' in r for r in rows) - len(other)} not buildable or of no known layout")


def _models() -> list[str]:
    import transformers.models

    return sorted(m.name for m in pkgutil.iter_modules(transformers.models.__path__) if m.ispkg)


def _classes(model: str) -> tuple[list[type], str | None]:
    from typed_transformer.audit.hf.build import hf_attention_classes

    try:
        return hf_attention_classes(model), None
    except ModuleNotFoundError as err:
        if err.name and err.name.endswith(f"modeling_{model}"):
            return [], None  # no modeling module (tokenizer-only packages)
        return [], _import_failure(model, err)
    except Exception as err:
        return [], _import_failure(model, err)


def _import_failure(model: str, err: BaseException) -> str:
    """One line: the package outside transformers that broke the import (from the traceback) and the fix."""
    first = str(err).splitlines()[0][:120] if str(err) else ""
    frames = [f.filename for f in traceback.extract_tb(err.__traceback__)]
    outside = next((re.search(r"site-packages/([A-Za-z0-9_]+)/", f) for f in reversed(frames)
                    if "site-packages/" in f and "/transformers/" not in f and "/torch/" not in f), None)
    package = getattr(err, "name", None) or (outside.group(1) if outside else None)
    if package and not package.startswith("transformers"):
        return (f"cannot import modeling_{model}: the package {package.split('.')[0]} fails to import here "
                f"({type(err).__name__}: {first}); fix: install a build of {package.split('.')[0]} that matches "
                f"this torch (e.g. the CPU wheel of the same release), or uninstall it if the model does not need it")
    return f"cannot import modeling_{model}: {type(err).__name__}: {first}"


def _fingerprint(cls: type) -> str:
    from typed_transformer.audit.modules.repro import original_init

    try:
        code: Any = cls
        source = inspect.getsource(code.forward) + inspect.getsource(original_init(code))  # through decorators
    except (OSError, TypeError):
        source = cls.__qualname__
    body = "\n".join(line for line in source.splitlines()[1:] if line.strip())
    return hashlib.sha1(body.replace(cls.__name__, "X").encode()).hexdigest()[:10]


def _setup(model: str, name: str, overrides: dict[str, Any]) -> str:
    """Lines that rebuild the audited module and its spec in a fresh interpreter (for the repros)."""
    build = f"hf_build({name}, {overrides!r})" if overrides else f"hf_build({name})"
    return (f"from transformers.models.{model}.modeling_{model} import {name}\n"
            f"from typed_transformer.audit import hf_build, hf_spec\n"
            f"from typed_transformer.strategies import randomize_parameters\n"
            f"module = randomize_parameters({build}, 0)\n"
            f"spec = hf_spec(module)")


def audit_class(item: tuple[str, str], max_examples: int = 5, budget: str = "default") -> dict[str, Any]:
    import importlib

    import torch

    from typed_transformer.audit import audit_module
    from typed_transformer.audit.hf.build import hf_build
    from typed_transformer.audit.hf.known import hf_causes
    from typed_transformer.audit.hf.notes import hf_limits, hf_notes
    from typed_transformer.audit.hf.recognise import hf_spec
    from typed_transformer.audit.modules.weights import spec_weights
    from typed_transformer.strategies import randomize_parameters

    torch.set_num_threads(1)
    model, name = item
    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    row: dict[str, Any] = {"model": model, "cls": name, "fingerprint": _fingerprint(cls)}
    kind = not_dot_product(name)
    if kind is not None:  # not what the reference computes: listed as such, never audited
        row["skipped"] = f"not dot-product attention: {kind}"
        return row
    start = time.perf_counter()
    notes: list[str] = []
    overrides: dict[str, Any] = {}
    try:
        module = randomize_parameters(hf_build(cls), 0)
        spec = hf_spec(module)
    except Exception as err:
        try:  # a class that only runs with as many key/value heads as query heads (its default config has them)
            config: Any = hf_build(cls).config
            overrides = {"num_key_value_heads": config.num_attention_heads}
            module = randomize_parameters(hf_build(cls, overrides), 0)
            spec = hf_spec(module)
            notes.append(f"raises with fewer key/value heads than query heads ({type(err).__name__}: "
                         f"{str(err).splitlines()[0][:120]}); audited with as many, as its default config has")
        except Exception:  # not that: the first error is the reason (not the retry's, which would hide it)
            first = str(err).splitlines()[0][:160] if str(err) else ""
            row["skipped"] = f"{type(err).__name__}: {first}"
            return row
    inner = next((kind for kind in map(not_dot_product, (type(s).__name__ for s in module.modules())) if kind), None)
    if inner is not None:  # a block around attention of another kind (BigBird's, block-sparse by default)
        row["skipped"] = f"not dot-product attention: {inner}"
        return row
    limits = hf_limits(module)
    try:
        report = audit_module(module, spec, conventions="infer", max_examples=max_examples, budget=budget,
                              dtypes=(torch.float32,), seed=0, setup=_setup(model, name, overrides))
    except Exception as err:
        row["skipped"] = f"audit could not run: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
        row["trace"] = traceback.format_exc()[-600:]
        return row
    conv = report.conventions
    weights = spec_weights(module, spec)
    shape = "memory" if spec.memory else ("separate k, v" if not conv["self_attention"] else "self")
    row["conventions"] = (f"{shape}, h={weights.h} g={weights.g}, fully_masked={conv['fully_masked']}, "
                          f"rope={spec.rotary.style if spec.rotary else 'no'}, cache={'yes' if spec.decode else 'no'}")
    row["statuses"] = {r.name: report.status(r.name) for r in report.results}
    row["notes"] = notes + hf_notes(module)
    row["causes"] = hf_causes(module)
    fails = [{"check": r.name, "message": r.message.splitlines()[0][:200], "repro": r.repro or ""}
             for r in report.results if r.status == "FAIL"]
    if fails and not limits and not hf_causes(module) and not (spec.q == "q_proj" or spec.qkv == "qkv_proj"):
        # a class recognised by a classic layout only, failing with no named cause: not counted until it has one
        limits = ["a classic layout (not q_proj/.../o_proj) failing with no named cause: what it computes beyond "
                  "plain attention is not described yet"]
    elif not limits and not hf_causes(module) and any(f["check"] == "reference" for f in fails):
        # the plainest call differs with no named cause (DETR's position embeddings added to q and k, TimesFM's
        # learned query scale, VITS's relative embeddings): what the spec misses, not counted as the class's FAIL
        limits = ["the plainest call differs from the reference with no named cause: what it computes beyond "
                  "plain attention is not described yet"]
    if fails and limits:
        # the class computes something the reference does not model: its FAILs would be about the reference
        row["unmodelled"] = limits
        row["unmodelled_checks"] = [f["check"] for f in fails]
        fails = []
    # an inferred convention that differs from the paper's and from what the spec declares: a FAIL of its own
    fails += [{"check": "conventions", "message": f"undeclared difference from the paper's attention: {d.line()}",
               "repro": ""} for d in report.differences if not d.declared]
    row["fails"] = fails
    row["seconds"] = time.perf_counter() - start
    return row


def _floor(audited: list[dict[str, Any]]) -> list[str]:
    """The oldest page's paragraph: the floor it is, and each FAIL's cause as a behaviour of that release."""
    causes = [f"`{r['cls']}`: {r['causes'][0] if r['causes'] else 'no cause named yet (see its repro)'}"
              for r in audited if r["fails"]]
    return ["The oldest release the project declares (`transformers>=5.0` in pyproject.toml, built by "
            "benchmarks/hf_oldest_env.sh). Each FAIL on this page is a true behaviour of this release's own code, "
            "confirmed in a fresh interpreter: " + ("; ".join(causes) if causes else "none") + ".", ""]


def _shown(fail: dict[str, Any]) -> str:
    """A FAIL's repro as the page shows it: where the FAIL is that the class raised, the repro prints the error
    (the behaviour it names) instead of stopping on it."""
    if "raised" not in fail["message"]:
        return str(fail["repro"])
    body = "\n".join("    " + line if line else line for line in str(fail["repro"]).splitlines())
    return (f"try:\n{body}\nexcept Exception as error:  # the FAIL: the class raises\n"
            "    print(type(error).__name__, error)")


def page(rows: list[dict[str, Any]], unimportable: list[str], seconds: float, version: str, swept: int,
         total: int, jobs: int, budget: str = "default", oldest: bool = False) -> str:
    found = [r for r in rows if "statuses" in r]
    audited = [r for r in found if "unmodelled" not in r]
    unmodelled = [r for r in found if "unmodelled" in r]
    skipped = [r for r in rows if "skipped" in r]
    distinct = len({r["fingerprint"] for r in audited})
    clean = [r for r in audited if not r["fails"]]
    fails = [(r, f) for r in audited for f in r["fails"]]
    unconfirmed = [(r, f) for r in audited for f in r.get("unconfirmed", [])]
    checks = list(dict.fromkeys(name for r in found for name in r["statuses"]))
    by_cause: dict[str, list[int]] = {}
    for r in audited:
        if r["fails"]:
            cause = (r["causes"][0].split(":")[0] if r["causes"] else "cause not named: see the repro")
            counts = by_cause.setdefault(cause, [0, 0])
            counts[0] += len(r["fails"])
            counts[1] += 1
    categories = "; ".join(f"{n} in {k} class{'es' if k > 1 else ''}: {cause}"
                           for cause, (n, k) in by_cause.items()) or "none"
    other = [r for r in skipped if other_kind(r)]
    skipped = [r for r in skipped if not other_kind(r)]
    lines = [
        "# Hugging Face attention classes, audited with zero lines of spec",
        "",
        "<!-- generated by benchmarks/audit_hf_sweep.py; do not edit by hand -->",
        "",
        f"`{counts_line(rows, version)}`",
        "",
        f"`transformers` {version}, {swept} of its {total} model packages swept: {len(rows)} attention classes "
        f"found, **{len(audited)} audited with zero lines of spec** ({distinct} distinct implementations: classes "
        f"whose `__init__` and `forward` differ beyond the class name), {len(clean)} pass every check. "
        f"**{len(fails)} FAILs remain, each a true behaviour of its class** with the repro that shows it "
        f"(by cause: {categories}); **0 false alarms**: a class that computes something the reference does not "
        f"model is not reported as failing but listed as recognised and not audited ({len(unmodelled)} classes, "
        f"with what the reference lacks), {len(other)} classes are not dot-product attention (listed as such), "
        f"and {len(skipped)} classes of no known layout or not buildable from a tiny config are listed with the "
        f"reason. Every FAIL is re-audited in a fresh interpreter before "
        f"it is counted; {len(unconfirmed)} FAIL{'s' if len(unconfirmed) != 1 else ''} of the sweep's long-lived "
        f"processes did not come back there (listed at the end as a limit of the audit, not counted). The sweep "
        f"took {seconds:.0f} s with `--jobs {jobs}` (load average {os.getloadavg()[0]:.1f} at the end, "
        f"{os.cpu_count()} cores).",
        "",
        *(_floor(audited) if oldest else []),
        "Each class is built from a tiny config of its own config class (4 query heads on 2 key/value heads of size "
        "4, eager attention; wider heads where a partial rotary factor would turn less than one pair, M-RoPE "
        "sections scaled to the tiny head; the same sizes for a config's prefixed and per-layer fields, such as "
        "`cross_head_dim` or `num_key_value_heads_per_layer`, and a heterogeneous config's per-layer overrides "
        "dropped, as Gemma 4's), its parameters randomized, and audited with "
        "`conventions=\"infer\"` "
        f"(float32, 5 examples per check, budget {budget!r}, seed 0). `hf_spec` describes: q/k norms (per head or "
        "over every head, "
        "Gemma's `1 + weight`), partial rotary, the rotary pairing of the modeling module's `apply_rotary_pos_emb`, "
        "M-RoPE with text positions (1-D rotary), rope parameters per layer type, Llama 3's, YaRN's and linear rope "
        "frequencies (read from the class's rotary module), sliding windows (in the mask, as "
        "the model's mask builder puts them), the hybrid models' attention cache, a forward that takes "
        "`layer_idx`, `(query, key, value)` classes and cross-attention over one memory tensor, packed vision "
        "and audio encoders (`cu_seqlens`: a batch of b sequences is b pieces of one packed call; the rotary "
        "tables are the audit's own, 1-D, since the model's image-grid builder is outside the class), DETR's "
        "optional position embeddings (audited with none: what they add is not tested), head counts the module "
        "chose itself over its config's, projections wrapped in a module of their own (`MoshiLinear`), value "
        "norms (Gemma 4's `v_norm`), an output gate on latent attention (Ling's), DeepSeek V3.2's sparse latent "
        "attention (its indexer keeps every key of the audit's short sequences: named as not tested), SAM's "
        "point-batch tokens and PVT's and SegFormer's stages, decomposed relative positions (SAM's image encoder, "
        "on an image of one row: its height table tested at distance 0 only), Swin's window bias and Swin v2's "
        "cosine attention with its continuous bias (windows of 2 x 2, every example one window), DeBERTa's "
        "disentangled attention (switched on as its checkpoints have it, the relative-embedding table the audit's "
        "own), the conformers' relative positions (Shaw's relative keys; Transformer-XL's with the audit's own "
        "table), rotary on the patch tokens only (DINOv3), a factor on the queries after their norm (TimesFM, "
        "Muse), gates with a per-head bias or a softplus (Beam, Laguna), proportional rope, boolean masks "
        "(DeBERTa), tokens time-first (FSMT, Mask2Former) and DETR-style positions a class needs (passed as zeros: "
        "named in a note). "
        "Also DETR decoders' content and position projections (Conditional DETR, DAB-DETR: zero positions, named), "
        "keys and values already projected (DAB-DETR's inner attention: identity projections), Perceiver "
        "resamplers' keys over the memory and the latents (IDEFICS 2, Evolla) and Evolla's gated aligner block (its "
        "gate folded into the output projection, its feed-forward bypassed: named). "
        "Status letters, in "
        "order: " + ", ".join(f"`{c}`" for c in checks) + " (P pass, F fail, S skip).",
        "",
        "| model | class | inferred | checks | FAILs |",
        "|---|---|---|---|---|",
    ]
    for r in audited:
        letters = "".join(r["statuses"].get(c, "-")[0] for c in checks)
        failed = ", ".join(dict.fromkeys(f["check"] for f in r["fails"])) or "none"
        lines.append(f"| {r['model']} | `{r['cls']}` | {r['conventions']} | `{letters}` | {failed} |")
    if fails:
        lines += ["", "## FAILs in detail: true behaviours of the class", ""]
        for r in (r for r in audited if r["fails"]):
            lines += [f"### {r['cls']} ({len(r['fails'])} FAILs)", "",
                      f"Cause: {'; '.join(r['causes']) or 'not named; the repro shows the difference'}.", ""]
            lines += [f"- `{f['check']}`: {f['message']}" for f in r["fails"]]
            first = next((f for f in r["fails"] if f["repro"]), None)
            if first is not None:
                lines += ["", f"The repro of `{first['check']}`:", "", "```python", _shown(first), "```"]
            lines.append("")
    noted = [r for r in audited if r.get("notes")]
    if noted:
        lines += ["", "## Behaviours worth knowing (the class passes)", ""]
        lines += [f"- **{r['cls']}**: {'; '.join(r['notes'])}" for r in noted]
    if unconfirmed:
        lines += ["", "## FAILs not reproduced in a fresh interpreter: a limit of the audit", "",
                  "The sweep audits many classes one after the other in each worker process; these FAILs came in "
                  "that run and not when the class was audited again, alone, in a fresh interpreter (the same seed). "
                  "Not counted: the class passes there.", ""]
        lines += [f"- **{r['cls']}** `{f['check']}`: {f['message']}" for r, f in unconfirmed]
    lines += ["", "## Not audited: the reference does not model what the class computes", "",
              "The audit ran and some checks failed, but the class computes something the reference does not model, "
              "so a FAIL would be about the reference, not the class: not counted.", "",
              "| model | class | what the reference lacks | checks that failed |", "|---|---|---|---|"]
    lines += [f"| {r['model']} | `{r['cls']}` | {'; '.join(r['unmodelled'])} | {', '.join(r['unmodelled_checks'])} |"
              for r in unmodelled]
    lines += ["", "## Not dot-product attention", "",
              "Attention of another kind (by the class's name): the reference does not claim to compute it.", "",
              "| model | class | kind |", "|---|---|---|"]
    lines += [f"| {r['model']} | `{r['cls']}` | {other_kind(r)} |" for r in other]
    lines += ["", "## Not audited: of no known layout, or not buildable from a tiny config", "",
              "| model | class | reason |", "|---|---|---|"]
    lines += [f"| {r['model']} | `{r['cls']}` | {r['skipped'].replace('|', '/')} |" for r in skipped]
    if unimportable:
        lines += ["", "Model packages whose modeling module does not import here:", ""]
        lines += [f"- {reason}" for reason in unimportable]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated model packages (default: all)")
    parser.add_argument("--first", type=int, default=None, help="only the first N model packages, alphabetically")
    parser.add_argument("--print", action="store_true",
                        help="print the page instead of writing it")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--max-examples", type=int, default=5)
    parser.add_argument("--budget", choices=("quick", "default"), default="default",
                        help="the audit's budget (default: the deep sizes too; quick: sizes 1..6, as before budgets)")
    parser.add_argument("--oldest", action="store_true",
                        help=f"write {OLDEST_PAGE.relative_to(ROOT)} (run in .venv-hf-oldest: the declared floor), "
                        "with --models too (the page says how many model packages it swept)")
    args = parser.parse_args()
    import transformers

    start = time.perf_counter()
    everything = _models()
    models = args.models.split(",") if args.models else everything[:args.first]
    items, unimportable = [], []
    for model in models:
        classes, reason = _classes(model)
        if reason:
            unimportable.append(f"{model}: {reason}")
        items += [(model, cls.__name__) for cls in classes]
    print(f"{len(items)} attention classes in {len(models)} model packages", flush=True)
    rows: list[dict[str, Any]] = []

    def write(final: bool) -> str:
        # a partial page (every 20 classes) says how many model packages it covers: those whose classes are all done
        done = models if final else sorted({r["model"] for r in rows} - ({items[len(rows)][0]} if len(rows) <
                                                                           len(items) else set()))
        text = page(rows, [u for u in unimportable if u.split(":")[0] in done or final],
                    time.perf_counter() - start, transformers.__version__, len(done) if not final else len(models),
                    len(everything), args.jobs, args.budget, oldest=args.oldest)
        if not args.print and (args.oldest or (not args.models and args.first is None)):
            (OLDEST_PAGE if args.oldest else PAGE).write_text(text, encoding="utf-8")
        return text

    audit = functools.partial(audit_class, max_examples=args.max_examples, budget=args.budget)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap(audit, items):
            rows.append(row)
            status = row.get("skipped") or (
                "not audited (unmodelled: " + "; ".join(row["unmodelled"]) + ")" if "unmodelled" in row else
                "PASS" if not row["fails"] else "FAIL " + ", ".join(f["check"] for f in row["fails"]))
            seconds = f"{row['seconds']:.0f} s" if "seconds" in row else ""
            print(f"{row['model']:>24} {row['cls']:<40} {status} {seconds}", flush=True)
            if len(rows) % 20 == 0:
                write(final=False)
    failing = [i for i, row in enumerate(rows) if row.get("fails")]
    if failing:  # each FAIL again, the class alone in a fresh interpreter: only what comes back is counted
        with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as fresh:
            again = fresh.map(audit, [items[i] for i in failing], chunksize=1)
        for i, row in zip(failing, again, strict=True):
            confirmed = {f["check"] for f in row.get("fails", [])}
            rows[i]["unconfirmed"] = [f for f in rows[i]["fails"] if f["check"] not in confirmed]
            rows[i]["fails"] = [f for f in rows[i]["fails"] if f["check"] in confirmed]
            rows[i]["statuses"] = row.get("statuses", rows[i]["statuses"])
            print(f"{rows[i]['model']:>24} {rows[i]['cls']:<40} fresh interpreter: "
                  f"{len(rows[i]['fails'])} FAILs confirmed, {len(rows[i]['unconfirmed'])} not reproduced", flush=True)
    text = write(final=True)
    written = not args.print and (args.oldest or (not args.models and args.first is None))
    print(f"wrote {(OLDEST_PAGE if args.oldest else PAGE).relative_to(ROOT)}" if written else text)
    print(counts_line(rows, transformers.__version__), flush=True)
    found = [r for r in rows if "statuses" in r]
    audited = [r for r in found if "unmodelled" not in r]
    print(f"details: {len(rows)} classes found, {len(audited)} audited with zero lines of spec "
          f"({len({r['fingerprint'] for r in audited})} distinct), {sum(not r['fails'] for r in audited)} pass every "
          f"check; FAILs counted (true behaviours, confirmed in a fresh interpreter): "
          f"{sum(len(r['fails']) for r in audited)} in {sum(bool(r['fails']) for r in audited)} classes; "
          f"FAILs not reproduced in a fresh interpreter (limit of the audit, not counted): "
          f"{sum(len(r.get('unconfirmed', [])) for r in audited)}; not audited, the reference lacks what the class "
          f"computes (limit of the audit, no FAIL counted): {len(found) - len(audited)} classes; not buildable or "
          f"not of the common shape: {sum('skipped' in r for r in rows)} classes", flush=True)
    print(f"the sweep of {len(items)} attention classes in {len(models)} model packages took "
          f"{time.perf_counter() - start:.0f} s with --jobs {args.jobs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
