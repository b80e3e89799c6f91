"""The learning-rate sweep behind the baby preset's peak rate (a script, not library code).

Trains the baby preset on Tiny Shakespeare for its 2000 iterations at each peak learning rate (the minimum a tenth
of it, the rest of the schedule the preset's) and seed, with one intra-op thread per run (so every loss repeats
exactly on one machine, whatever its load), and prints a table of the final val loss two ways: on the main job's
20 evaluation batches (nanoGPT's protocol) and over the whole validation split (non-overlapping windows of
``block_size`` tokens). ``--write`` replaces the ``lr-sweep`` block of docs/lab/lr-sweep.md::

    python benchmarks/lr_sweep.py --data input.txt --jobs 2 --write

The runs are independent; ``--jobs`` runs that many at once (one thread each).
"""

import argparse
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from einops import rearrange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import data_file
from typed_transformer import training
from typed_transformer.config import TrainConfig
from typed_transformer.data import TextData, load_text
from typed_transformer.gpt import GPT, GPTConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "lab" / "lr-sweep.md"
BEGIN, END = "<!-- lr-sweep:begin -->", "<!-- lr-sweep:end -->"
#: (peak learning rate, what the row is), each run at every seed of SEEDS.
RATES = ((1e-3, "nanoGPT's"), (2e-3, ""), (3e-3, "the baby preset's"), (5e-3, ""))
SEEDS = (1, 2)
#: Seeds the sweep did not choose with, run at the preset's rate.
UNSEEN = (1337, 6)


def full_split_loss(model: GPT, data: TextData) -> float:
    """Mean cross-entropy over the validation split in non-overlapping ``block_size`` windows."""
    block = model.config.block_size
    windows = (len(data.val) - 1) // block
    x = rearrange(data.val[: windows * block], "(n t) -> n t", t=block)
    y = rearrange(data.val[1: windows * block + 1], "(n t) -> n t", t=block)
    total = 0.0
    model.eval()
    with torch.no_grad():
        for start in range(0, windows, 256):
            _, loss = model(x[start: start + 256], y[start: start + 256])
            assert loss is not None
            total += loss.item() * len(x[start: start + 256])
    return total / windows


def run(path: Path, learning_rate: float, seed: int, max_iters: int) -> tuple[float, float, float, int]:
    """One run: (learning rate, val on the 20 batches, val on the whole split, seed)."""
    torch.set_num_threads(1)
    config = TrainConfig.for_preset("baby", optimizer="adamw", learning_rate=learning_rate,
                                    min_lr=learning_rate / 10, seed=seed, threads=1, sample_tokens=0,
                                    checkpoint_interval=10**6, max_iters=max_iters)
    data = TextData.from_text(load_text(path), 64)
    torch.manual_seed(seed)
    model = GPT(GPTConfig.preset("baby", data.tokenizer.vocab_size))
    with tempfile.TemporaryDirectory() as out, open(os.devnull, "w") as quiet:
        result = training.train(model, data, config, out, progress=False, log=quiet, peak_flops=1.0)
    return learning_rate, result.history[-1]["val"], full_split_loss(result.model, data), seed


def table(results: list[tuple[float, float, float, int]]) -> list[str]:
    by = {(lr, seed): (val, full) for lr, val, full, seed in results}
    head = " | ".join(f"seed {seed}: 20 batches / full split" for seed in SEEDS)
    lines = [f"| peak lr (min = lr / 10) | {head} |", "|---" * (1 + len(SEEDS)) + "|"]
    for lr, name in RATES:
        cells = " | ".join(f"{by[lr, seed][0]:.4f} / {by[lr, seed][1]:.4f}" for seed in SEEDS)
        rate = f"{lr:.0e}".replace("e-0", "e-")
        lines.append(f"| {rate}{f' ({name})' if name else ''} | {cells} |")
    preset = TrainConfig.for_preset("baby").learning_rate
    unseen = ", ".join(f"seed {seed}: {by[preset, seed][0]:.4f} / {by[preset, seed][1]:.4f}" for seed in UNSEEN)
    lines += ["", f"At the preset's rate on seeds the sweep did not choose with (20 batches / full split): {unseen}."]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="Tiny Shakespeare (default: beside the checkout)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    parser.add_argument("--max-iters", type=int,
                        default=TrainConfig.for_preset("baby", optimizer="adamw").max_iters,
                        help="iterations per run (default: the preset's)")
    parser.add_argument("--write", action="store_true", help=f"replace the block of {PAGE.name}")
    args = parser.parse_args()
    preset = TrainConfig.for_preset("baby").learning_rate
    jobs = [(lr, seed) for lr, _ in RATES for seed in SEEDS] + [(preset, seed) for seed in UNSEEN]
    with data_file(args.data) as path, ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, [path] * len(jobs), *zip(*jobs, strict=True), [args.max_iters] * len(jobs)))
    lines = [f"Made by `python benchmarks/lr_sweep.py --data input.txt --jobs {args.jobs} --write` "
             f"({args.max_iters} iterations a run, torch {torch.__version__}, one thread per run: the losses repeat "
             "on this CPU whatever the load).",
             "", *table(results)]
    print("\n".join(lines))
    if args.write:
        text = PAGE.read_text(encoding="utf-8")
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        PAGE.write_text(text[:start] + "\n" + "\n".join(lines) + "\n" + text[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
