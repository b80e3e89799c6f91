"""Command line: ``typed-transformer <command>``.

Bad arguments give one line on stderr and exit code 2, never a traceback.
"""

import argparse
import sys
from typing import NoReturn

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="typed-transformer", description="A reference Transformer with checked tensor shapes.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    bench = commands.add_parser("bench", help="benchmarks that print side-by-side ratios")
    which = bench.add_subparsers(dest="which", required=True, parser_class=_Parser)
    attention = which.add_parser("attention", help="MultiHeadAttention against torch.nn.MultiheadAttention")
    attention.add_argument("--seconds", type=_positive_float, default=2.0,
                           help="rough time budget per size and mode (default 2)")
    attention.add_argument("--threads", type=_positive_int, default=None,
                           help="torch intra-op threads (default: torch's choice)")
    attention.add_argument("--size", choices=["small", "training", "both"], default="both")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench" and args.which == "attention":
        import torch

        from .bench import SMALL, TRAINING, bench_attention, format_attention_table

        if args.threads is not None:
            torch.set_num_threads(args.threads)
        cases = {"small": [SMALL], "training": [TRAINING], "both": [SMALL, TRAINING]}[args.size]
        print(format_attention_table(bench_attention(cases, seconds=args.seconds)))
        return 0
    return 2  # unreachable: argparse requires a known command


if __name__ == "__main__":
    sys.exit(main())
