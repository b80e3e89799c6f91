"""Command line: ``typed-transformer <command>``.

* ``train``: train a character-level GPT on a text file (default: ~1 MB of Python's own standard library);
  any model size on top of a preset, ``--config FILE.toml``, gradient accumulation, ``--compile``, ``--dtype``;
  under ``torchrun`` (``torchrun --standalone --nproc-per-node N -m typed_transformer train ...``) one
  ``DistributedDataParallel`` process per rank (docs/training.md).
* ``generate``: sample text from a checkpoint (several prompts: one padded batch).
* ``train-seq2seq``: train the encoder-decoder on a synthetic task (copy, reverse, sort, add) or a file of
  tab-separated pairs, printing held-out exact match; ``translate``: greedy or beam decoding with its checkpoint.
* ``audit MODULE:ATTR``: audit a third-party attention function; ``audit --module MODULE:CLASS --spec NAME
  --config JSON``: an attention module with its own weights (exit 1 when a check fails).
* ``attention``: draw a checkpoint's attention over a text, one heatmap per layer and head.

Bad arguments, bad files and bad checkpoints give one line on stderr and exit code 2, never a traceback.
Exit codes (docs/reliability.md has the full table): 0 done; 1 a failed audit check or a diverged training run
(the last finite checkpoint is kept); 3 an ``audit --infer`` whose checks all passed but whose inferred
conventions differ from the paper's attention in ways not declared with ``--expect``; 2 bad input (arguments,
files, checkpoints, an unusable or locked --out, a file-system error, out of memory); 130 Ctrl-C (SIGINT); 143
SIGTERM. ``train`` saves on the first Ctrl-C or SIGTERM and stops at once on a second one.
"""

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from ._install import install_hint
from ._options import (
    THREADS_HELP,
    Flag,
    add_flags,
    flags_of,
    int_in,
    number,
    parse_threads,
    read_config,
    values_of,
)
from ._signals import TERMINATING, Watchdog, exit_code, raise_interrupt, raise_terminated, signal_name

if TYPE_CHECKING:  # the commands import these when they run: the parser stays light
    from .config import TrainConfig
    from .data import TextData
    from .gpt import GPT
    from .training import TrainResult

__all__ = ["main"]

#: Ranges of the flags that are not a config field's (those are in their dataclasses' metadata; the combinations
#: of a training run's flags are :func:`typed_transformer.training.check_run_sizes`'s, docs/reliability.md).
MAX_TOKENS = 1_000_000
MIN_TEMPERATURE = 0.01  # below this, logits / temperature overflow float32 and sampling is greedy anyway
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**32 - 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # Under torchrun every rank parses the same arguments: rank 0 alone says what is wrong.
        self.exit(2, f"{self.prog}: error: {message}\n" if _rank() == 0 else None)



_positive_float = number(float, lambda v: v > 0 and math.isfinite(v), "a positive finite number")
_positive_int = number(int, lambda v: v > 0, "a positive integer")
_non_negative_int = number(int, lambda v: v >= 0, "a non-negative integer")
_temperature = number(float, lambda v: MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
                      f"a temperature from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}")
_seed = int_in(0, MAX_SEED)
_fraction = number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")


@dataclass(frozen=True)
class TrainCommand:
    """``train``'s own options (the run's settings are :class:`~typed_transformer.gpt.GPTConfig`'s and
    :class:`~typed_transformer.config.TrainConfig`'s flags): the metadata make the flags (:mod:`._options`)."""

    config: Path | None = field(default=None, metadata={
        "help": "TOML file of the options (keys: the flags' names with _ for -, e.g. n_layer = 8); command-line "
                "flags override it", "in_file": False, "metavar": "FILE.toml"})
    data: Path | None = field(default=None, metadata={
        "help": "UTF-8 text file (default: ~1 MB of this Python's standard-library source)"})
    preset: str | None = field(default=None, metadata={"help": "the model presets"})  # its choices: gpt.PRESETS
    device: Literal["cpu", "cuda"] = field(default="cpu", metadata={"help": "where to train (default cpu)"})
    out: Path = field(default=Path("runs/gpt"), metadata={"help": "checkpoint directory (default runs/gpt)"})
    resume: bool = field(default=False, metadata={
        "help": "continue the run saved in --out", "store": True, "exclusive": "start", "in_file": False})
    overwrite: bool = field(default=False, metadata={
        "help": "start a fresh run even though --out holds a checkpoint (replaced at the first save)", "store": True,
        "exclusive": "start", "in_file": False})
    no_progress: bool = field(default=False, metadata={
        "help": "no progress bar (it is drawn only when stderr is a terminal)", "store": True})
    verbose: bool = field(default=False, metadata={
        "help": "also print the model's module tree (as the original tutorial's training log does)", "store": True})
    backend: Literal["gloo", "nccl"] | None = field(default=None, metadata={
        "help": "torch.distributed backend under torchrun (default: nccl on CUDA, gloo on CPU)",
        "group": "scale and speed"})
    peak_flops: float | None = field(default=None, metadata={
        "help": "one process's peak FLOP/s for the MFU figure (default: a float32 matmul measured at start)",
        "parse": _positive_float, "numeric": True, "group": "scale and speed"})


@dataclass(frozen=True)
class Seq2SeqCommand:
    """``train-seq2seq``'s own options (the run's settings are
    :class:`~typed_transformer.seq2seq_training.Seq2SeqConfig`'s flags)."""

    config: Path | None = field(default=None, metadata={
        **TrainCommand.__dataclass_fields__["config"].metadata,
        "help": "TOML file of the options (keys: the flags' names with _ for -, e.g. layers = 4); command-line "
                "flags override it"})
    threads: int | str = field(default="auto", metadata={"help": THREADS_HELP, "parse": parse_threads})
    out: Path = field(default=Path("out-seq2seq"), metadata={"help": "run directory (out-seq2seq)"})
    resume: bool = field(default=False, metadata={"help": "continue the run in --out", "store": True,
                                                  "in_file": False})
    overwrite: bool = field(default=False, metadata={"help": "replace the checkpoint in --out", "store": True,
                                                     "in_file": False})
    no_progress: bool = field(default=False, metadata={"help": "no progress bar", "store": True})


