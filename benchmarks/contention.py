"""The main job on a busy machine: wall times with one core held by another process (a script, not library code).

Three runs of the same length, one after another in this process's watch, on the same text:

* the main job (``typed-transformer train``, the baby preset, ``--threads auto`` as a user gets it), idle;
* the same command while a busy-loop process holds one core;
* nanoGPT's CPU baby run as a plain PyTorch loop (``nanogpt_reference.py``: the same model and settings, torch's
  default of one intra-op thread per core) under the same load.

No run inherits ``OMP_NUM_THREADS``. Each wall time is launch to exit (start-up, evaluations, the save, the plot
and the sample included). With ``--rounds N`` the three are repeated in N interleaved rounds and each reported by
its median. Prints the figures and the two ratios the targets are about, each with the two wall times it
divides; ``--write docs/training.md`` also replaces the block between that page's two ``<!-- contention -->``
markers with the output::

    python benchmarks/contention.py [--data tinyshakespeare.txt] [--iters 200] [--rounds 1] [--write PAGE]
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import Run, busy_core, data_file, main_job, reference, run_timed, write_between, write_readme_line

#: Targets: loaded main job / idle main job, and loaded main job / loaded reference.
LOADED_OVER_IDLE = 1.6
LOADED_OVER_REFERENCE = 0.5
MARKER = "<!-- contention -->"


def _threads_of(run: Run) -> str:
    """What ``--threads auto`` chose last in a main-job run ('threads: 1 (...)' lines), else the batch line's."""
    chosen = next((line for _, line in reversed(run.lines)  # a change of count
                   if line.startswith("threads: ") and line.removeprefix("threads: ")[:1].isdigit()), None)
    if chosen is not None:
        return chosen.removeprefix("threads: ").split()[0] + " (auto)"  # 'threads: 2 at iteration 0 (...)'
    setting = (run.last("batch: ") or "").rsplit("; ", 1)[-1].removeprefix("threads ")
    return "auto, still timing the counts" if setting.startswith("auto") else setting


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="text file (default: Tiny Shakespeare beside the checkout, else the main job's corpus)")
    parser.add_argument("--iters", type=int, default=200, help="training iterations of every run (default 200)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians reported (default 1)")
    parser.add_argument("--write", type=Path, default=None, help="a page with two contention markers")
    parser.add_argument("--readme", type=Path, default=None,
                        help="a page (README.md) whose line between two <!-- contention-speed --> markers to rewrite")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"idle": [], "loaded": [], "reference": []}
    threads: dict[str, str] = {}
    with data_file(args.data) as data, tempfile.TemporaryDirectory() as out:
        job = main_job(data, Path(out) / "run", "--max-iters", str(args.iters))
        for round_ in range(args.rounds):
            run = run_timed(job)
            times["idle"].append(run.seconds)
            threads["idle"] = _threads_of(run)
            with busy_core():
                run = run_timed(job)
                times["loaded"].append(run.seconds)
                threads["loaded"] = _threads_of(run)
                run = run_timed(reference(data, "--max-iters", str(args.iters)))
                times["reference"].append(run.seconds)
                done = run.last("done: ") or "done: ?, ? threads"
                threads["reference"] = done.split(", ")[1].removesuffix(" threads") + " (torch's default)"
            print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()),
                  file=sys.stderr, flush=True)
        name, size = data.name, data.stat().st_size
    idle, loaded, ref = (statistics.median(times[k]) for k in ("idle", "loaded", "reference"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"contention: baby preset, {args.iters} iterations on {name} ({size:,} bytes), {cores} usable cores, "
             f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f} at the end; wall time launch to exit, "
             f"median of {args.rounds} round(s); loaded = one busy-loop process holding a core",
             f"main job idle (typed-transformer train, threads {threads['idle']}): {idle:.1f} s",
             f"main job loaded (threads {threads['loaded']}): {loaded:.1f} s",
             f"nanoGPT-style reference loop loaded (threads {threads['reference']}): {ref:.1f} s",
             f"loaded / idle: {loaded / idle:.2f}x ({loaded:.1f} s / {idle:.1f} s; target <= {LOADED_OVER_IDLE}x)",
             f"loaded / reference loaded: {loaded / ref:.2f}x ({loaded:.1f} s / {ref:.1f} s; "
             f"target <= {LOADED_OVER_REFERENCE}x)"]
    print("\n".join(lines))
    if args.write is not None:
        write_between(args.write, MARKER, MARKER, "```\n" + "\n".join(lines) + "\n```")
    if args.readme is not None:
        write_readme_line(args.readme, "contention-speed", (
            f"On a busy machine (one of the {cores} cores held by a busy loop), a {args.iters}-iteration main job "
            f"took {loaded / idle:.2f}x its idle wall time ({loaded:.1f} s / {idle:.1f} s; target <= "
            f"{LOADED_OVER_IDLE}x) and {loaded / ref:.2f}x that of a nanoGPT-style loop with torch's default threads "
            f"under the same load ({loaded:.1f} s / {ref:.1f} s; target <= {LOADED_OVER_REFERENCE}x; "
            f"`python benchmarks/contention.py`, load average {os.getloadavg()[0]:.2f})."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
