"""Val loss against training tokens for one set of training settings (a script, not library code): the runs
behind the baby preset's schedule (``typed_transformer.config.PRESET_TRAINING``).

Trains the baby preset on Tiny Shakespeare (beside the checkout by default) through :func:`typed_transformer.train`
with one intra-op thread (so the losses repeat exactly) and prints the val loss on 480 fixed windows of the
validation split (more than the main job's evaluation, for less noise between settings) at each evaluation,
with the training tokens seen so far. Any ``TrainConfig`` field is a ``key=value`` argument::

    python benchmarks/quality_per_token.py batch_size=12 learning_rate=6e-3 min_lr=0 warmup_iters=30
    python benchmarks/quality_per_token.py batch_size=24 max_iters=1000 eval_interval=125 learning_rate=6e-3 ...

The figures of the comparison depend on the data, not on the machine's speed or load.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import data_file
from typed_transformer import training
from typed_transformer.config import TrainConfig
from typed_transformer.data import TextData, get_batch, load_text
from typed_transformer.gpt import GPT, GPTConfig

WINDOWS = 480


class _WideEvaluation(training.Trainer):
    """The main job's trainer, evaluated on WINDOWS fixed validation windows (one small train batch)."""

    def _eval_batches(self) -> dict[str, list[tuple[Tensor, Tensor]]]:
        generator = torch.Generator().manual_seed(12345)
        return {"train": [get_batch(self.data.train, 12, self.block, generator)],
                "val": [get_batch(self.data.val, 48, self.block, generator) for _ in range(WINDOWS // 48)]}


def _value(text: str) -> int | float:
    return float(text) if any(c in text for c in ".eE") else int(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("settings", nargs="*", help="TrainConfig fields as key=value (over the baby preset's)")
    args = parser.parse_args()
    overrides = {key: _value(value) for key, value in (item.split("=", 1) for item in args.settings)}
    torch.set_num_threads(1)
    config = TrainConfig.for_preset("baby", threads=1, sample_tokens=0, checkpoint_interval=10**6, **overrides)
    with data_file(args.data) as path:
        data = TextData.from_text(load_text(path), 64)
    torch.manual_seed(config.seed)
    model = GPT(GPTConfig.preset("baby", data.tokenizer.vocab_size))
    with tempfile.TemporaryDirectory() as out, open(os.devnull, "w") as quiet:
        result = _WideEvaluation(model, data, config, Path(out), progress=False, log=quiet, peak_flops=1.0).run()
    per_step = config.batch_size * model.config.block_size
    print(f"baby preset with {overrides or 'its own settings'}: val loss on {WINDOWS} fixed windows at "
          "(training tokens: loss) " + ", ".join(f"{h['iter'] * per_step / 1e6:.2f}M: {h['val']:.4f}"
                                                  for h in result.history))
    return 0


if __name__ == "__main__":
    sys.exit(main())