def _command_flags(command: str) -> list[Flag]:
    """Every flag of ``train`` or ``train-seq2seq``: the command's own, then its configs', from the dataclasses."""
    import dataclasses

    from ._options import flags_of
    from .config import TrainConfig, describe_presets
    from .gpt import PRESETS, GPTConfig
    from .seq2seq_training import Seq2SeqConfig

    if command == "train-seq2seq":
        return [*flags_of(Seq2SeqConfig), *flags_of(Seq2SeqCommand, own_defaults=True)]
    own = flags_of(TrainCommand, own_defaults=True)
    own = [dataclasses.replace(flag, kind="choice", choices=tuple(PRESETS), help=describe_presets())
           if flag.dest == "preset" else flag for flag in own]
    return [*own, *flags_of(TrainConfig), *flags_of(GPTConfig)]


def build_parser(file_defaults: dict[str, dict[str, Any]] | None = None, *,
                 audit_conventions: bool = True) -> argparse.ArgumentParser:
    """The command line's parser; ``file_defaults`` (a command's ``--config`` file: ``{command: {dest: value}}``)
    replace that command's defaults, so that its flags override them. ``audit_conventions=False`` leaves out
    ``audit``'s conventions flags (and the toolkit's import)."""
    from . import __version__

    parser = _Parser(prog="typed-transformer", description="A reference Transformer with checked tensor shapes.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    defaults = file_defaults or {}
    _train_parser(commands, defaults.get("train"))
    _generate_parser(commands)
    _seq2seq_parsers(commands, defaults.get("train-seq2seq"))
    _attention_parser(commands)
    _audit_parser(commands, audit_conventions)
    return parser


def _train_parser(commands: Any, train_defaults: dict[str, Any] | None) -> None:
    """``train``'s flags, generated from the config dataclasses; ``train_defaults`` (from ``--config``) replace
    their defaults."""
    from ._options import add_flags

    train = commands.add_parser("train", help="train a character-level GPT on a text file")
    add_flags(train, _command_flags("train"))
    if train_defaults:
        train.set_defaults(**train_defaults)


def _generate_parser(commands: Any) -> None:
    generate = commands.add_parser("generate", help="sample text from a checkpoint")
    generate.add_argument("--checkpoint", type=Path, required=True, help="checkpoint file or its directory")
    generate.add_argument("--prompt", action="append", default=None,
                          help="text to continue (default: a newline); repeat it for several prompts, generated as "
                               "one padded batch, each continuing exactly as it would alone")
    generate.add_argument("--prompts-file", type=Path, default=None,
                          help="a UTF-8 file with one prompt per line (after any --prompt)")
    generate.add_argument("--max-new-tokens", type=int_in(0, MAX_TOKENS), default=500,
                          help="characters to generate after the prompt (default 500)")
    generate.add_argument("--temperature", type=_temperature, default=0.8,
                          help=f"default 0.8; from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}")
    generate.add_argument("--top-k", type=_positive_int, default=None,
                          help="sample only among the k most likely characters (default: all)")
    generate.add_argument("--top-p", type=_fraction, default=None,
                          help="sample only among the most likely characters whose probabilities reach p, in (0, 1]; "
                               "the most likely one always stays (default: all)")
    generate.add_argument("--greedy", action="store_true", help="always take the most likely character")
    generate.add_argument("--seed", type=_seed, default=1337,
                          help="random seed of the sampling (default 1337; the same seed gives the same text)")
    generate.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                          help="where to run the model (default cpu)")
    generate.add_argument("--threads", type=parse_threads, default="auto", help=THREADS_HELP)
    generate.add_argument("--compile", action="store_true",
                          help="torch.compile the forward pass with the weights frozen in (inductor, max-autotune): "
                               "the first call compiles for a minute or more on a CPU, then each cached step runs "
                               "2.5-3x faster (python benchmarks/bench.py gpt)")


def _attention_parser(commands: Any) -> None:
    maps = commands.add_parser("attention", help="draw a checkpoint's attention maps over a text (PNG)")
    maps.add_argument("--checkpoint", type=Path, required=True, help="checkpoint file or its directory")
    maps.add_argument("--text", required=True, help="the characters to attend over (at most block_size of them)")
    maps.add_argument("--out", type=Path, default=Path("attention.png"), help="image to write (default attention.png)")
    maps.add_argument("--panel-size", type=_positive_float, default=2.5, help="inches per heatmap (default 2.5)")
    maps.add_argument("--dpi", type=_positive_int, default=100, help="default 100")
    maps.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                      help="where to run the model (default cpu)")


