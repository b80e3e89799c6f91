"""Time to nanoGPT's quality at its CPU baby configuration (a script, not library code).

Runs, one after the other on the same text (Tiny Shakespeare beside the checkout by default):

* nanoGPT's CPU baby run as a plain PyTorch loop (``nanogpt_reference.py``: 2000 iterations, its schedule, its
  evaluations, torch's default threads);
* the main job, ``typed-transformer train --data FILE`` (the baby preset: the same model sizes, block 64,
  batch 12; Muon over 1200 iterations, or AdamW over nanoGPT's 2000 with ``--optimizer adamw``;
  ``--threads auto``), plus any ``--extra`` flags.

Each evaluation line is stamped with the seconds since its process was launched. Printed, ready to paste:
both runs' evaluation lines with their stamps, the reference's final val loss and wall time, when the main job
first reached that val loss and 1.72, and the ratios against the targets (<= 0.50x the reference's wall time to
its final val loss; val <= 1.72 within its wall time). ``--write docs/lab/time-to-quality.md`` also replaces the
block between that page's ``<!-- time-to-quality -->`` markers with the output. ::

    python benchmarks/time_to_quality.py [--data FILE] [--rounds 1] [--extra "--lr 3e-3"] [--write PAGE]
    python benchmarks/time_to_quality.py --optimizer adamw --optimizer muon   # both, interleaved in each round

With ``--optimizer`` (given once or more) the main job runs with ``--optimizer NAME``, each in every round after
the reference, and the report is printed for each; ``--write`` and ``--readme`` take the first one's.

Where the main job's own time goes, phase by phase, is ``benchmarks/main_job_profile.py``.

The runs leave ``OMP_NUM_THREADS`` unset (each picks its own count, as a user's would). Evaluations happen every
250 iterations (the main job's Muon run: every 100), so a time to quality is the stamp of the first evaluation at
or below the target: an upper bound, by up to one evaluation interval; the line adds the time linear between that
evaluation and the one before it, marked as an estimate.
"""

import argparse
import itertools
import os
import re
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import Run, data_file, main_job, reference, run_timed, write_between, write_readme_line

#: Targets: the main job reaches the reference's final val loss in <= this fraction of the reference's wall
#: time, and reaches GOOD_VAL within the reference's wall time.
FRACTION = 0.50
GOOD_VAL = 1.72
MARKER = "<!-- time-to-quality -->"
_EVAL = re.compile(r"iter\s+(\d+): train loss ([\d.]+), val loss ([\d.]+)")


def evaluations(run: Run) -> list[tuple[float, int, float]]:
    """(seconds since launch, iteration, val loss) of each evaluation line."""
    found = []
    for seconds, line in run.lines:
        match = _EVAL.search(line)
        if match:
            found.append((seconds, int(match.group(1)), float(match.group(3))))
    return found


def first_at_or_below(points: list[tuple[float, int, float]], target: float) -> tuple[float, int] | None:
    """(seconds, iteration) of the first evaluation with val loss <= target, else None."""
    return next(((s, i) for s, i, v in points if v <= target), None)


def linear_crossing(points: list[tuple[float, int, float]], target: float) -> float | None:
    """The seconds at which val loss crossed ``target``, linear between the last evaluation above it and the first
    at or below it (an estimate, not a measured time: the first at or below is the upper bound); None if the
    first evaluation is already at or below, or none is."""
    for (s0, _, v0), (s1, _, v1) in itertools.pairwise(points):
        if v1 <= target < v0:
            return s0 + (s1 - s0) * (v0 - target) / (v0 - v1)
    return None


