"""Benchmarks that print ratios measured side by side in one process (a script, not library code).

Run from a checkout: ``python benchmarks/bench.py attention --size small``, ``python benchmarks/bench.py gpt`` or
``python benchmarks/bench.py checks`` (``--help`` lists the options). The package never imports this file.

``bench.py attention`` times our :class:`MultiHeadAttention` (shape checks on and off,
reference and sdpa paths) against ``torch.nn.MultiheadAttention`` with the same weights. Variants are
interleaved in rounds (in a freshly shuffled order each round, so that none always follows the same other
one) and each is reported by its median, so that machine noise hits all of them alike; the ratios are the
figures to read, not the absolute milliseconds. Each sample is one ``torch.utils.benchmark.Timer.timeit`` of
the variant at this process's thread count.
"""

import argparse
import functools
import math
import os
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.benchmark import Timer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks.baseline import BaselineGPT
from typed_transformer._install import install_hint
from typed_transformer.gpt import PRESETS
from typed_transformer.interop import from_torch
from typed_transformer.multihead import MultiHeadAttention
from typed_transformer.shapecheck import shape_checks
from typed_transformer.threads import settle_threads

__all__ = ["AttentionCase", "bench_attention", "bench_checks", "format_attention_table"]


@dataclass(frozen=True)
class AttentionCase:
    """One benchmark size: batch ``b``, sequence ``t``, width ``d_model``, heads ``h``."""

    name: str
    b: int
    t: int
    d_model: int
    h: int


#: The markers around the attention table in docs/lab/benchmarks.md (``--write``).
ATTENTION_MARKER = "<!-- attention-bench -->"
SMALL = AttentionCase("small", b=1, t=4, d_model=64, h=4)
TRAINING = AttentionCase("training", b=8, t=256, d_model=384, h=6)


@dataclass
class Row:
    case: AttentionCase
    variant: str
    mode: str
    median_ms: float
    ratio: float  # median time / torch's median time in the same case and mode


def _median_ms(fn: Callable[[], object], rounds: int, inner: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) * 1e3 / inner)
    return samples


class BareTorchAttention(nn.Module):
    """The same computation as bare torch calls, no module machinery and no checks: ``F.linear`` with torch's
    fused ``in_proj``, the heads as views, ``F.scaled_dot_product_attention``, ``F.linear`` out. What torch's own
    kernels cost for this math: the floor of any implementation built on them (the ``bare torch ops`` row)."""

    def __init__(self, reference: nn.MultiheadAttention) -> None:
        super().__init__()
        self.reference, self.h = reference, reference.num_heads

    def forward(self, x: Tensor) -> tuple[Tensor, None]:
        r = self.reference
        b, t, width = x.shape
        qkv = F.linear(x, r.in_proj_weight, r.in_proj_bias).view(b, t, 3, self.h, width // self.h)
        q, k, v = (part.transpose(1, 2) for part in qkv.unbind(2))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, width)
        return F.linear(out, r.out_proj.weight, r.out_proj.bias), None


def _variants(case: AttentionCase, x: Tensor) -> dict[str, tuple[nn.Module, Callable[[nn.Module], Tensor], bool]]:
    """name -> (module, call, checks on?)"""
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(case.d_model, case.h, batch_first=True)
    sdpa = from_torch(reference, backend="sdpa")
    einsum = from_torch(reference, backend="reference")
    bare = BareTorchAttention(reference)

    def call_torch(m: nn.Module) -> Tensor:
        out: Tensor = m(x, x, x, need_weights=False)[0]
        return out

    def call_ours(m: nn.Module) -> Tensor:
        out: Tensor = m(x)[0]
        return out

    return {
        "torch nn.MultiheadAttention": (reference, call_torch, True),
        "ours sdpa, checks on": (sdpa, call_ours, True),
        "ours sdpa, checks off": (sdpa, call_ours, False),
        "ours reference, checks on": (einsum, call_ours, True),
        "ours reference, checks off": (einsum, call_ours, False),
        "bare torch ops (the floor)": (bare, call_ours, False),
    }