def _audit_parser(commands: Any, conventions: bool) -> None:
    """``audit``'s flags; ``conventions``: with the conventions flags (generated from the audit's
    :class:`~typed_transformer.audit.Conventions`, whose import takes a second: only when the command is audit)."""
    audit = commands.add_parser("audit", help="audit a third-party attention function or module against the "
                                "reference")
    audit.add_argument("candidate", metavar="MODULE:ATTR", nargs="?", default=None,
                       help="the attention callable, e.g. torch.nn.functional:scaled_dot_product_attention")
    audit.add_argument("--module", default=None, metavar="MODULE:CLASS",
                       help="audit an attention module class instead, e.g. "
                       "transformers.models.llama.modeling_llama:LlamaAttention (with --spec and --config)")
    audit.add_argument("--spec", default=None, metavar="NAME|MODULE:ATTR",
                       help="the module's spec: a shipped one (typed_transformer.audit.SPECS: torch_mha, gpt2, llama, "
                       "t5, mistral, ...), a library's, read from the module it builds (litgpt, diffusers, open_clip, "
                       "timm, torchtune, x_transformers), your own ModuleSpec as pkg.mod:NAME, or hf (a Hugging Face "
                       "attention class (only its import path), built from a tiny config of its own; --config "
                       "overrides fields)")
    audit.add_argument("--config", default="{}", help="constructor arguments of --module as a JSON object "
                       "(Hugging Face modules: the config's fields); its parameters are then redrawn from --seed")
    if conventions:  # the conventions a candidate function declares: Conventions' fields (imports the toolkit)
        try:
            from .audit import Conventions
        except ImportError:  # without the [audit] extra: _audit says so, whatever the flags
            audit.add_argument("arguments", nargs=argparse.REMAINDER, help="(needs the [audit] extra)")
            return
        add_flags(audit, flags_of(Conventions))
    audit.add_argument("--infer", action="store_true",
                       help="infer the conventions from the candidate's behaviour instead of declaring them (a "
                            "module's behavioural ones; its --spec says where the weights live); the report "
                            "starts with them and the input that decided each. Conventions flags given with it "
                            "are what you know: inference does the rest and a contradiction FAILs with its witness")
    audit.add_argument("--expect", action="append", default=[], metavar="NAME=VALUE",
                       help="with --infer: a difference from the paper's attention that is intended (repeat it for "
                            "several), e.g. --expect scale=1 (T5), --expect causal_alignment=top-left; an "
                            "undeclared difference makes the exit status 3 when every check passed")
    audit.add_argument("--checks", default=None, help="comma-separated subset of the checks")
    audit.add_argument("--dtypes", default=None, help="comma-separated (default: float32,float64 and float16, "
                       "bfloat16 where a function accepts them; a module: float32,float64)")
    audit.add_argument("--max-examples", type=_positive_int, default=20,
                       help="small examples per check and dtype (default 20)")
    audit.add_argument("--device", default=None, metavar="DEVICE",
                       help="where the candidate runs: cpu, cuda, cuda:1, ... (default: a module's own device, else "
                            "cpu); the inputs are drawn as on the CPU and moved there, the reference runs on the CPU")
    _audit_budget_flags(audit)
    audit.add_argument("--seed", type=_non_negative_int, default=0,
                       help="seed of the drawn examples (and of --module's redrawn parameters; default 0)")
    audit.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the report as JSON")
    audit.add_argument("--call-time-limit", type=_positive_float, default=60.0, metavar="SECONDS",
                       help="time limit of one call of the candidate (default 60; the audit's inputs are small): a "
                            "call past it, or one that calls sys.exit, FAILs in one line and stops the audit")
    audit.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                       help="import and call a candidate function in its own process (the default on the CPU): an "
                            "exit, a signal, a segfault or a hang of it FAILs in one line and stops the audit, and "
                            "its code never runs beside the reference; --no-isolate calls it in the audit's process "
                            "(a module, and a function on a GPU, are audited in process)")


