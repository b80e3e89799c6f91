"""What makes Muon's step cheap on a CPU: the choices measured side by side (a script, not library code).

The baby preset (4 layers, 128 wide, block 64), one thread, random tokens. Printed, each as a median over
interleaved rounds in this one process (so a loaded machine slows every variant alike):

* the Newton-Schulz phase of one Muon step on the 16 hidden matrices: one matrix at a time against the matrices
  of one shape stacked in one batched product (``torch.baddbmm``), step by step and in the Gram form (the
  default, where it costs fewer FLOPs: ``typed_transformer.muon``), at 5, 4 and 3 steps, and compiled
  (``torch.compile``, inductor, compiled once before the timing);
* whole training steps (forward, backward, clipping, the optimizer) with AdamW and with Muon, at batch 12 and at
  batch 24 (Muon's cost is per step, not per token), as milliseconds per 1000 tokens, and their ratios.

    python benchmarks/muon_step.py [--rounds 7] [--steps 5]
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from typed_transformer import muon
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.training import flops_per_token

BLOCK = 64
VOCAB = 65


def median_ms(variants: dict[str, Callable[[], object]], rounds: int, repeat: int) -> dict[str, float]:
    """Each variant's median over ``rounds`` interleaved rounds of the mean of ``repeat`` calls, in ms."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm up (and compile) before timing
        fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            times[name].append((time.perf_counter() - start) / repeat * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def newton_schulz_flops(model: GPT, steps: int) -> float:
    """The Newton-Schulz iteration's FLOPs in one Muon step, as :func:`muon.newton_schulz` runs it: step by step
    on an ``m x n`` matrix (``m <= n``) ``steps (4 m^2 n + 2 m^3)``, in the Gram form (``n > 1.5 m``)
    ``4 m^2 n + (8 steps - 6) m^3``."""
    total = 0.0
    for p in muon.hidden_matrices(model, [model.lm_head]):
        m, n = sorted(p.shape)
        gram = muon.gram_form_pays(m, n)
        total += 4 * m * m * n + (8 * steps - 6) * m**3 if gram else steps * (4 * m * m * n + 2 * m**3)
    return total


def newton_schulz_variants(model: GPT) -> dict[str, Callable[[], object]]:
    """The Newton-Schulz phase of one Muon step on the model's hidden matrices, several ways."""
    by_shape: dict[tuple[int, ...], list[Tensor]] = {}
    for p in muon.hidden_matrices(model, [model.lm_head]):
        by_shape.setdefault(tuple(p.shape), []).append(torch.randn_like(p))
    stacks = [torch.stack(same) for same in by_shape.values()]
    singles = [m[None] for same in by_shape.values() for m in same]
    plain = muon._plain_newton_schulz
    compiled = torch.compile(plain)

    def one_at_a_time(steps: int) -> Callable[[], object]:
        return lambda: [plain(m, steps) for m in singles]

    def batched(steps: int, fn: Callable[[Tensor, int], Tensor] = plain) -> Callable[[], object]:
        return lambda: [fn(s, steps) for s in stacks]

    def step_by_step(x: Tensor, steps: int) -> Tensor:
        return plain(x, steps, gram_form=False)

    return {"one matrix at a time, 5 steps": one_at_a_time(5),
            "batched by shape, 5 steps, no Gram form": batched(5, step_by_step),
            "batched by shape, 5 steps": batched(5),
            "batched by shape, 4 steps": batched(4), "batched by shape, 3 steps": batched(3),
            "batched by shape, 5 steps, compiled": batched(5, compiled)}


def train_step(optimizer_name: str, batch: int, ns_steps: int = 5) -> Callable[[], object]:
    """One whole training step of a fresh baby model with the named optimizer (the training loop's settings)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("baby", VOCAB))
    if optimizer_name == "muon":
        optimizer: torch.optim.Optimizer = muon.MuonAdamW(
            muon.muon_groups(model, [model.lm_head], weight_decay=0.1, lr_scale=0.02 / 3e-3, ns_steps=ns_steps),
            lr=3e-3, fused=True)
    else:
        optimizer = torch.optim.AdamW(model.parameter_groups(0.1), lr=3e-3, betas=(0.9, 0.99), fused=True)
    x = torch.randint(0, VOCAB, (batch, BLOCK))
    y = torch.randint(0, VOCAB, (batch, BLOCK))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        assert loss is not None
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="calls per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = GPT(GPTConfig.preset("baby", VOCAB))
    ns = median_ms(newton_schulz_variants(model), args.rounds, args.steps)
    base = ns["one matrix at a time, 5 steps"]
    print(f"Muon's Newton-Schulz phase on the baby preset's 16 hidden matrices, one thread, torch "
          f"{torch.__version__}, median of {args.rounds} interleaved rounds (ms; ratio to one matrix at a time):")
    for name, ms in ns.items():
        print(f"  {name:40s} {ms:7.2f} ms  {ms / base:.2f}x")
    steps = {f"{opt}, batch {batch}{extra}": train_step(opt, batch, ns_steps)
             for batch in (12, 24) for opt, ns_steps, extra in (("adamw", 5, ""), ("muon", 5, ", 5 NS steps"),
                                                                ("muon", 3, ", 3 NS steps"))}
    for batch in (12, 24):
        passes = flops_per_token(model) * batch * BLOCK
        print(f"FLOPs at batch {batch}: forward and backward {passes / 1e9:.2f} G; Newton-Schulz " + ", ".join(
            f"{k} steps {newton_schulz_flops(model, k) / 1e9:.2f} G ({newton_schulz_flops(model, k) / passes:.2f}x)"
            for k in (5, 4, 3)))
    whole = median_ms(steps, args.rounds, args.steps)
    print("Whole training steps (forward, backward, clipping, optimizer), one thread (ms per step; ms per 1000 "
          "tokens; ratio to AdamW at the same batch):")
    for name, ms in whole.items():
        batch = int(name.split("batch ")[1].split(",")[0])
        adamw = whole[f"adamw, batch {batch}"]
        print(f"  {name:32s} {ms:7.1f} ms  {ms / (batch * BLOCK) * 1e3:6.2f} ms/1k tokens  {ms / adamw:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
