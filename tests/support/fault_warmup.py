"""Imported once by tests/app/test_faults.py's forkserver: one tiny training run, so that the forked runs inherit
warm caches (the shape checks' first-call set-up, torch's kernels, matplotlib's fonts) and start training within
milliseconds, which is what lets a random kill land in the middle of training or of a save."""

import contextlib
import io
import tempfile
from pathlib import Path

from typed_transformer.cli import main


def warm_up() -> None:
    with tempfile.TemporaryDirectory() as root:
        text = Path(root) / "input.txt"
        text.write_text("warm up the checks, the kernels and the plot.\n" * 20, encoding="utf-8")
        argv = ["train", "--data", str(text), "--out", str(Path(root) / "run"), "--block-size", "8", "--batch-size",
                "4", "--eval-interval", "1", "--eval-iters", "1", "--max-iters", "2", "--sample-tokens", "2",
                "--no-progress"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(argv)
            main(["generate", "--checkpoint", str(Path(root) / "run"), "--max-new-tokens", "2"])


warm_up()