def _sizes(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated positive integers, returned sorted (the budget's lists shrink towards
    their first element)."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return tuple(values)


def _audit_budget_flags(audit: argparse.ArgumentParser) -> None:
    """``audit``'s budget: how deep the examples go beside the small ones (typed_transformer.audit.Budget)."""
    audit.add_argument("--budget", choices=("quick", "ci", "default", "thorough"), default="default",
                       help="quick: the small examples only (sizes 1..6), float32 and float64; ci: every check and "
                            "dtype with a few deep sizes (for a suite run on every change); default: also the deep "
                            "ones below; thorough: also key lengths 512,1024,2048,4096 and 32 and 64 heads (about "
                            "100 s where the default takes 2-5 s: benchmarks/audit_cost.py)")
    audit.add_argument("--lengths", type=_sizes, default=None, metavar="N,N,...",
                       help="key and query lengths of the deep examples (default 15,16,17,31,32,33,63,64,65,127,"
                            "128,129: both sides of the tiles kernels use; a failure shrinks to the smallest)")
    audit.add_argument("--head-sizes", type=_sizes, default=None, metavar="D,D,...",
                       help="head sizes of the deep examples (default 64,65,80,96,127,128,256)")
    audit.add_argument("--batch", type=_sizes, default=None, metavar="B,B,...",
                       help="batch sizes of the deep examples (default 5,8,9,12,16)")
    audit.add_argument("--heads", type=_sizes, default=None, metavar="H,H,...",
                       help="query head counts drawn beside the deep batches (default 5,6,8,12,16; key/value heads "
                            "a divisor when grouped-query attention is supported)")
    audit.add_argument("--deep-examples", type=_non_negative_int, default=None, metavar="N",
                       help="deep examples per check and dtype (default 6; 0: the small ones only)")


def _audit_budget(args: argparse.Namespace) -> Any:
    """The :class:`~typed_transformer.audit.Budget` the flags ask for, or the error message."""
    import dataclasses

    from .audit import BUDGETS

    changes = {field: getattr(args, field) for field in ("lengths", "head_sizes", "heads", "deep_examples")
               if getattr(args, field) is not None}
    if args.batch is not None:
        changes["batches"] = args.batch
    if args.budget == "quick":
        if changes:
            flag = "--" + next(iter(changes)).replace("_", "-").replace("batches", "batch")
            return f"{flag} sets the deep examples, which --budget quick leaves out"
        return BUDGETS["quick"]
    return dataclasses.replace(BUDGETS[args.budget], **changes)


def _seq2seq_parsers(commands: Any, seq2seq_defaults: dict[str, Any] | None) -> None:
    """``train-seq2seq`` (flags named as :class:`~typed_transformer.seq2seq_training.Seq2SeqConfig`'s fields) and
    ``translate``."""
    s2s = commands.add_parser("train-seq2seq", help="train the encoder-decoder on a synthetic task or TSV pairs")
    add_flags(s2s, _command_flags("train-seq2seq"))
    s2s.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to train (default cpu)")
    if seq2seq_defaults:
        s2s.set_defaults(**seq2seq_defaults)
    tr = commands.add_parser("translate", help="decode sources with a train-seq2seq checkpoint")
    tr.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to decode (default cpu)")
    tr.add_argument("--checkpoint", type=Path, required=True, help="checkpoint file or its directory")
    tr.add_argument("--text", action="append", default=None,
                    help="a source to decode (repeat it for several; default: each line of stdin)")
    tr.add_argument("--beam", type=int_in(1, 1024), default=1, help="beam width (1: greedy)")
    tr.add_argument("--max-new-tokens", type=int_in(1, MAX_TOKENS), default=None,
                    help="longest output (default: twice the source plus 10)")


def _fail(message: str) -> int:
    print(f"typed-transformer: error: {message}", file=sys.stderr)
    return 2


def _cuda_or_fail(device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")


#: What ``train``, ``generate`` and ``attention`` need beyond the core install: the ``[train]`` extra.
TRAIN_EXTRA = {"train": ("safetensors", "numpy", "tqdm", "matplotlib"), "generate": ("safetensors", "numpy"),
               "attention": ("safetensors", "numpy", "matplotlib"), "train-seq2seq": ("safetensors", "numpy", "tqdm"),
               "translate": ("safetensors", "numpy")}


def _require_train_extra(command: str) -> None:
    import importlib

    missing = []
    for name in TRAIN_EXTRA[command]:
        try:
            importlib.import_module(name)  # the command imports it anyway; a broken install counts as missing
        except ImportError:
            missing.append(name)
    if missing:
        raise ValueError(f"{command} needs the [train] extra: {install_hint('train')} "
                         f"(missing: {', '.join(missing)})")


#: Options a resumed run may change (the model, the data, the vocabulary and the seed may not).
CHANGEABLE_ON_RESUME = ("--max-iters", "--lr", "--batch-size", "--eval-interval", "--eval-iters",
                        "--checkpoint-interval", "--sample-tokens", "--device", "--no-progress", "--grad-accum",
                        "--dtype", "--compile", "--backend", "--peak-flops", "--config", "--verbose", "--threads")

def _rank() -> int:
    """This process's rank under torchrun (0 when not launched by it)."""
    import os

    return int(os.environ.get("RANK", "0"))


def _distributed(args: argparse.Namespace) -> bool:
    """Join torchrun's process group when launched with more than one process (env ``WORLD_SIZE``); returns
    whether it did. The backend is ``--backend``, else nccl with ``--device cuda`` and gloo otherwise; with
    CUDA each process takes the device ``cuda:LOCAL_RANK``."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import torch
    import torch.distributed as dist

    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if backend == "nccl" and args.device != "cuda":
        raise ValueError("--backend nccl needs --device cuda")
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        _cuda_or_fail("cuda")
        torch.cuda.set_device(local)
        args.device = f"cuda:{local}"
    dist.init_process_group(backend=backend)
    return True


def _train(args: argparse.Namespace) -> int:
    from .run_files import CHECKPOINT_NAME, run_directory
    from .step_loop import PeerFailed

    _require_train_extra("train")
    distributed = _distributed(args)
    try:
        # Rank 0 alone holds the run directory (the lock is per process); every rank checks the same files.
        with run_directory(args.out) if _rank() == 0 else contextlib.nullcontext(args.out):
            if not args.resume and not args.overwrite and (args.out / CHECKPOINT_NAME).exists():
                raise ValueError(f"{args.out / CHECKPOINT_NAME} exists: continue that run with --resume or "
                                 "replace it with --overwrite")
            return _train_locked(args)
    except PeerFailed:
        # torchrun now stops the surviving processes with SIGTERM: this one is ending with its line anyway
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, *TERMINATING):
                signal.signal(signum, signal.SIG_IGN)
        raise
    finally:
        if distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


def _slow_bfloat16() -> str | None:
    """A one-line warning when this CPU's bfloat16 matmul is much slower than its float32 one (no native
    bf16: autocast then makes training slower), else None. Costs a few milliseconds."""
    from .training import measure_matmul_flops

    fp32 = measure_matmul_flops("cpu", size=128, seconds=0.01)
    bf16 = measure_matmul_flops("cpu", torch_dtype("bfloat16"), size=128, seconds=0.01)
    if bf16 * 2 >= fp32:
        return None
    return (f"this CPU has no fast bfloat16 matmul ({bf16 / 1e9:.1f} GFLOP/s against {fp32 / 1e9:.1f} in "
            "float32): --dtype bfloat16 will train slower than float32 here")


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _train_locked(args: argparse.Namespace) -> int:
    import hashlib
    import os

    from .checkpoint import load_checkpoint
    from .config import DEFAULT_PRESET, TrainConfig
    from .data import default_corpus, load_text
    from .gpt import GPTConfig
    from .run_files import CHECKPOINT_NAME
    from .training import DTYPES, measure_peak_flops, remeasure_peak, resumed_run, train

    _cuda_or_fail(args.device)
    if args.data is None:
        text, source = default_corpus()
    else:
        text, source = load_text(args.data), str(args.data)
    text_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    overrides, train_overrides = values_of(args, GPTConfig), values_of(args, TrainConfig)
    if args.dtype == "float16" and not args.device.startswith("cuda"):
        raise ValueError("--dtype float16 needs --device cuda (autocast with a gradient scaler); on CPU use "
                         "float32 or bfloat16")
    main = _rank() == 0
    err = sys.stderr if main else open(os.devnull, "w")  # noqa: SIM115 (closed with the process)
    resume = load_checkpoint(args.out / CHECKPOINT_NAME) if args.resume else None
    if resume is not None:
        model, config, data, preset = resumed_run(resume, overrides, train_overrides, requested_preset=args.preset,
                                                  text=text, text_sha256=text_sha256, source=source,
                                                  out=args.out, err=err)
    else:
        model, config, data, preset = _fresh(args.preset or DEFAULT_PRESET, overrides, train_overrides, text, source)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if config.batch_size % (world * config.grad_accum) != 0:
        raise ValueError(f"--batch-size {config.batch_size} is not divisible by {world} process(es) x "
                         f"--grad-accum {config.grad_accum}: the global batch is split into equal micro-batches")
    peak = _describe_run(args, model, config, data, preset, text, source, world, main, err)
    info = {"source": source, "text_chars": len(text), "text_sha256": text_sha256,
            "preset": resume.info.get("preset") if resume is not None else preset,
            "config_file": str(args.config) if args.config is not None else None}
    result = train(model, data, config, args.out, resume=resume, overwrite=args.overwrite, device=args.device,
                   progress=not args.no_progress and main and sys.stderr.isatty(),
                   info={k: v for k, v in info.items() if v is not None}, peak_flops=peak or None)
    if args.peak_flops is None and main and peak:  # measured at the start: again at the end (the load may change)
        import torch

        kind = torch.float32 if not args.device.startswith("cuda") else DTYPES[config.dtype]
        result = remeasure_peak(result, peak, lambda: measure_peak_flops(args.device, kind, config.threads)[0])
    return _report_training(args, result, config, world) if main else 0


def _fresh(preset: str, overrides: dict[str, Any], train_overrides: dict[str, Any], text: str,
           source: str) -> tuple["GPT", "TrainConfig", "TextData", str]:
    """A new run: the preset's settings with the flags, the data, and the model drawn from the seed."""
    import torch

    from ._memory import parameter_count, require_training_memory
    from .data import TextData
    from .gpt import GPT, GPTConfig
    from .training import TrainConfig, check_run_sizes

    config = TrainConfig.for_preset(preset, **train_overrides)
    model_config = GPTConfig.preset(preset, 1, **overrides)  # the sizes are checked before reading the text
    check_run_sizes(config.batch_size, model_config.block_size, config.eval_iters)
    data = TextData.from_text(text, model_config.block_size, source=source)
    full = GPTConfig.preset(preset, data.tokenizer.vocab_size, **overrides)
    require_training_memory(parameter_count(lambda: GPT(full)), advice="lower --n-layer or --n-embd")
    torch.manual_seed(config.seed)
    return GPT(full), config, data, preset


def _describe_run(args: argparse.Namespace, model: "GPT", config: "TrainConfig", data: "TextData", preset: str,
                  text: str, source: str, world: int, main: bool, err: Any) -> float | None:
    """Print the data, model, settings, batch split and thread count; returns the peak FLOP/s for MFU
    (``--peak-flops``, else measured on rank 0)."""
    import torch

    from .threads import resolve_threads
    from .training import DTYPES, measure_peak_flops

    print(f"data: {source}: {len(text):,} characters, vocabulary {data.tokenizer.vocab_size}, "
          f"train {len(data.train):,} / val {len(data.val):,} tokens", file=err)
    print(f"model: {preset} preset, {model.num_parameters():,} parameters (without positions), "
          f"{model.config}", file=err)
    if preset == "seed":  # and the count as the tutorial prints it: every parameter, the position table included
        print(model.num_parameters(non_embedding=False) / 1e6, "M parameters", file=err)
    if args.verbose:
        print(model, file=err)  # the module tree, as the original tutorial's log prints its model
    print(f"train: {config}", file=err)
    rows = config.batch_size // world
    threads = resolve_threads(config.threads)
    print(f"batch: {config.batch_size} sequences per step = {world} process(es) x {config.grad_accum} "
          f"micro-batch(es) x {rows // config.grad_accum}"
          + (f"; torch.distributed {torch.distributed.get_backend()}" if world > 1 else "")
          + f"; {threads.describe()}", file=err)
    if config.dtype == "bfloat16" and not args.device.startswith("cuda") and main:
        slow = _slow_bfloat16()
        if slow is not None:
            print(f"note: {slow}", file=err)
    peak: float | None = args.peak_flops
    if peak is None and main:
        kind = torch.float32 if not args.device.startswith("cuda") else DTYPES[config.dtype]
        peak, count = measure_peak_flops(args.device, kind, config.threads)
        fastest = threads.count is None and torch.device(args.device).type == "cpu"
        how = f"at {count} threads" + (", the fastest count now" if fastest else "")
        print(f"peak: {peak / 1e9:,.1f} GFLOP/s per process ({str(kind).removeprefix('torch.')} matmul {how}, "
              "measured; MFU is against this, or --peak-flops)", file=err)
    return peak


def _mfu_caveat(result: "TrainResult") -> str:
    """Why an MFU above 100 % can be printed at all (the steps beat the peak they are measured against)."""
    if not result.mfu > 1:
        return ""
    if result.peaks:
        peaks = " and ".join(f"{peak / 1e9:,.1f}" for peak in result.peaks)
        return (f"; above 100 %: the steps ran faster than the matmul peak measured at the start and the end "
                f"({peaks} GFLOP/s: the machine's load changed during the run); give --peak-flops for a fixed one")
    return "; above 100 %: --peak-flops is lower than the rate the steps reached"


def _report_training(args: argparse.Namespace, result: "TrainResult", config: "TrainConfig", world: int) -> int:
    """Rank 0's closing lines: how the run ended, throughput and MFU, the sample; the exit code."""
    last = result.history[-1] if result.history else {}
    if result.interrupted:
        name = signal_name(result.signal or signal.SIGINT)
        print(f"interrupted ({name}) at iteration {result.iteration}; saved {result.checkpoint} "
              f"(continue with --resume)", file=sys.stderr)
        return int(128 + (result.signal or signal.SIGINT))
    print(f"done: iteration {result.iteration}, train loss {last.get('train', float('nan')):.4f}, "
          f"val loss {last.get('val', float('nan')):.4f}; checkpoint {result.checkpoint}, "
          f"loss curve {args.out / 'loss.png'}")
    how = f"{world} process(es), {config.dtype}{', compiled' if config.compile else ''}"
    if math.isfinite(result.tokens_per_second):
        print(f"throughput: {result.tokens_per_second:,.0f} tokens/s, MFU {100 * result.mfu:.1f}% ({how})"
              + _mfu_caveat(result))
    else:  # the first step of a call is not timed (it compiles with --compile)
        print(f"throughput: not measured (it needs two steps or more in this run; {how})")
    if result.sample:
        print("sample:")
        print(result.sample)
    return 0


def _generate(args: argparse.Namespace) -> int:
    _require_train_extra("generate")
    from .checkpoint import load_checkpoint
    from .data import read_prompts
    from .generation import continue_prompts, stream_prompt

    _cuda_or_fail(args.device)
    checkpoint = load_checkpoint(args.checkpoint, map_location=args.device)
    prompts = [*(args.prompt or []), *(read_prompts(args.prompts_file) if args.prompts_file else [])] or ["\n"]
    if "" in prompts:
        raise ValueError(f"--prompt is empty (prompt {prompts.index('') + 1})")
    model = checkpoint.model.eval()
    # Timed on a unit of the work to come: the prompts' forward and 8 cached greedy steps.
    _choose_threads(args.threads, lambda: continue_prompts(model, checkpoint.tokenizer, prompts, 8, seed=args.seed,
                                                           device=args.device, greedy=True))
    if args.compile:
        import warnings

        from . import generation

        # Raised inside torch's autotuner while it compiles, about torch's own storage API: not the user's concern.
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        model = generation.compile_for_generation(model)
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "greedy": args.greedy}
    if len(prompts) == 1:  # shown as it is sampled: on Ctrl-C what was printed stays (exit 130)
        # the prompt is checked (encoded) at the call, before anything is printed: bad input prints nothing
        texts_as_sampled = stream_prompt(model, checkpoint.tokenizer, prompts[0], args.max_new_tokens,
                                         seed=args.seed, device=args.device, **sampling)
        print(prompts[0], end="", flush=True)
        try:
            for text in texts_as_sampled:
                print(text, end="", flush=True)
        finally:
            print(flush=True)
        return 0
    texts = continue_prompts(model, checkpoint.tokenizer, prompts, args.max_new_tokens, seed=args.seed,
                             device=args.device, **sampling)
    for i, text in enumerate(texts):
        if len(prompts) > 1:
            print(f"==> prompt {i + 1} <==")
        print(text)
    return 0


