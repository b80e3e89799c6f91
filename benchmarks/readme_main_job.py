"""The main job's output shown in README.md and docs/training.md: ``typed-transformer train`` with no flags, run in a
temporary directory with the checkout's ``.venv``, printed as ``$ command`` then its output, with the wall time and
the machine's load stated once. Run it on an idle machine (the wall time and the throughput are part of the
figure):

    .venv/bin/python benchmarks/readme_main_job.py            # print the block
    .venv/bin/python benchmarks/readme_main_job.py --write    # and replace it in both

tests/docs/test_docs_generated.py checks that the block has the lines the command prints today, in their order.
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
PAGES = [ROOT / "README.md", ROOT / "docs" / "training.md"]
BEGIN, END = "<!-- main-job:begin -->", "<!-- main-job:end -->"


def run() -> str:
    executable = Path(sys.executable).with_name("typed-transformer")
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        done = subprocess.run([str(executable), "train"], cwd=work, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "120"}, check=False)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"train exited {done.returncode}: {done.stdout.strip()}")
    load = os.getloadavg()[0]
    return "\n".join([
        "```",
        "$ .venv/bin/typed-transformer train",
        done.stdout.rstrip("\n"),
        "```",
        "",
        f"Real output, made by `benchmarks/readme_main_job.py` on {os.cpu_count()} CPU cores ({platform.machine()}, "
        f"torch {_torch_version()}, load average {load:.2f} when it ended): {seconds / 60:.0f} min "
        f"{seconds % 60:.0f} s wall time, start-up, evaluations, the save, the plot and the sample included.",
    ])


def _torch_version() -> str:
    import torch

    return torch.__version__


def write(block: str) -> None:
    for page in PAGES:
        write_between(page, BEGIN, END, block)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the block in README.md and docs/training.md")
    args = parser.parse_args()
    block = run()
    print(block)
    if args.write:
        write(block)