def bench_attention(cases: list[AttentionCase] | None = None, *, seconds: float = 2.0) -> list[Row]:
    """Time forward (eval, no_grad) and forward+backward (train mode) for every variant and case.

    ``seconds`` is the rough time budget per case and mode, split over interleaved rounds.
    """
    rows: list[Row] = []
    for case in cases or [SMALL, TRAINING]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(case.b, case.t, case.d_model, generator=generator)
        variants = _variants(case, x)
        for mode in ("forward", "forward+backward"):
            def step(module: nn.Module, call: Callable[[nn.Module], Tensor], checks: bool,
                     mode: str = mode) -> None:
                with shape_checks(checks):
                    if mode == "forward":
                        module.eval()
                        with torch.no_grad():
                            call(module)
                    else:
                        module.train()
                        call(module).sum().backward()  # type: ignore[no-untyped-call]

            # Calibrate: how many calls fit in one round (a round is about 1/20 of the budget per variant).
            first = next(iter(variants.values()))
            for _ in range(3):
                step(*first)
            start = time.perf_counter()
            step(*first)
            once = max(time.perf_counter() - start, 1e-6)
            rounds = 25
            inner = max(1, int(seconds / (rounds * len(variants) * once)))
            samples: dict[str, list[float]] = {name: [] for name in variants}
            for variant in variants.values():  # warm-up
                for _ in range(2):
                    step(*variant)
            order = list(variants)
            shuffle = random.Random(0)
            for _ in range(rounds):
                shuffle.shuffle(order)  # no variant always runs right after the same other one
                for name in order:
                    module, call, checks = variants[name]
                    timer = Timer("fn()", globals={"fn": functools.partial(step, module, call, checks)},
                                  num_threads=torch.get_num_threads())  # Timer's default would be one thread
                    samples[name].append(timer.timeit(inner).mean * 1e3)
            base = statistics.median(samples["torch nn.MultiheadAttention"])
            for name in variants:
                median = statistics.median(samples[name])
                rows.append(Row(case, name, mode, median, median / base))
    return rows