def _choose_threads(requested: int | str | None, step: Callable[[], object]) -> None:
    """Set the thread count for a command that is not a training run: fixed, or tuned on ``step``."""
    from .threads import settle_threads

    settle_threads(requested, step)


def _attention(args: argparse.Namespace) -> int:
    """Attention maps of a trained GPT over ``--text``: one panel per layer (rows) and head (columns)."""
    import torch

    from .checkpoint import load_checkpoint
    from .plot import plot_attention

    _require_train_extra("attention")
    _cuda_or_fail(args.device)
    checkpoint = load_checkpoint(args.checkpoint)
    text = args.text
    if not text:
        raise ValueError("--text is empty")
    model = checkpoint.model.eval().to(args.device)
    if len(text) > model.config.block_size:
        raise ValueError(f"--text has {len(text)} characters, more than the model's block_size "
                         f"{model.config.block_size}")
    ids = torch.tensor([checkpoint.tokenizer.encode(text)], device=args.device)
    weights = model.attention_weights(ids)[:, 0].cpu()  # (layers, heads, t, t)
    if not args.out.parent.is_dir():
        raise ValueError(f"--out: the directory {args.out.parent} does not exist")
    try:
        plot_attention(weights, list(text), path=args.out, panel_size=args.panel_size, dpi=args.dpi,
                       title=f"{args.checkpoint}: {text!r}")
    except OSError as err:
        raise ValueError(f"--out: cannot write {args.out}: {err.strerror or err}") from None
    layers, heads = weights.shape[:2]
    print(f"wrote {args.out}: {layers} layers x {heads} heads over {len(text)} characters")
    return 0


