"""The encoder-decoder runs shown in docs/training.md: the default ``train-seq2seq`` (reverse 1-10 digits),
``--task add`` in the same budget, and ``translate`` on both checkpoints, each printed as ``$ command`` then
its output. Run it on an idle machine (the wall times are part of the figure):

    .venv/bin/python benchmarks/seq2seq_runs.py            # print the block
    .venv/bin/python benchmarks/seq2seq_runs.py --write    # and replace it in docs/training.md

Runs in a temporary directory (so the paths it prints are short) with the checkout's ``.venv``.
"""

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import write_between

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "training.md"
BEGIN, END = "<!-- seq2seq-runs:begin -->", "<!-- seq2seq-runs:end -->"

COMMANDS = [
    ["train-seq2seq", "--no-progress"],
    ["translate", "--checkpoint", "out-seq2seq", "--text", "0123456789", "--text", "90210", "--beam", "4"],
    ["train-seq2seq", "--task", "add", "--max-len", "3", "--out", "out-add", "--no-progress"],
    ["translate", "--checkpoint", "out-add", "--text", "123+456", "--text", "999+1", "--text", "70+805"],
]


def run_all() -> str:
    executable = Path(sys.executable).with_name("typed-transformer")
    lines = []
    with tempfile.TemporaryDirectory() as work:
        for argv in COMMANDS:
            start = time.perf_counter()
            # stdout and stderr merged, as a terminal shows them (progress is on stderr, results on stdout)
            done = subprocess.run([str(executable), *argv], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env={**os.environ, "COLUMNS": "120"}, check=False)
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"typed-transformer {' '.join(argv)} exited {done.returncode}:\n{done.stdout}")
            lines.append(f"$ typed-transformer {' '.join(argv)}    # {seconds:.0f} s wall")
            lines.extend(done.stdout.rstrip("\n").splitlines())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, the command's default --threads auto"
    return "\n".join([f"```text\n# {machine}", *lines, "```"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the block in docs/training.md")
    args = parser.parse_args()
    block = run_all()
    print(block)
    if args.write:
        write_between(DOC, BEGIN, END, block)


if __name__ == "__main__":
    main()