def thread_probe(which: str) -> Callable[[], None]:
    """One step of benchmark ``which`` ("attention": torch's MultiheadAttention forward+backward at the training
    size; "gpt"/"checks": a baby-preset training step of the plain-torch baseline) for ``--threads auto`` to time
    at each thread count: both sides of every ratio then run at the count this machine runs fastest now."""
    torch.manual_seed(0)
    if which == "attention":
        case = TRAINING
        module = nn.MultiheadAttention(case.d_model, case.h, batch_first=True)
        x = torch.randn(case.b, case.t, case.d_model)

        def attention_step() -> None:
            module(x, x, x, need_weights=False)[0].sum().backward()

        return attention_step
    model = BaselineGPT(65, 64, 4, 4, 128, 0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(65, (12, 64))
    return functools.partial(_train_step, model, optimizer, ids, ids)


def format_attention_table(rows: list[Row]) -> str:
    lines = [
        f"torch {torch.__version__}, {_threads_phrase()}, load average {os.getloadavg()[0]:.2f} at "
        "the end; median of interleaved rounds; ratio = time / torch's time",
        "",
        f"{'size':<34} {'variant':<28} {'forward ms':>11} {'ratio':>6} {'fwd+bwd ms':>11} {'ratio':>6}",
    ]
    by_key = {(r.case.name, r.variant, r.mode): r for r in rows}
    seen: list[tuple[AttentionCase, str]] = []
    for r in rows:
        if (r.case, r.variant) not in seen:
            seen.append((r.case, r.variant))
    for case, variant in seen:
        f, fb = by_key[(case.name, variant, "forward")], by_key[(case.name, variant, "forward+backward")]
        size = f"{case.name} (b={case.b}, t={case.t}, d={case.d_model}, h={case.h})"
        lines.append(f"{size:<34} {variant:<28} {f.median_ms:>11.3f} {f.ratio:>5.2f}x "
                     f"{fb.median_ms:>11.3f} {fb.ratio:>5.2f}x")
    training = [r for r in rows if r.case.name == TRAINING.name]
    if training:
        def get(variant: str, mode: str) -> float:
            return by_key[(TRAINING.name, variant, mode)].median_ms

        lines.append("")
        for mode in ("forward", "forward+backward"):
            sdpa_ratio = get("ours sdpa, checks on", mode) / get("torch nn.MultiheadAttention", mode)
            overhead = get("ours sdpa, checks on", mode) / get("ours sdpa, checks off", mode)
            target = "0.80x" if mode == "forward+backward" else "1.10x"
            ours, theirs = get("ours sdpa, checks on", mode), get("torch nn.MultiheadAttention", mode)
            lines.append(f"training size, {mode:<16}: sdpa path with checks / torch = {sdpa_ratio:.3f}x "
                         f"({ours:.2f} ms / {theirs:.2f} ms; target <= {target}); checks on / off = {overhead:.3f}x "
                         "(target < 1.05x)")
        bare = get("bare torch ops (the floor)", "forward+backward")
        ours = get("ours sdpa, checks on", "forward+backward")
        theirs = get("torch nn.MultiheadAttention", "forward+backward")
        lines.append(f"training size, forward+backward, the floor: the same math as bare torch calls (F.linear, "
                     f"F.scaled_dot_product_attention) = {bare / theirs:.3f}x torch's module ({bare:.2f} ms / "
                     f"{theirs:.2f} ms); ours / bare = {ours / bare:.3f}x ({ours:.2f} ms / {bare:.2f} ms)")
    return "\n".join(lines)


def _threads_phrase() -> str:
    count = torch.get_num_threads()
    return f"{count} thread{'s' if count != 1 else ''}"


def readme_attention_line(rows: list[Row]) -> str:
    """README.md's line: forward+backward at the training size, ours (checks on) against torch's module."""
    by_variant = {r.variant: r for r in rows if r.case == TRAINING and r.mode == "forward+backward"}
    ours, theirs = by_variant["ours sdpa, checks on"], by_variant["torch nn.MultiheadAttention"]
    bare = by_variant["bare torch ops (the floor)"]
    c = TRAINING
    return (f"Attention: `MultiHeadAttention` forward+backward (shape checks on) takes {ours.ratio:.2f}x the time of "
            f"`torch.nn.MultiheadAttention` at b={c.b}, t={c.t}, d={c.d_model}, h={c.h} ({ours.median_ms:.1f} ms / "
            f"{theirs.median_ms:.1f} ms; target <= 0.80x), and the same math written as bare torch calls "
            f"{bare.ratio:.2f}x ({bare.median_ms:.1f} ms: the floor of torch's kernels here; "
            f"`python benchmarks/bench.py attention`, {_threads_phrase()}, load average {os.getloadavg()[0]:.2f}).")


# ----------------------------------------------------------------------------------------------------
# GPT: training step against a nanoGPT-style plain-torch baseline, and KV-cache generation
# ----------------------------------------------------------------------------------------------------


def _reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark (VmHWM) and return the current RSS in bytes (0 if unsupported)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return _proc_status_kib("VmRSS") * 1024
    except OSError:
        return 0


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _peak_rise_mib(baseline: int) -> float:
    if not baseline:
        return float("nan")
    return (_proc_status_kib("VmHWM") * 1024 - baseline) / 2**20


@dataclass
class GPTRow:
    what: str
    ours_ms: float
    baseline_ms: float
    ours_peak_mib: float
    baseline_peak_mib: float

    @property
    def ratio(self) -> float:
        return self.ours_ms / self.baseline_ms


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> None:
    out = model(x, y)
    loss: Tensor = out[1] if isinstance(out, tuple) else out  # GPT returns (logits, loss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _time_steps(models: dict[str, nn.Module], x: Tensor, y: Tensor, steps: int | None, seconds: float
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms per training step and peak RSS rise (MiB) per model.

    Single steps alternate between the models, in A B B A order so that a drift in the machine's speed
    weighs on both alike; ``steps`` per model, or as many as fit in about ``seconds`` (at least 4).
    """
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    warm: list[float] = []
    for name, model in models.items():  # warm-up
        for _ in range(2):
            warm += _median_ms(functools.partial(_train_step, model, optimizers[name], x, y), 1, 1)
    if steps is None:
        steps = max(4, min(200, round(seconds * 1e3 / (2 * statistics.median(warm)))))
    samples: dict[str, list[float]] = {name: [] for name in models}
    peaks: dict[str, float] = {}
    names = list(models)
    for i in range(steps):
        for name in names if i % 2 == 0 else reversed(names):
            base = _reset_peak_rss() if i == 0 else 0
            samples[name] += _median_ms(functools.partial(_train_step, models[name], optimizers[name], x, y), 1, 1)
            if i == 0:
                peaks[name] = _peak_rise_mib(base)
    return {name: statistics.median(v) for name, v in samples.items()}, peaks


def bench_gpt_training(presets: list[str], *, batch_size: int = 12, steps: int | None = None, seconds: float = 20.0,
                       vocab_size: int = 65) -> list[GPTRow]:
    """Median time of one training step (forward, backward, clip, AdamW) of our GPT (checks on) and the
    baseline at each preset, interleaved; peak RSS rise over each variant's first measured round."""
    from typed_transformer.gpt import GPT, GPTConfig

    rows = []
    for preset in presets:
        config = GPTConfig.preset(preset, vocab_size)
        torch.manual_seed(0)
        models: dict[str, nn.Module] = {
            "ours": GPT(config),
            "baseline": BaselineGPT(vocab_size, config.block_size, config.n_layer, config.n_head, config.n_embd,
                                    config.dropout),
        }
        generator = torch.Generator().manual_seed(0)
        x = torch.randint(vocab_size, (batch_size, config.block_size), generator=generator)
        y = torch.randint(vocab_size, (batch_size, config.block_size), generator=generator)
        ms, peaks = _time_steps(models, x, y, steps, seconds)
        rows.append(GPTRow(f"train step, {preset} preset (batch {batch_size}, block {config.block_size})",
                           ms["ours"], ms["baseline"], peaks["ours"], peaks["baseline"]))
    return rows


def bench_generation(*, new_tokens: int = 500, block_sizes: tuple[int, ...] = (64, 512), rounds: int = 5
                     ) -> list[GPTRow]:
    """500 new tokens from a one-token prompt with the KV cache ("ours") and without it ("baseline" column:
    the same model recomputing the cropped context every step), greedy, at the baby preset's sizes; and
    ``block_size - 1`` tokens at the baby preset, all of which fit in the context."""
    from typed_transformer.gpt import GPT, GPTConfig

    rows = []
    cases = [(block, new_tokens) for block in block_sizes]
    if 64 in block_sizes:
        cases.insert(block_sizes.index(64) + 1, (64, 63))
    for block, tokens in cases:
        torch.manual_seed(0)
        model = GPT(GPTConfig.preset("baby", 65, block_size=block)).eval()
        prompt = torch.zeros(1, 1, dtype=torch.long)
        samples: dict[bool, list[float]] = {True: [], False: []}
        peaks: dict[bool, float] = {}
        outputs = {}
        for r in range(rounds):
            for cache in (True, False) if r % 2 == 0 else (False, True):
                base = _reset_peak_rss() if r == 0 else 0
                start = time.perf_counter()
                outputs[cache] = model.generate(prompt, tokens, greedy=True, use_cache=cache)
                samples[cache].append((time.perf_counter() - start) * 1e3)
                if r == 0:
                    peaks[cache] = _peak_rise_mib(base)
        if not torch.equal(outputs[True], outputs[False]):
            raise AssertionError("cached and uncached generation differ")
        label = "baby preset" if block == 64 else f"baby preset with block_size {block}"
        rows.append(GPTRow(f"generate {tokens} tokens, {label}", statistics.median(samples[True]),
                           statistics.median(samples[False]), peaks[True], peaks[False]))
    return rows


def decode_step_costs(block_size: int = 64, *, repeats: int = 200) -> tuple[float, float]:
    """Milliseconds of one cached one-token step (with ``block_size - 1`` positions cached) and of one
    uncached forward over a full ``block_size`` window, at the baby preset, as generation runs them
    (no_grad, without shape checks). Their ratio bounds what any KV cache can gain."""
    from typed_transformer.gpt import GPT, GPTConfig
    from typed_transformer.shapecheck import shape_checks

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("baby", 65, block_size=block_size)).eval()
    window = torch.zeros(1, block_size, dtype=torch.long)
    token = window[:, :1]
    step_ms: list[float] = []
    window_ms: list[float] = []
    with torch.no_grad(), shape_checks(False):
        for r in range(repeats + 10):
            caches = model.new_caches()
            model(window[:, :-1], kv_caches=caches)
            start = time.perf_counter()
            model(token, kv_caches=caches)
            middle = time.perf_counter()
            model(window)
            end = time.perf_counter()
            if r >= 10:
                step_ms.append((middle - start) * 1e3)
                window_ms.append((end - middle) * 1e3)
    return statistics.median(step_ms), statistics.median(window_ms)


