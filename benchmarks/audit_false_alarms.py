"""False-alarm sweep of the audit's tolerance rule: correct candidates, float64 inputs, many seeds.

    python benchmarks/audit_false_alarms.py --seeds 100

Audits correct implementations (torch's SDPA, ours, a textbook one) with float64 inputs only, every check,
for each seed, and prints the number of false alarms (any FAIL is one) with the worst passing ratio per check.
The bar: none in 100 seeds. Float64 is where the old rule ("twice the reference's own error in your dtype")
collapsed to about 2 ulp, because the reference run in float64 is the reference itself.
"""

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import audit_candidates as cands
from typed_transformer import scaled_dot_product_attention
from typed_transformer.audit import Conventions, audit_attention

CANDIDATES: dict[str, tuple[Callable[..., Any], Conventions]] = {
    "torch_sdpa": (F.scaled_dot_product_attention, Conventions.torch_sdpa()),
    "typed_transformer": (scaled_dot_product_attention, Conventions.typed_transformer()),
    "textbook": (cands.naive_attention, Conventions(causal_alignment="top-left", fully_masked="nan")),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--max-examples", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    alarms = 0
    worst: dict[str, float] = {}
    for seed in range(args.seeds):
        for name, (candidate, conventions) in CANDIDATES.items():
            report = audit_attention(candidate, conventions=conventions, dtypes=[torch.float64], seed=seed,
                                     max_examples=args.max_examples)
            for result in report.results:
                if result.status == "FAIL":
                    alarms += 1
                    print(f"FALSE ALARM seed {seed} {name} {result.name}: {result.message}")
                elif result.status == "PASS" and result.ratio is not None:
                    worst[result.name] = max(worst.get(result.name, 0.0), result.ratio)
    runs = args.seeds * len(CANDIDATES)
    print(f"{runs} float64 audits ({args.seeds} seeds x {len(CANDIDATES)} correct candidates, every check, "
          f"{args.max_examples} examples each): {alarms} false alarms in {time.perf_counter() - start:.0f} s")
    print("worst passing ratio per check: " + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
    return 1 if alarms else 0


if __name__ == "__main__":
    raise SystemExit(main())
