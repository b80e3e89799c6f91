"""Val loss against training tokens for one set of training settings (a script, not library code): the runs
behind the baby preset's schedule (``typed_transformer.config.PRESET_TRAINING``).

Trains the baby preset on Tiny Shakespeare (beside the checkout by default) through :func:`typed_transformer.train`
with one intra-op thread (so the losses repeat exactly) and prints the val loss on 480 fixed windows of the
validation split (more than the main job's evaluation, for less noise between settings) at each evaluation,
with the training tokens seen so far. Any ``TrainConfig`` field is a ``key=value`` argument::

    python benchmarks/quality_per_token.py batch_size=12 learning_rate=6e-3 min_lr=0 warmup_iters=30
    python benchmarks/quality_per_token.py batch_size=24 max_iters=1000 eval_interval=125 learning_rate=6e-3 ...
    python benchmarks/quality_per_token.py --seeds 1337 1338 1339 optimizer=muon ns_steps=3

``--seeds`` runs one training per seed (side by side, one process each, ``--jobs`` at a time) and prints a table
of the val losses by seed and their mean; ``--write PAGE`` also puts it between the page's two markers of the
run's optimizer (:data:`MARKERS`; docs/lab/time-to-quality.md has one block per optimizer).

The figures of the comparison depend on the data, not on the machine's speed or load.
"""

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import data_file, write_between
from typed_transformer import training
from typed_transformer.config import TrainConfig
from typed_transformer.data import TextData, get_batch, load_text
from typed_transformer.gpt import GPT, GPTConfig

WINDOWS = 480
#: The markers of ``--write``'s block, by the runs' optimizer.
MARKERS = {"adamw": "<!-- quality-per-token-adamw -->", "muon": "<!-- quality-per-token-muon -->"}


class _WideEvaluation(training.Trainer):
    """The main job's trainer, evaluated on WINDOWS fixed validation windows (one small train batch)."""

    def _eval_batches(self) -> dict[str, list[tuple[Tensor, Tensor]]]:
        generator = torch.Generator().manual_seed(12345)
        return {"train": [get_batch(self.data.train, 12, self.block, generator)],
                "val": [get_batch(self.data.val, 48, self.block, generator) for _ in range(WINDOWS // 48)]}


def _value(text: str) -> int | float | str:
    """A ``key=value`` argument's value: a number where it reads as one (``optimizer=muon`` stays a string)."""
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        return text


def val_by_tokens(path: Path, overrides: dict[str, int | float | str]) -> list[tuple[float, float]]:
    """One training run with ``overrides`` over the baby preset's settings, one thread: (millions of training
    tokens, val loss on the WINDOWS fixed windows) at each evaluation."""
    torch.set_num_threads(1)
    config = TrainConfig.for_preset("baby", threads=1, sample_tokens=0, checkpoint_interval=10**6, **overrides)
    data = TextData.from_text(load_text(path), 64)
    torch.manual_seed(config.seed)
    model = GPT(GPTConfig.preset("baby", data.tokenizer.vocab_size))
    with tempfile.TemporaryDirectory() as out, open(os.devnull, "w") as quiet:
        result = _WideEvaluation(model, data, config, Path(out), progress=False, log=quiet, peak_flops=1.0).run()
    per_step = config.batch_size * model.config.block_size
    return [(h["iter"] * per_step / 1e6, h["val"]) for h in result.history]


def table(overrides: dict[str, int | float | str], runs: dict[int, list[tuple[float, float]]]) -> list[str]:
    """A markdown table of the val losses: one row per seed, then their mean (where every seed has one)."""
    tokens = sorted({t for points in runs.values() for t, _ in points if t > 0})
    found = {seed: dict(points) for seed, points in runs.items()}
    settings = ", ".join(f"{k}={v}" for k, v in overrides.items() if k != "seed") or "its own settings"
    lines = [f"baby preset with {settings}; val loss on {WINDOWS} fixed validation windows (one thread, "
             f"torch {torch.__version__}) after the training tokens of each column", "",
             "| seed | " + " | ".join(f"{t:.2f}M" for t in tokens) + " |", "|---" * (len(tokens) + 1) + "|"]
    for seed, values in found.items():
        lines.append(f"| {seed} | " + " | ".join(f"{values[t]:.4f}" if t in values else "-" for t in tokens) + " |")
    means = [f"{statistics.fmean(v[t] for v in found.values()):.4f}" if all(t in v for v in found.values())
             else "-" for t in tokens]
    lines.append(f"| mean of {len(found)} | " + " | ".join(means) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="one run per seed, and a table")
    parser.add_argument("--jobs", type=int, default=3, help="runs at a time with --seeds (one thread each)")
    parser.add_argument("--write", type=Path, default=None, help="a page with the optimizer's two MARKERS")
    parser.add_argument("settings", nargs="*", help="TrainConfig fields as key=value (over the baby preset's)")
    args = parser.parse_args()
    overrides = {key: _value(value) for key, value in (item.split("=", 1) for item in args.settings)}
    with data_file(args.data) as path:
        if args.seeds is None:
            points = val_by_tokens(path, overrides)
            print(f"baby preset with {overrides or 'its own settings'}: val loss on {WINDOWS} fixed windows at "
                  "(training tokens: loss) " + ", ".join(f"{t:.2f}M: {v:.4f}" for t, v in points))
            return 0
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            futures = {seed: pool.submit(val_by_tokens, path, {**overrides, "seed": seed}) for seed in args.seeds}
            runs = {seed: future.result() for seed, future in futures.items()}
    lines = table(overrides, runs)
    print("\n".join(lines))
    if args.write is not None:
        marker = MARKERS[TrainConfig.for_preset("baby", **overrides).optimizer]  # the run's (the preset's: muon)
        write_between(args.write, marker, marker, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