def report(reference_runs: list[Run], ours: list[Run], *, name: str, extra: str) -> list[str]:
    """The lines to print (and paste): medians over the rounds, and the last round's evaluation lines."""
    ref_wall = statistics.median(r.seconds for r in reference_runs)
    ref_val = statistics.median(evaluations(r)[-1][2] for r in reference_runs)
    our_wall = statistics.median(r.seconds for r in ours)
    our_val = statistics.median(evaluations(r)[-1][2] for r in ours)

    def every(run: Run) -> int:
        points = evaluations(run)
        return points[1][1] - points[0][1] if len(points) > 1 else 0

    lines = [f"time to quality: nanoGPT's CPU baby configuration on {name} (4 layers, 4 heads, 128 wide, block 64, "
             f"batch 12, 2000 iterations), torch {torch.__version__}, load average {os.getloadavg()[0]:.2f} at the "
             f"end; wall time from launch; median of {len(ours)} round(s); evaluations every "
             f"{every(reference_runs[-1])} iterations (the reference) and {every(ours[-1])} (the main job): times to "
             "quality are upper bounds",
             f"main job: typed-transformer train --data {name}{' ' + extra if extra else ''}",
             f"reference (nanoGPT-style loop, torch's default threads): final val {ref_val:.4f}, wall {ref_wall:.1f} s",
             f"main job: final val {our_val:.4f}, wall {our_wall:.1f} s"]
    for target, label in ((ref_val, f"the reference's final val {ref_val:.4f}"), (GOOD_VAL, f"val {GOOD_VAL}")):
        hits = [first_at_or_below(evaluations(r), target) for r in ours]
        if any(hit is None for hit in hits):
            lines.append(f"main job to {label}: not reached in {sum(h is None for h in hits)} of {len(hits)} round(s)")
            continue
        seconds = statistics.median(hit[0] for hit in hits if hit is not None)
        iteration = max(hit[1] for hit in hits if hit is not None)
        goal = (f"target <= {FRACTION:.2f}x" if target == ref_val else "target <= 1.00x")
        found = [linear_crossing(evaluations(r), target) for r in ours]
        crossings = [e for e in found if e is not None]
        middle = statistics.median(crossings) if len(crossings) == len(found) else None  # one in every round
        estimate = ("" if middle is None else
                    f"; linear between the evaluations around it about {middle:.1f} s = {middle / ref_wall:.2f}x, "
                    "an estimate")
        lines.append(f"main job to {label}: {seconds:.1f} s (by iteration {iteration}) = "
                     f"{seconds / ref_wall:.2f}x the reference's wall time "
                     f"({seconds:.1f} s / {ref_wall:.1f} s; {goal}{estimate})")
    for title, run in (("reference", reference_runs[-1]), ("main job", ours[-1])):
        lines.append(f"{title} evaluations (seconds since launch: iteration, val loss): " + ", ".join(
            f"{s:.1f} s: {i}, {v:.4f}" for s, i, v in evaluations(run)))
    return lines


def readme_line(lines: list[str]) -> str:
    """README.md's line: the two time-to-quality targets, from the report's lines."""
    reference_line = next(line for line in lines if line.startswith("reference (")).split(": ", 1)[1]
    hits = [line.split(": ", 1)[1] for line in lines if line.startswith("main job to ")]
    goals = [line.split(":", 1)[0].removeprefix("main job to ") for line in lines if line.startswith("main job to ")]
    return (f"Time to quality on Tiny Shakespeare, against a nanoGPT-style loop of the same model and settings "
            f"({reference_line}): the main job reached {goals[0]} in {hits[0]}, and {goals[1]}: {hits[1]} "
            f"(`python benchmarks/time_to_quality.py`, load average {os.getloadavg()[0]:.2f}).")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--extra", default="", help="flags added to the main job's command (quoted)")
    parser.add_argument("--write", type=Path, default=None, help="a page with two time-to-quality markers")
    parser.add_argument("--readme", type=Path, default=None,
                        help="a page (README.md) whose line between two <!-- quality-speed --> markers to rewrite")
    parser.add_argument("--optimizer", action="append", choices=("adamw", "muon"), default=None,
                        help="run the main job with this --optimizer (repeat for both; default: its own default)")
    args = parser.parse_args()
    extras = [args.extra] if args.optimizer is None else [
        f"--optimizer {name}{' ' + args.extra if args.extra else ''}" for name in args.optimizer]
    reference_runs: list[Run] = []
    ours: dict[str, list[Run]] = {extra: [] for extra in extras}
    with data_file(args.data) as data, tempfile.TemporaryDirectory() as out:
        for round_ in range(args.rounds):
            reference_runs.append(run_timed(reference(data)))
            for extra, runs in ours.items():
                runs.append(run_timed(main_job(data, Path(out) / "run", *shlex.split(extra))))
            print(f"round {round_ + 1}/{args.rounds}: reference {reference_runs[-1].seconds:.1f} s, " + ", ".join(
                f"main job{' ' + extra if extra else ''} {runs[-1].seconds:.1f} s" for extra, runs in ours.items()),
                file=sys.stderr, flush=True)
        reports = [report(reference_runs, runs, name=data.name, extra=extra) for extra, runs in ours.items()]
    lines = reports[0]
    print("\n\n".join("\n".join(each) for each in reports))
    if args.write is not None:
        write_between(args.write, MARKER, MARKER, "```\n" + "\n".join(lines) + "\n```")
    if args.readme is not None:
        write_readme_line(args.readme, "quality-speed", readme_line(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