def _run_training_command(args: argparse.Namespace) -> int:
    """``train``, ``generate`` or ``attention``, with every expected failure turned into one line and its exit
    code."""
    from .checkpoint import CheckpointError
    from .data import DataError
    from .run_files import RunDirectoryError, describe_os_error

    try:
        if args.command in ("train-seq2seq", "translate"):
            from . import seq2seq_training

            _require_train_extra(args.command)
            _cuda_or_fail(args.device)
            return (seq2seq_training.train_command if args.command == "train-seq2seq"
                    else seq2seq_training.translate_command)(args)
        return {"train": _train, "generate": _generate, "attention": _attention}[args.command](args)
    except (DataError, CheckpointError, RunDirectoryError, ValueError) as err:
        if _rank() != 0:  # under torchrun every rank checks the same input: rank 0 alone says what is wrong
            return 2
        return _fail(str(err).splitlines()[0] if str(err) else type(err).__name__)
    except OSError as err:
        return _fail(f"cannot write: {describe_os_error(err)} (the last checkpoint, if any, is intact)")
    except (RuntimeError, MemoryError) as err:
        from ._memory import out_of_memory
        from .step_loop import PeerFailed, TrainingDiverged

        if isinstance(err, PeerFailed):  # one line for the run: rank 0's, or a survivor's when rank 0 is gone
            if err.report:
                print(f"typed-transformer: error: {err}", file=sys.stderr, flush=True)
            return 1
        if isinstance(err, TrainingDiverged):
            print(f"typed-transformer: error: {err}", file=sys.stderr)
            return 1
        if out_of_memory(err):
            return _fail("out of memory: lower --batch-size, --block-size or --eval-iters")
        if "probability tensor contains" in str(err):  # torch.multinomial on NaN or infinite probabilities
            return _fail("the model's output is not finite (its weights are finite but exploded: the run that "
                         "wrote this checkpoint diverged)")
        raise