def format_gpt_table(training: list[GPTRow], generation: list[GPTRow],
                     step_costs: tuple[float, float] | None = None) -> str:
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of interleaved runs; "
             "peak = rise of peak RSS over the first measured run"]
    if training:
        lines += ["", f"{'case':<48} {'ours ms':>9} {'baseline ms':>12} {'ratio':>7} {'ours peak':>10} "
                      f"{'base peak':>10}"]
        for row in training:
            lines.append(f"{row.what:<48} {row.ours_ms:>9.1f} {row.baseline_ms:>12.1f} {row.ratio:>6.3f}x "
                         f"{row.ours_peak_mib:>7.1f}MiB {row.baseline_peak_mib:>7.1f}MiB")
        lines.append("(ours: typed_transformer.GPT with shape checks on; baseline: nanoGPT-style plain torch; "
                     "target ratio <= 1.05x)")
    if generation:
        lines += ["", f"{'case':<48} {'cache ms':>9} {'no cache ms':>12} {'speedup':>8} {'cache peak':>11} "
                      f"{'no-cache peak':>14}"]
        for row in generation:
            lines.append(f"{row.what:<48} {row.ours_ms:>9.1f} {row.baseline_ms:>12.1f} {1 / row.ratio:>7.2f}x "
                         f"{row.ours_peak_mib:>8.1f}MiB {row.baseline_peak_mib:>11.1f}MiB")
        lines.append("(greedy; cached and uncached outputs are checked identical; no target at the baby preset: a "
                     "one-token step costs nearly what a whole window does, see the line below)")
    if step_costs is not None:
        step, window = step_costs
        lines.append(f"baby preset, one cached one-token step {step:.3f} ms, one uncached 64-token window "
                     f"{window:.3f} ms: a KV cache can speed up baby-preset generation by at most "
                     f"{window / step:.2f}x here")
    return "\n".join(lines)


@dataclass
class GenerationTargets:
    """The generation targets, measured interleaved in one process (milliseconds per generation)."""

    tokens: int
    cache_ms: float  # seed preset, KV cache, eager
    no_cache_ms: float  # seed preset, recomputing the context every step, eager
    compiled_cache_ms: float  # the same with compile_for_generation (typed-transformer generate --compile)
    compiled_no_cache_ms: float
    matvec_ms: float  # one cached step's matrix-vector products alone, eager (F.linear on the model's weights)
    ours_hf_ms: float  # our GPT loaded from the GPT2LMHeadModel, KV cache
    hf_ms: float  # GPT2LMHeadModel.generate(greedy, use_cache=True) on the same weights
    same_tokens_as_hf: int  # how many of the generated tokens agree with Hugging Face's
    compiled_same_tokens: int  # how many of the compiled cached generation's tokens agree with eager's
    rounds: int

    @property
    def speedup(self) -> float:
        """Eager: uncached / cached."""
        return self.no_cache_ms / self.cache_ms

    @property
    def best_no_cache_ms(self) -> float:
        """The faster way to generate without the cache, eager or compiled."""
        return min(self.no_cache_ms, self.compiled_no_cache_ms)

    @property
    def compiled_speedup(self) -> float:
        """Compiled cached generation against the faster uncached one (the 8x target)."""
        return self.best_no_cache_ms / self.compiled_cache_ms

    @property
    def eager_bound(self) -> float:
        """The most an eager cached step could gain if everything but its matrix-vector products were free."""
        return self.no_cache_ms / (self.tokens * self.matvec_ms)

    @property
    def hf_ratio(self) -> float:
        """Our per-token latency / Hugging Face's (same weights, same prompt, same length): <= 1 is faster."""
        return self.ours_hf_ms / self.hf_ms