def _import(spec: str) -> Any:
    """``MODULE:ATTR`` -> the object (raises with the reason)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected MODULE:ATTR, got {spec!r}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # like `python -m`: modules in the current directory import
    found: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        found = getattr(found, part)
    return found


def _audit_spec(args: argparse.Namespace) -> Any:
    """``--spec``: a shipped spec by name, the user's ``ModuleSpec`` as ``pkg.mod:NAME``, or None for ``hf``
    (built with the module); a string is the error message."""
    from .audit import SPECS, ModuleSpec

    choices = f"a shipped spec ({', '.join(SPECS)}), hf for any Hugging Face attention class (its import path only), " \
              f"or your own ModuleSpec as pkg.mod:NAME"
    if args.spec is None:
        return f"--spec: missing (give {choices})"
    if args.spec == "hf":
        return None
    if ":" not in args.spec:
        return SPECS.get(args.spec, f"--spec: unknown spec {args.spec!r} (give {choices})")
    try:
        spec = _import(args.spec)
    except Exception as err:  # the user's module: one line, exit 2
        first_line = str(err).splitlines()[0] if str(err) else ""
        return f"--spec: cannot import {args.spec}: {type(err).__name__}: {first_line}"
    if not isinstance(spec, ModuleSpec):
        return f"--spec: {args.spec} is a {type(spec).__name__}, not a typed_transformer.audit.ModuleSpec"
    return spec


def _module_setup(args: argparse.Namespace, config: dict[str, Any]) -> str:
    """The lines that rebuild the audited module (same class, configuration and seeded weights) and its spec in
    a fresh interpreter: the top of every repro the report prints."""
    module_name, _, cls = args.module.partition(":")
    build = "module = spec.build(cls, config) if spec.build is not None else cls(**config)"
    if args.spec == "hf":
        spec_line, build = "from typed_transformer.audit import hf_build, hf_spec", \
            "module = hf_build(cls, config)\nspec = hf_spec(module)"
    elif ":" in args.spec:
        spec_module, _, spec_name = args.spec.partition(":")
        spec_line = f"spec = importlib.import_module({spec_module!r}).{spec_name}"
    else:
        spec_line = f"from typed_transformer.audit import SPECS\nspec = SPECS[{args.spec!r}]"
    return (f"import importlib\n"
            f"from typed_transformer.strategies import randomize_parameters\n"
            f"{spec_line}\n"
            f"cls, config = importlib.import_module({module_name!r}).{cls}, {config!r}\n"
            f"{build}\n"
            f"module = randomize_parameters(module, {args.seed})  # the weights the audit drew (--seed)"
            + (f"\nfrom typed_transformer.audit import library_spec\nspec = library_spec(module, {args.spec!r})"
               if args.spec in _library_names() else ""))


def _library_names() -> tuple[str, ...]:
    from .audit.specs.libraries import LIBRARY_SPECS

    return tuple(LIBRARY_SPECS)


def _audit_options(args: argparse.Namespace, known: Any) -> dict[str, Any] | str:
    """The audit's ``checks``, ``dtypes``, ``max_examples``, ``seed`` and ``budget`` from the flags, or the error
    message."""
    import torch

    names = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
             "bfloat16": torch.bfloat16}
    dtypes = None if args.dtypes is None else [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [] if dtypes is None else [d for d in dtypes if d not in names]
    if bad or dtypes == []:
        return f"--dtypes: unknown dtype {bad[0] if bad else ''!r} (choose {', '.join(names)})"
    checks = None if args.checks is None else [c.strip() for c in args.checks.split(",") if c.strip()]
    if checks is not None and (not checks or any(c not in known for c in checks)):
        unknown = next((c for c in checks if c not in known), "")
        return f"--checks: unknown check {unknown!r} (choose {', '.join(known)})"
    budget = _audit_budget(args)
    if isinstance(budget, str):
        return budget
    expect = _expectations(args.expect)
    if isinstance(expect, str):
        return expect
    if expect and not args.infer:
        return "--expect goes with --infer (declared conventions flags already say every field)"
    options = {"checks": checks, "max_examples": args.max_examples, "seed": args.seed, "budget": budget,
               "expect": expect}
    if args.device is not None:
        from .audit.core.functions import audit_device

        try:
            options["device"] = audit_device(args.device)
        except ValueError as err:
            return f"--device: {err}"
    if dtypes is not None:
        options["dtypes"] = [names[d] for d in dtypes]
    return options


def _expectations(pairs: list[str]) -> dict[str, Any] | str:
    """``--expect NAME=VALUE`` flags as ``known`` fields (scale a number or none, true/false for flags), or the
    error message."""
    from .audit import INFERRED, Conventions

    known: dict[str, Any] = {}
    for pair in pairs:
        name, equals, text = pair.partition("=")
        name = name.strip().replace("-", "_")
        names = (*INFERRED, "half_precision")  # the fields inference decides, and the half-precision standard
        if not equals or name not in names:
            return f"--expect: give NAME=VALUE with NAME among {', '.join(names)}; got {pair!r}"
        value: Any = text.strip()
        if name == "scale":
            try:
                value = None if value.lower() == "none" else float(value)
            except ValueError:
                return f"--expect scale: a number or none; got {text!r}"
        elif isinstance(getattr(Conventions(), name), bool):
            if value.lower() not in ("true", "false"):
                return f"--expect {name}: true or false; got {text!r}"
            value = value.lower() == "true"
        try:
            Conventions(**{name: value})
        except (ValueError, TypeError) as err:
            return f"--expect: {str(err).splitlines()[0]}"
        known[name] = value
    return known


def _audit_a_module(args: argparse.Namespace, candidate: Any, target: str, options: dict[str, Any]) -> Any:
    """``audit --module``: build the class from ``--config``, redraw its parameters from ``--seed`` and audit it
    under its ``--spec``; returns the report, or the error message."""
    import json

    from .audit import AuditUsageError, audit_module
    from .strategies import randomize_parameters

    try:
        config = json.loads(args.config)
    except json.JSONDecodeError as err:
        return f"--config is not valid JSON: {err}"
    if not isinstance(config, dict):
        return "--config must be a JSON object of constructor arguments"
    try:
        if args.spec == "hf":  # zero lines of spec: a tiny config of the class's own, --config overrides
            from .audit import hf_build, hf_spec

            module = hf_build(candidate, config)
            spec = hf_spec(module)
        else:
            spec = _audit_spec(args)
            module = spec.build(candidate, config) if spec.build is not None else candidate(**config)
            from .audit.specs.libraries import LIBRARY_SPECS, library_spec

            if args.spec in LIBRARY_SPECS:  # a library's spec is read from the module it built
                spec = library_spec(module, args.spec)
    except AuditUsageError:
        raise
    except Exception as err:
        first_line = str(err).splitlines()[0] if str(err) else ""
        return f"cannot build {target} from --config: {type(err).__name__}: {first_line}"
    except SystemExit as exit_:
        return f"cannot build {target} from --config: it called sys.exit({exit_.code!r})"
    # default initialisations zero the biases, which would hide bias bugs; --seed makes it reproducible
    module = randomize_parameters(module, args.seed)
    options = {**options, "setup": _module_setup(args, config)}
    name = f"{target} (spec {spec.name})"
    if args.infer:
        known = {} if args.fully_masked is None else {"fully_masked": args.fully_masked}
        known.update(options.pop("expect"))
        return audit_module(module, spec, conventions="infer", name=name, known=known, **options)
    options.pop("expect")
    return audit_module(module, spec, fully_masked=args.fully_masked, name=name, **options)


def _audit_candidate(args: argparse.Namespace, candidate: Any, target: str, declared: dict[str, Any],
                     options: dict[str, Any]) -> Any:
    """The report of the candidate (function or module), or the error message."""
    from .audit import Conventions, audit_attention, takes_enable_gqa

    if args.module is not None:
        return _audit_a_module(args, candidate, target, options)
    if args.infer:  # the conventions flags given beside --infer (and --expect) are what the user knows
        known = {**declared, **options.pop("expect")}
        return audit_attention(candidate, conventions="infer", name=target, known=known, **options)
    options.pop("expect")
    gqa = declared.get("supports_gqa", False)
    conventions = Conventions(**declared, enable_gqa=gqa and takes_enable_gqa(candidate))
    return audit_attention(candidate, conventions=conventions, name=target, **options)


def _audit(args: argparse.Namespace) -> int:
    try:
        from .audit import (
            FUNCTION_CHECKS,
            MODULE_CHECKS,
            AuditUsageError,
            CandidateStopped,
            Conventions,
            call_time_limit,
        )
    except ImportError as err:
        return _fail(f"audit needs the [audit] extra: {install_hint('audit')} ({err})")
    if (args.candidate is None) == (args.module is None):
        return _fail("give either a candidate MODULE:ATTR or --module MODULE:CLASS (with --spec), not both"
                     if args.candidate else "give a candidate MODULE:ATTR or --module MODULE:CLASS --spec NAME")
    if args.module is not None and isinstance(problem := _audit_spec(args), str):
        return _fail(problem)
    target = args.candidate or args.module
    declared = values_of(args, Conventions)  # the conventions flags given (all but --fully-masked: a function's)
    changed = [flag.option for flag in flags_of(Conventions) if flag.dest in declared and flag.dest != "fully_masked"]
    if args.module is not None and changed:
        return _fail(f"{changed[0]} describes a candidate function; a module's conventions come from its --spec")
    if args.candidate is not None and ":" not in args.candidate:
        return _fail(f"candidate must be MODULE:ATTR, got {args.candidate!r}")
    options = _audit_options(args, MODULE_CHECKS if args.module is not None else FUNCTION_CHECKS)
    if isinstance(options, str):
        return _fail(options)
    stdout = sys.stdout
    try:
        isolate = args.isolate if args.isolate is not None else (args.module is None and args.device in (None, "cpu"))
        if isolate and args.module is not None:
            return _fail("--isolate audits a candidate function; a --module is audited in process")
        with call_time_limit(args.call_time_limit), _audited(target, isolate) as found:
            if isinstance(found, str):
                return _fail(found)
            report = _audit_candidate(args, found, target, declared, options)
    except AuditUsageError as err:
        return _fail(str(err).splitlines()[0])
    except CandidateStopped as stopped:  # an exit or a hang: no report, one line, and the audit did not pass
        print(f"audit of {target}: {stopped.line()}")
        return 1
    _restore_stdout(stdout)
    if isinstance(report, str):
        return _fail(report)
    print(report.table())
    if args.json is not None:
        try:
            report.to_json(str(args.json))
        except OSError as err:
            return _fail(f"--json: cannot write {args.json}: {err.strerror}")
    return audit_exit_status(report)


@contextlib.contextmanager
def _audited(target: str, isolate: bool) -> Iterator[Any]:
    """The candidate for the block: imported here, or (``isolate``) in its own process, which ends after the block;
    a string when it cannot be had (the one-line reason)."""
    if isolate:
        from .audit.core.isolation import IsolatedCandidate

        with IsolatedCandidate(target) as isolated:  # an import that fails there: AuditUsageError, one line
            yield isolated
        return
    try:
        candidate = _import(target)
    except Exception as err:  # any import-time error of the user's module: one line, exit 2
        first_line = str(err).splitlines()[0] if str(err) else ""
        yield f"cannot import {target}: {type(err).__name__}: {first_line}"
        return
    except SystemExit as exit_:  # the module ends the interpreter while it is imported
        yield f"cannot import {target}: importing it called sys.exit({exit_.code!r})"
        return
    yield candidate if callable(candidate) else f"{target} is not callable"


def _restore_stdout(before: Any) -> None:
    """The candidate may have replaced or closed ``sys.stdout``: the report goes where it would have (the stream
    the command started with, else a new one on file descriptor 1)."""
    if sys.stdout is before and not getattr(before, "closed", True):
        return
    if before is not None and not before.closed:
        sys.stdout = before
        return
    try:
        sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
    except OSError:  # descriptor 1 is closed too
        sys.stdout = sys.stderr


#: ``audit``'s exit status when every check passed but inference found undeclared differences from the paper's
#: attention (a scale of 1, top-left causal alignment, ...): declare them with ``--expect`` if they are intended.
UNDECLARED_DIFFERENCES = 3


def audit_exit_status(report: Any) -> int:
    """0 passed; 1 a check failed; :data:`UNDECLARED_DIFFERENCES` every check passed but the inferred conventions
    differ from the paper's attention in ways not declared."""
    if report.failed:
        return 1
    return UNDECLARED_DIFFERENCES if report.undeclared else 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code. SIGINT and SIGTERM anywhere end with one line on stderr
    and exit code 130 or 143 (``train`` saves first; see :func:`~typed_transformer.training.train`)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, *TERMINATING)}
    if in_main_thread:
        for signum in TERMINATING:  # SIGHUP as SIGTERM, unless inherited as ignored (nohup)
            if previous[signum] != signal.SIG_IGN or signum == signal.SIGTERM:
                signal.signal(signum, raise_terminated)
        if previous[signal.SIGINT] is signal.default_int_handler:  # Python's, noted for the watchdog
            signal.signal(signal.SIGINT, raise_interrupt)
    try:
        with Watchdog().watching():  # a signal is answered within seconds, also inside one long C call
            return _main(argv)
    except KeyboardInterrupt as interrupt:
        code = exit_code(interrupt)
        if in_main_thread:
            for signum in previous:  # a second signal while we report the first
                signal.signal(signum, signal.SIG_IGN)
        said = "interrupted (Ctrl-C)" if code == 130 else f"terminated ({signal_name(code - 128)})"
        print(f"typed-transformer: {said}", file=sys.stderr)
        return code
    finally:
        if in_main_thread:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _main(argv: list[str] | None) -> int:
    given = sys.argv[1:] if argv is None else argv
    command = next((word for word in given if not word.startswith("-")), None)
    parser = build_parser(audit_conventions=command == "audit")
    if not given:  # bare `typed-transformer`: the usage, as a usage error
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.command in ("train", "train-seq2seq") and args.config is not None:
        try:
            defaults = read_config(args.config, _command_flags(args.command))
        except ValueError as err:
            return _fail(str(err))
        # the file's values as the defaults: the flags override them
        args = build_parser({args.command: defaults}, audit_conventions=False).parse_args(argv)
    if args.command in ("train", "generate", "attention", "train-seq2seq", "translate"):
        return _run_training_command(args)
    if args.command == "audit":
        return _audit(args)
    return 2  # unreachable: argparse requires a known command


if __name__ == "__main__":
    sys.exit(main())