def _matvec_ms(model: nn.Module, repeats: int = 50) -> float:
    """Milliseconds of the matrix-vector products of one cached step of ``model``: every ``nn.Linear`` applied
    to one position, in the model's order, eager. No cached step can be faster than this in eager mode."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    inputs = [torch.randn(1, 1, m.in_features) for m in linears]

    def step() -> None:
        for linear, x in zip(linears, inputs, strict=True):
            linear(x)

    with torch.no_grad():
        _median_ms(step, 5, 1)  # warm-up
        return statistics.median(_median_ms(step, repeats, 1))


def bench_generation_targets(*, tokens: int = 255, rounds: int = 3) -> GenerationTargets:
    """``tokens`` greedy tokens from a one-token prompt at the seed preset (6 layers, 384 wide, block 256) with
    and without the KV cache, eager and compiled (:func:`typed_transformer.generation.compile_for_generation`, as
    ``typed-transformer generate --compile`` does; compilation excluded); and our cached generation against
    ``GPT2LMHeadModel.generate`` (greedy, ``use_cache=True``) on the same random GPT-2 weights of the seed
    preset's sizes, loaded with ``GPT.from_hf_gpt2``. The runs alternate within each round (order reversed
    every other round); medians. Needs ``transformers`` (the ``hf`` extra), a benchmark-only dependency."""
    import transformers

    from typed_transformer.generation import compile_for_generation
    from typed_transformer.gpt import GPT, GPTConfig

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    torch.manual_seed(0)
    preset = GPT(GPTConfig.preset("seed", 65)).eval()
    compiled = GPT(preset.config).eval()
    compiled.load_state_dict(preset.state_dict())
    compile_for_generation(compiled)
    config = transformers.GPT2Config(vocab_size=65, n_positions=256, n_embd=384, n_layer=6, n_head=6,
                                     bos_token_id=None, eos_token_id=None, pad_token_id=0)
    hf = transformers.GPT2LMHeadModel(config).eval()  # type: ignore[no-untyped-call]
    ours = GPT.from_hf_gpt2(hf).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)

    def hf_generate() -> Tensor:
        with torch.no_grad():
            # An explicit attention mask: HF would otherwise take the prompt token (id 0 = pad_token_id) for padding.
            out: Tensor = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens,
                                      min_new_tokens=tokens, do_sample=False, use_cache=True, pad_token_id=0)
            return out

    runs: dict[str, Callable[[], Tensor]] = {
        "cache": lambda: preset.generate(prompt, tokens, greedy=True),
        "no cache": lambda: preset.generate(prompt, tokens, greedy=True, use_cache=False),
        "compiled cache": lambda: compiled.generate(prompt, tokens, greedy=True),
        "compiled no cache": lambda: compiled.generate(prompt, tokens, greedy=True, use_cache=False),
        "ours (hf weights)": lambda: ours.generate(prompt, tokens, greedy=True),
        "hf": hf_generate,
    }
    with warnings.catch_warnings():  # torch's autotuner warns about torch's own storage API while it compiles
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        for name, run in runs.items():  # warm-up, and the compilations (the slow eager uncached run needs none)
            if name != "no cache":
                run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, Tensor] = {}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            outputs[name] = runs[name]()
            samples[name].append((time.perf_counter() - start) * 1e3)
    if not torch.equal(outputs["cache"], outputs["no cache"]):
        raise AssertionError("cached and uncached generation differ")
    same = int((outputs["ours (hf weights)"][0, 1:] == outputs["hf"][0, 1:]).sum())
    compiled_same = int((outputs["compiled cache"][0, 1:] == outputs["cache"][0, 1:]).sum())
    ms = {name: statistics.median(v) for name, v in samples.items()}
    return GenerationTargets(tokens, ms["cache"], ms["no cache"], ms["compiled cache"], ms["compiled no cache"],
                             _matvec_ms(preset), ms["ours (hf weights)"], ms["hf"], same, compiled_same, rounds)


def format_generation_targets(result: GenerationTargets) -> str:
    n = result.tokens
    faster = "eager" if result.no_cache_ms <= result.compiled_no_cache_ms else "compiled"
    return "\n".join([
        f"generation targets ({torch.get_num_threads()} threads; {n} greedy tokens from a one-token prompt; "
        f"medians of {result.rounds} interleaved rounds):",
        f"  seed preset, compiled (generate --compile): KV cache {result.compiled_cache_ms / n:.2f} ms/token, "
        f"no cache {result.best_no_cache_ms / n:.2f} ms/token ({faster}, the faster of eager "
        f"{result.no_cache_ms / n:.2f} and compiled {result.compiled_no_cache_ms / n:.2f}): cache speedup "
        f"{result.compiled_speedup:.2f}x (target >= 8x); {result.compiled_same_tokens}/{n} tokens the same as eager",
        f"  seed preset, eager: KV cache {result.cache_ms / n:.2f} ms/token, no cache {result.no_cache_ms / n:.2f} "
        f"ms/token: cache speedup {result.speedup:.2f}x; its matrix-vector products alone take "
        f"{result.matvec_ms:.2f} ms/token, so eager cannot pass {result.eager_bound:.2f}x here",
        f"  same weights: ours (cached) {result.ours_hf_ms / n:.2f} ms/token, Hugging Face GPT2LMHeadModel.generate "
        f"(use_cache=True) {result.hf_ms / n:.2f} ms/token: ours / HF = {result.hf_ratio:.2f}x (target <= 1.00x); "
        f"{result.same_tokens_as_hf}/{n} tokens the same",
    ])


def bench_checks(*, seconds: float = 20.0, batch_size: int = 12) -> str:
    """What the shape checks cost, in each mode, side by side in this process.

    1. One baby-preset GPT training step (forward, backward, clip, AdamW) with checks off, in the default
       mode (only ``GPT.forward`` is checked: the calls the model makes to itself are not) and in strict mode
       (every nested call checked). Single steps rotate through the three modes (A B C, B C A, C A B, ...) for
       about ``seconds``; medians.
    2. One direct ``MultiHeadAttention`` call at the small size (eval, no_grad), checks off / on, in
       microseconds per call: the fixed cost a user pays on a call from their own code.
    """
    from typed_transformer.gpt import GPT, GPTConfig
    from typed_transformer.shapecheck import strict_checks

    modes = {"off": (False, False), "default": (True, False), "strict": (True, True)}
    config = GPTConfig.preset("baby", 65)
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(65, (batch_size, config.block_size), generator=generator)
    y = torch.randint(65, (batch_size, config.block_size), generator=generator)

    def train_step(mode: str) -> None:
        on, strict = modes[mode]
        with shape_checks(on), strict_checks(strict):
            _train_step(model, optimizer, x, y)

    warm = [ms for mode in modes for ms in _median_ms(functools.partial(train_step, mode), 2, 1)]
    steps = max(6, min(300, round(seconds * 1e3 / (len(modes) * statistics.median(warm)))))
    names = list(modes)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(steps):
        for name in names[i % 3:] + names[:i % 3]:
            samples[name] += _median_ms(functools.partial(train_step, name), 1, 1)
    step = {name: statistics.median(v) for name, v in samples.items()}

    case = SMALL
    torch.manual_seed(0)
    mha = MultiHeadAttention(case.d_model, case.h).eval()
    query = torch.randn(case.b, case.t, case.d_model, generator=generator)

    def call(mode: str, inner: int = 200) -> list[float]:
        on, strict = modes[mode]
        with shape_checks(on), strict_checks(strict), torch.no_grad():
            return _median_ms(lambda: mha(query), 1, inner)

    for mode in modes:
        call(mode)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for i in range(30):
        for name in names[i % 3:] + names[:i % 3]:
            per_call[name] += call(name)
    direct = {name: statistics.median(v) * 1e3 for name, v in per_call.items()}  # microseconds

    return "\n".join([
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of interleaved runs",
        f"baby preset train step (batch {batch_size}, block {config.block_size}), {steps} steps per mode: "
        f"checks off {step['off']:.2f} ms, default {step['default']:.2f} ms, strict {step['strict']:.2f} ms",
        f"  checks on (default mode) / off = {step['default'] / step['off']:.3f}x (target <= 1.02x); "
        f"strict / off = {step['strict'] / step['off']:.3f}x",
        f"MultiHeadAttention call, small size (b={case.b}, t={case.t}, d_model={case.d_model}, h={case.h}), eval: "
        f"checks off {direct['off']:.1f} us, on {direct['default']:.1f} us (strict {direct['strict']:.1f} us): "
        f"check overhead {direct['default'] - direct['off']:.1f} us per call",
    ])


def _positive(convert: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            value = 0
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a positive {convert.__name__}, got {text!r}")
        return value

    return parse


def _threads(text: str) -> int | str:
    return "auto" if text.strip().lower() == "auto" else int(_positive(int)(text))


def build_parser() -> argparse.ArgumentParser:
    """``python benchmarks/bench.py attention|gpt|checks [options]``."""
    parser = argparse.ArgumentParser(prog="benchmarks/bench.py", description="benchmarks that print side-by-side "
                                     "ratios")
    which = parser.add_subparsers(dest="which", required=True)
    attention = which.add_parser("attention", help="MultiHeadAttention against torch.nn.MultiheadAttention")
    attention.add_argument("--seconds", type=_positive(float), default=2.0,
                           help="rough time budget per size and mode (default 2)")
    attention.add_argument("--size", choices=["small", "training", "both"], default="both",
                           help="small: one short batch; training: the baby run's batch; both (default)")
    attention.add_argument("--write", type=Path, default=None,
                           help=f"also replace the block between a page's two {ATTENTION_MARKER} markers "
                                "(docs/lab/benchmarks.md) with the table")
    attention.add_argument("--readme", type=Path, default=None,
                           help="also replace the line between a page's two <!-- attention-speed --> markers "
                                "(README.md) with the training-size forward+backward target")
    gpt = which.add_parser("gpt", help="GPT training step against a nanoGPT-style baseline; KV-cache generation")
    gpt.add_argument("--presets", default=",".join(PRESETS),
                     help=f"comma-separated presets to time (default {','.join(PRESETS)})")
    gpt.add_argument("--batch-size", type=_positive(int), default=12,
                     help="sequences per training step (default 12, the main job's)")
    gpt.add_argument("--steps", type=_positive(int), default=None,
                     help="measured training steps per variant (default: as many as fit in about 20 s per preset)")
    gpt.add_argument("--skip-generation", action="store_true",
                     help="time the training steps only, not KV-cache generation")
    gpt.add_argument("--generation-rounds", type=_positive(int), default=3,
                     help="interleaved rounds of the seed-preset generation targets (default 3)")
    checks = which.add_parser("checks", help="what the shape checks cost: off, default and strict mode")
    checks.add_argument("--seconds", type=_positive(float), default=20.0,
                        help="rough time budget of the training-step comparison (default 20)")
    for sub in (attention, gpt, checks):
        sub.add_argument("--threads", type=_threads, default="auto",
                         help="intra-op threads: auto (default) times this benchmark's step at 1 .. usable cores and "
                              "keeps the fastest, so both sides of every ratio run at that count; a number fixes it")
    return parser


def _gpt(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        parser.error(f"--presets: unknown preset {unknown[0]!r} (choose {', '.join(PRESETS)})")
    if not presets:
        parser.error(f"--presets: no preset in {args.presets!r} (choose {', '.join(PRESETS)}, or both: "
                     f"{','.join(PRESETS)})")
    settle_threads(args.threads, thread_probe(args.which))
    training = bench_gpt_training(presets, batch_size=args.batch_size, steps=args.steps)
    generation = [] if args.skip_generation else bench_generation(block_sizes=(64,))
    costs = None if args.skip_generation else decode_step_costs()
    print(format_gpt_table(training, generation, costs))
    if not args.skip_generation:
        try:
            targets = bench_generation_targets(rounds=args.generation_rounds)
        except ImportError:
            print(f"generation targets: skipped (the comparison with Hugging Face needs transformers: "
                  f"{install_hint('hf')})")
        else:
            print()
            print(format_generation_targets(targets))


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark and print its table; bad arguments exit with code 2 and one line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.which == "gpt":
        _gpt(args, parser)
    elif args.which == "attention":
        settle_threads(args.threads, thread_probe(args.which))
        cases = {"small": [SMALL], "training": [TRAINING], "both": [SMALL, TRAINING]}[args.size]
        rows = bench_attention(cases, seconds=args.seconds)
        table = format_attention_table(rows)
        print(table)
        if args.write is not None:
            from benchmarks._runs import write_between

            write_between(args.write, ATTENTION_MARKER, ATTENTION_MARKER, f"```\n{table}\n```")
        if args.readme is not None and any(r.case == TRAINING for r in rows):
            from benchmarks._runs import write_readme_line

            write_readme_line(args.readme, "attention-speed", readme_attention_line(rows))
    else:
        settle_threads(args.threads, thread_probe(args.which))
        print(bench_checks(seconds=args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
