"""Training a GPT on text: AdamW with decay on matrices only, linear warmup then cosine decay, gradient
clipping, periodic evaluation on fixed batches, checkpoints, resumption and a loss plot.

The schedule (nanoGPT's ``get_lr``)::

    lr(it) = lr_max * (it + 1) / (warmup + 1)                                      it < warmup
           = lr_min + (lr_max - lr_min) * (1 + cos(pi * (it - warmup) / (decay - warmup))) / 2   it <= decay
           = lr_min                                                                 otherwise

Resuming restores the weights, the optimizer state, the iteration and every random-number state (batch
sampling and dropout), so a resumed run's loss curve equals the uninterrupted run's.

Resuming a run with a larger ``max_iters`` (and no explicit ``lr_decay_iters``) stretches the schedule: the
decay length is the new ``max_iters``, so from the resume point on the rate is ``lr(it)`` of the longer
schedule, which is higher than the shorter run's (a finished run resumes at the longer schedule's rate at
that iteration, well above ``lr_min``). The steps already taken followed the shorter schedule, so the weights
differ from an uninterrupted run of the new length. Fix ``lr_decay_iters`` from the start to make a run
resumable to any length on one schedule.

Safety (docs/reliability.md): the output directory is locked for the run (:func:`run_directory`); a fresh run
refuses to replace an existing checkpoint unless ``overwrite=True``; a non-finite loss, gradient norm or weight
stops the run with :class:`TrainingDiverged` before anything non-finite is saved (the last checkpoint stays);
SIGINT (Ctrl-C) and SIGTERM stop between two steps and save; a second one stops at once.

Scale (docs/training.md): ``batch_size`` is the *global* batch of one optimizer step. It is drawn from one
seeded generator and split into ``world_size * grad_accum`` equal micro-batches: process ``r`` of a
``torch.distributed`` group (``torchrun``) takes rows ``[r B/W, (r+1) B/W)`` and runs them as ``grad_accum``
micro-batches, each loss scaled by ``1/grad_accum``, gradients all-reduced (averaged) by
``DistributedDataParallel`` on the last micro-batch only (``no_sync`` on the others). The mean of equal-sized
micro-batch means is the batch mean, so the data and the update do not depend on the number of processes or
of micro-batches (up to float32 summation order; tested). Rank 0 alone evaluates, prints and writes the
checkpoint and the plot. ``dtype`` runs the forward passes under ``torch.autocast`` (float16 with a
``GradScaler``, CUDA only); ``compile`` runs the training steps through ``torch.compile``.
"""

import contextlib
import dataclasses
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Generic, Protocol, TextIO, TypeVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ._deprecation import warn_deprecated
from ._signals import Terminated, note_taken
from .checkpoint import CHECKPOINT_NAME, Checkpoint, RunDirectoryError, run_directory, save_checkpoint
from .config import DTYPES, PRESET_TRAINING, TrainConfig
from .data import TextData, get_batch
from .generation import sample_text
from .gpt import GPT
from .muon import MuonAdamW, muon_groups
from .plot import plot_history
from .shapecheck import shape_checked, typechecked
from .threads import RunThreads, at_each_count, fix_threads, resolve_threads

__all__ = [
    "DTYPES",
    "PRESET_TRAINING",
    "LoopSettings",
    "PeerFailed",
    "StepLoop",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingDiverged",
    "evaluate",
    "flops_per_token",
    "learning_rate",
    "measure_matmul_flops",
    "measure_peak_flops",
    "remeasure_peak",
    "train",
]


def measure_peak_flops(device: str, dtype: torch.dtype, threads: int | str | None) -> tuple[float, int]:
    """The peak FLOP/s that MFU is reported against, and the thread count it was measured at: with a fixed
    count (``threads`` an int, or the user's ``OMP_NUM_THREADS``/``torch.set_num_threads``), at that count; with
    ``"auto"`` on CPU, the fastest of the candidate counts (:func:`~typed_transformer.threads.at_each_count`),
    since the steps will run at the fastest count too (one thread when another process holds a core, where the
    default count's matmuls collapse and would make MFU read several hundred percent)."""
    choice = resolve_threads(threads)
    if choice.count is not None or torch.device(device).type != "cpu":
        if choice.source == "--threads" and choice.count is not None:
            torch.set_num_threads(choice.count)
        return measure_matmul_flops(device, dtype), torch.get_num_threads()
    rates = at_each_count(lambda: measure_matmul_flops(device, dtype))
    best = max(rates, key=lambda count: rates[count])
    return rates[best], best


def learning_rate(config: TrainConfig, iteration: int) -> float:
    """The learning rate at ``iteration`` (see the module docstring)."""
    decay = config.lr_decay_iters or config.max_iters
    if iteration < config.warmup_iters:
        return config.learning_rate * (iteration + 1) / (config.warmup_iters + 1)
    if iteration > decay:
        return config.min_lr
    progress = (iteration - config.warmup_iters) / max(decay - config.warmup_iters, 1)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.learning_rate - config.min_lr)


def flops_per_token(model: GPT) -> float:
    """Training FLOPs per token (forward and backward): ``6 N + 12 L h d T`` (PaLM's appendix B, nanoGPT's
    ``estimate_mfu``): N parameters without positions, L layers, h heads of size d, context T."""
    c = model.config
    return 6.0 * model.num_parameters() + 12.0 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size


def measure_matmul_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, *, size: int = 512,
                         seconds: float = 0.1) -> float:
    """FLOP/s of square ``size`` matmuls in ``dtype`` on ``device`` with torch's current threads (the peak that
    MFU is reported against): the best rate of windows of 4 matmuls, over about ``seconds``. The best window, not
    the mean, so that another process running for part of the measurement does not lower the peak (which
    would overstate MFU; sustained load still does)."""
    generator = torch.Generator().manual_seed(0)  # not the global one: dropout's stream stays untouched
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    cuda = torch.device(device).type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    torch.mm(a, b)
    sync()
    best = 0.0
    first = start = time.perf_counter()
    while True:
        for _ in range(4):
            torch.mm(a, b)
        sync()
        end = time.perf_counter()
        if end > start:
            best = max(best, 2.0 * size**3 * 4 / (end - start))
        if end - first >= seconds:
            return best
        start = end


@torch.no_grad()
def evaluate(model: GPT, batches: dict[str, list[tuple[Int[Tensor, "b t"], Int[Tensor, "b t"]]]], *,
             autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
             ) -> dict[str, float]:
    """Mean loss over fixed batches for each split, in eval mode under ``autocast()`` (default: none)."""
    was_training = model.training
    model.eval()
    losses = {}
    for split, pairs in batches.items():
        total = 0.0
        for x, y in pairs:
            with autocast():
                _, loss = model(x, y)
            assert loss is not None
            total += float(loss)
        losses[split] = total / len(pairs)
    model.train(was_training)
    return losses


evaluate = typechecked(evaluate)


@dataclass
class TrainResult:
    model: GPT
    history: list[dict[str, float]]
    iteration: int
    interrupted: bool
    checkpoint: Path
    sample: str
    #: The signal that stopped an interrupted run (``signal.SIGINT`` or ``signal.SIGTERM``), else None.
    signal: int | None = None
    #: The training loss of every step of this call (the global batch's mean, the same on every rank).
    losses: list[float] | None = None
    #: Tokens per second of all processes together over the training steps after the first (evaluations,
    #: saves and the first step, which compiles with ``compile``, excluded); NaN after a single step.
    tokens_per_second: float = float("nan")
    #: Model FLOPs utilisation: ``flops_per_token * tokens_per_second / (world_size * peak_flops)``, against the
    #: higher of the peaks measured at the start and the end of the run (a load that falls during the run
    #: makes the start's too low), or the given ``peak_flops``.
    mfu: float = float("nan")
    #: The peaks measured at the start and the end (FLOP/s of one process; empty when ``peak_flops`` was given).
    peaks: tuple[float, ...] = ()
    #: The intra-op thread count at the end of the run (``config.threads``, or what ``"auto"`` chose).
    threads: int | None = None


def remeasure_peak(result: TrainResult, start: float, measure: Callable[[], float]) -> TrainResult:
    """``result`` of a finished run whose peak ``start`` was measured at its start: the peak measured again now
    (``measure()``), MFU against the higher of the two (a load that fell during the run made the first too low),
    both in ``peaks``. An interrupted run, or one without a throughput, is returned as it is."""
    if result.interrupted or not math.isfinite(result.mfu):
        return result
    end = measure()
    return dataclasses.replace(result, mfu=result.mfu * start / max(start, end), peaks=(start, end))


R = TypeVar("R")
T = TypeVar("T")


class TrainingDiverged(RuntimeError):
    """The loss, the gradient norm or a weight became NaN or infinite; nothing non-finite was saved.

    ``iteration`` is where it happened, ``checkpoint`` the last (finite) checkpoint kept, or None.
    """

    def __init__(self, message: str, iteration: int, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.iteration = iteration
        self.checkpoint = checkpoint


class PeerFailed(RuntimeError):
    """Another process of a multi-process run (``torchrun``) stopped, so a collective operation failed.

    ``checkpoint`` is the last checkpoint on disk (None: none yet) and ``iteration`` its iteration; ``report``
    says whether this process is the one to say so (rank 0, or another rank when rank 0 is the process that
    stopped), so that the run prints one line, not one per process.
    """

    def __init__(self, message: str, checkpoint: Path | None, iteration: int | None, report: bool) -> None:
        super().__init__(message)
        self.checkpoint, self.iteration, self.report = checkpoint, iteration, report


def _is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is a collective operation failing because another process went away (gloo reports
    it as a plain RuntimeError naming its own source file; NCCL and the store as ``torch.distributed``'s
    errors)."""
    import torch.distributed as dist

    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("gloo/" in text or "Connection reset by peer" in text
                                              or "Connection closed by peer" in text)


def _cause(err: BaseException) -> str:
    """The first sentence of a collective's error, without gloo's ``[file.cc:line]`` prefix."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if first.startswith("[") and "] " in first:
        first = first.split("] ", 1)[1]
    return first.split(". ", 1)[0].rstrip(".")


class _Interrupt:
    """Turn the first Ctrl-C or SIGTERM into a flag checked between steps (a second one stops at once:
    KeyboardInterrupt, or :class:`Terminated` for SIGTERM)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP (a closed terminal) as SIGTERM

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for signum in self.SIGNALS:
                if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                    continue  # started under nohup: a hang-up is meant not to stop the run
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        note_taken()  # the watchdog's sign that the main thread is not stuck in one long C call
        if self.requested is not None:
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)
        self.requested = signum

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


def _world() -> tuple[int, int]:
    """(rank, world size) of the initialised default ``torch.distributed`` group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train(
    model: GPT,
    data: TextData,
    config: TrainConfig,
    out_dir: str | Path,
    *,
    resume: Checkpoint | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    progress: bool = True,
    log: TextIO | None = None,
    info: dict[str, Any] | None = None,
    on_step: Callable[[int], None] | None = None,
    peak_flops: float | None = None,
    compile_backend: str = "inductor",
) -> TrainResult:
    """Train ``model`` on ``data`` and write ``out_dir/checkpoint.safetensors`` and ``out_dir/loss.png``.

    A checkpoint is written every ``checkpoint_interval`` iterations, at the end, and when Ctrl-C or SIGTERM
    stops the run (between two steps, so the saved state is consistent). ``resume`` continues a saved run.

    Inside an initialised ``torch.distributed`` group (``torchrun``) every process calls this with the same
    arguments; the model is wrapped in ``DistributedDataParallel`` and rank 0 alone evaluates, prints, holds the
    run directory's lock and writes files (see the module docstring). ``peak_flops`` (FLOP/s of one process) is
    what MFU is reported against; by default it is measured (:func:`measure_peak_flops`, in float32 on CPU at
    the fastest thread count with ``threads="auto"``, in ``config.dtype`` on CUDA). ``compile_backend`` is
    ``torch.compile``'s backend when ``config.compile``.

    Raises:
        RunDirectoryError: ``out_dir`` is unusable (a file, not writable, locked by another run, too little free
            space for two checkpoints: :func:`~typed_transformer.checkpoint.require_free_space`), or it holds a
            checkpoint and neither ``resume`` nor ``overwrite`` was given.
        TrainingDiverged: the loss, the gradient norm or the weights became non-finite; the last checkpoint
            (finite) is kept and nothing was saved after it.
        PeerFailed: another process of a ``torchrun`` run stopped (its message names the last checkpoint).
        ValueError: ``batch_size`` is not divisible by ``world_size * grad_accum``, or float16 on a CPU.
        OSError: a checkpoint or the plot could not be written (the previous checkpoint is intact).
    """
    out = Path(out_dir)
    rank, world = _world()
    if config.batch_size % (world * config.grad_accum) != 0:
        raise ValueError(f"batch_size={config.batch_size} is not divisible by {world} processes x grad_accum="
                         f"{config.grad_accum}: the global batch is split into equal micro-batches")
    if config.dtype == "float16" and torch.device(device).type != "cuda":
        raise ValueError("dtype float16 needs CUDA (autocast with a gradient scaler); on CPU use float32 or "
                         "bfloat16")
    with run_directory(out) if rank == 0 else contextlib.nullcontext(out):
        if resume is None and not overwrite and (out / CHECKPOINT_NAME).exists():
            raise RunDirectoryError(f"{out / CHECKPOINT_NAME} exists: continue that run with --resume or "
                                    "replace it with --overwrite")
        if rank == 0:  # a full disk found now, not at the first save
            from ._memory import require_training_memory
            from .checkpoint import require_free_space

            count = sum(p.numel() for p in model.parameters())
            require_training_memory(count, allocated=count, advice="train a smaller model, or on a larger machine")
            evaluations = len(resume.history) if resume is not None else 0
            require_free_space(out, model, evaluations=evaluations + config.max_iters // config.eval_interval + 2)
        return Trainer(model, data, config, out, resume=resume, device=device, progress=progress, log=log,
                       info=info, on_step=on_step, peak_flops=peak_flops, compile_backend=compile_backend).run()


def _non_finite_weight(model: GPT) -> str | None:
    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            return name
    return None


def _checked_call(model: GPT, net: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """``net(x, y)``'s loss, with ``x`` and ``y`` shape-checked here, outside the compiled module (checks do
    not run while ``torch.compile`` traces) against the model's vocabulary-free contract: both ``(b, t)``
    with ``t <= block_size``."""
    block = model.config.block_size

    def loss_of(x: Int[Tensor, "b t"], y: Int[Tensor, "b t"]) -> Tensor:
        if x.shape[1] > block:
            raise ValueError(f"train: batches of {x.shape[1]} positions, more than block_size={block}")
        _, loss = net(x, y)
        assert isinstance(loss, Tensor)
        return loss

    return typechecked(loss_of) if net is not model else loss_of


class LoopSettings(Protocol):
    """What :class:`StepLoop` reads of a run's settings (:class:`TrainConfig` has every one)."""

    @property
    def max_iters(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def grad_accum(self) -> int: ...
    @property
    def grad_clip(self) -> float: ...
    @property
    def dtype(self) -> str: ...
    @property
    def compile(self) -> bool: ...
    @property
    def seed(self) -> int: ...
    @property
    def eval_interval(self) -> int: ...
    @property
    def checkpoint_interval(self) -> int: ...
    @property
    def threads(self) -> int | str: ...


@shape_checked
class StepLoop(Generic[R]):
    """The training loop of every model the package trains, with one step path for every setting: the global
    batch (:meth:`next_batch`) is split into ``grad_accum`` micro-batches, each forward pass runs under
    :meth:`autocast` (disabled for float32), each loss goes backward through ``GradScaler(enabled=dtype ==
    "float16")`` (a pass-through otherwise), ``DistributedDataParallel`` all-reduces on the last micro-batch only,
    gradients are clipped to ``grad_clip`` (0: not clipped) and a non-finite loss stops the run before the
    update. Ctrl-C and SIGTERM stop between two steps; the thread count is fixed or timed on the steps
    (``threads``).

    A model's trainer gives its parts: :meth:`make_optimizer`, :meth:`make_loss` (the loss of one micro-batch,
    ``self.loss_of``), :meth:`learning_rate`, :meth:`next_batch`, :meth:`evaluation`, :meth:`save`,
    :meth:`_restore` and :meth:`_result`; :meth:`before_step` says when to evaluate and save (by default: save
    every ``checkpoint_interval`` steps, then evaluate every ``eval_interval``). :class:`Trainer` is the GPT's;
    the encoder-decoder's is in :mod:`~typed_transformer.seq2seq_training`.
    """

    #: The progress bar's label.
    desc = "train"
    #: Whether :meth:`save` keeps ``run_threads.state()`` (then a change of count writes a checkpoint).
    keeps_thread_state = False
    __shape_checked__: tuple[str, ...] = ("next_batch", "micro_loss")

    def __init__(self, model: nn.Module, config: LoopSettings, out: Path, *, resume: Any = None,
                 device: str = "cpu", progress: bool = True, log: TextIO | None = None,
                 on_step: Callable[[int], None] | None = None, peak_flops: float | None = None,
                 compile_backend: str = "inductor") -> None:
        self.model, self.config, self.out, self.device = model, config, out, device
        self.log = log if log is not None else sys.stderr
        self.on_step, self.progress = on_step, progress
        self.rank, self.world = _world()
        self.main = self.rank == 0
        model.to(device).train()
        self.device_type = torch.device(device).type
        self.amp_dtype = DTYPES[config.dtype]
        self.prepare()
        self.optimizer = self.make_optimizer()
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=config.dtype == "float16")
        self.batch_generator = torch.Generator().manual_seed(config.seed)
        torch.manual_seed(config.seed + self.rank)  # dropout (each rank its own masks)
        self.history: list[dict[str, float]] = []
        self.start = 0
        self.saved: tuple[int, Path] | None = None  # (iteration, path) of the last checkpoint written
        self.thread_state: dict[str, Any] | None = None  # the resumed run's RunThreads.state(), if it kept one
        if resume is not None:
            self._restore(resume)
        self.iteration = self.start
        self.net, self.ddp = self._wrap(compile_backend)
        self.loss_of = self.make_loss()
        self.peak_flops = self.peak(peak_flops)
        self.losses: list[float] = []  # every step's loss in this run
        self.step_seconds = 0.0  # time in the steps after the first
        self.bar: Any = None
        # The thread count: fixed now, or timed on trial steps that are not kept (threads.RunThreads), the
        # resumed run's schedule continued where the checkpoint left it.
        self.threads = fix_threads(config.threads)
        self.run_threads = None if self.threads.count is not None else RunThreads(
            self.trial_step, state=self.thread_state, log=self.say if self.main else None)
        self.last_step_seconds = 0.0

    # -- the model's parts -----------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Set up what the optimizer and the steps need (called first in ``__init__``)."""

    def make_optimizer(self) -> torch.optim.Optimizer:
        raise NotImplementedError

    def make_loss(self) -> Callable[[Tensor, Tensor], Tensor]:
        """The loss of one micro-batch ``(inputs, targets)``, through ``self.net``."""
        raise NotImplementedError

    def peak(self, peak_flops: float | None) -> float | None:
        """The peak FLOP/s that MFU is reported against (None: no MFU)."""
        return peak_flops

    def learning_rate(self, iteration: int) -> float:
        raise NotImplementedError

    def next_batch(self) -> tuple[Int[Tensor, "b _"], Int[Tensor, "b _"]]:
        """This process's rows of the step's global batch: inputs and targets, ``b`` rows each."""
        raise NotImplementedError

    def evaluation(self, iteration: int) -> None:
        raise NotImplementedError

    def save(self, iteration: int) -> Path:
        raise NotImplementedError

    def _restore(self, resume: Any) -> None:
        raise NotImplementedError

    def _result(self, path: Path, stop: int | None) -> R:
        raise NotImplementedError

    # -- the loop ----------------------------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward passes' autocast context (disabled for float32)."""
        return torch.autocast(self.device_type, dtype=self.amp_dtype, enabled=self.amp_dtype != torch.float32)

    def _wrap(self, compile_backend: str) -> tuple[nn.Module, Any]:
        """The module the steps call (compiled with ``compile``, then in ``DistributedDataParallel`` across
        processes) and the DDP wrapper (None in one process)."""
        net: nn.Module = self.model
        if self.config.compile:
            net = torch.compile(net, backend=compile_backend)  # type: ignore[assignment]
        if self.world == 1:
            return net, None
        from torch.nn.parallel import DistributedDataParallel

        index = torch.device(self.device).index
        ddp = DistributedDataParallel(net, device_ids=[index] if self.device_type == "cuda" and index is not None
                                      else None, forward_sync_buffers=False)
        return ddp, ddp

    def run(self) -> R:
        """Train to ``max_iters`` (or until Ctrl-C/SIGTERM), evaluate, save; every rank returns the result.

        Raises:
            PeerFailed: another process of a multi-process run stopped (killed, crashed): the collective
                operation that waited for it failed.
        """
        self.bar = self._progress_bar()
        stop: int | None = None
        path = self.out / CHECKPOINT_NAME
        try:
            # the message is made inside _Interrupt: torchrun's SIGTERM to the survivors only marks a stop there
            with _Interrupt() as interrupt, self._peers_watched():
                stop = self._loop(interrupt)
                if stop is None:
                    self.evaluation(self.iteration)
                if self.main:
                    path = self.save(self.iteration)
        finally:
            if self.bar is not None:
                self.bar.close()
        if self.world > 1:  # every rank leaves together, after rank 0's last save (one tearing down early can abort)
            import torch.distributed as dist

            with self._peers_watched():
                dist.barrier()
        return self._result(path, stop)

    @contextlib.contextmanager
    def _peers_watched(self) -> Iterator[None]:
        """A collective operation that fails because another process stopped raises :class:`PeerFailed`."""
        try:
            yield
        except RuntimeError as err:
            if self.world > 1 and not isinstance(err, TrainingDiverged) and _is_peer_failure(err):
                raise self.peer_failed(err) from err
            raise

    def peer_failed(self, err: BaseException) -> PeerFailed:
        """The one-line error of a run whose other process stopped: where, why, and the last checkpoint on disk
        (rank 0 wrote it atomically, so a process killed during a save leaves the one before)."""
        from ._files import is_held
        from .checkpoint import LOCK_NAME, saved_iteration

        path = self.out / CHECKPOINT_NAME
        iteration = self.saved[0] if self.main and self.saved is not None else saved_iteration(path)
        kept = (f"the last good checkpoint is {path} (iteration {iteration}): continue with --resume"
                if iteration is not None else "no checkpoint was written yet")
        message = (f"training stopped at iteration {self.iteration}: another of the run's {self.world} processes "
                   f"stopped ({_cause(err)}); {kept}")
        # Rank 0 reports; another rank only when rank 0 is gone (its lock on the run directory is released).
        report = self.main or not is_held(self.out / LOCK_NAME)
        return PeerFailed(message, path if iteration is not None else None, iteration, report)

    def _progress_bar(self) -> Any:
        if not (self.progress and self.main):
            return None
        from tqdm import tqdm

        return tqdm(total=self.config.max_iters, initial=self.start, desc=self.desc, unit="it", file=self.log,
                    dynamic_ncols=True)

    def _loop(self, interrupt: "_Interrupt") -> int | None:
        """Steps until ``max_iters``; returns the signal that stopped them early, else None."""
        while self.iteration < self.config.max_iters:
            iteration = self.iteration
            self.retune_threads(iteration)
            self.before_step(iteration)
            loss, self.last_step_seconds = self.measure(lambda: self.step(interrupt))
            if iteration > self.start:  # the first step (compilation, allocator warm-up) is not counted
                self.step_seconds += self.last_step_seconds
            self.losses.append(loss)
            self.iteration += 1
            self.after_step(self.iteration, loss)
            if interrupt.requested is not None:
                return interrupt.requested
        return None

    def measure(self, work: Callable[[], T]) -> tuple[T, float]:
        """``work()`` and its seconds: the one clock of the steps and the thread trials (so that a test can give
        them the timings of a changing load)."""
        t0 = time.perf_counter()
        result = work()
        return result, time.perf_counter() - t0

    def retune_threads(self, iteration: int) -> None:
        """With ``threads="auto"``, when a re-check is due: time the counts on trial steps; a change of count
        after the run's first step is written in a checkpoint at ``iteration`` (rank 0), so that a resumed run
        and the one it resumes change counts at the same iteration."""
        if self.run_threads is not None and self.run_threads.tune(iteration) and iteration > self.start \
                and self.main and self.keeps_thread_state:
            self.save(iteration)

    def trial_step(self) -> float:
        """Seconds of one micro-batch's forward and backward that is not kept, to time a thread count: the batch
        generator's and the random-number states are restored after it and its gradients dropped, so the run's
        next step is what it would have been without it."""
        state = self.batch_generator.get_state()
        devices = [torch.device(self.device).index or 0] if self.device_type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                _, seconds = self.measure(self._trial_pass)
        finally:
            self.batch_generator.set_state(state)
            self.optimizer.zero_grad(set_to_none=True)
        return seconds

    def _trial_pass(self) -> None:
        x, y = self.next_batch()
        micro = x.shape[0] // self.config.grad_accum
        with contextlib.nullcontext() if self.ddp is None else self.ddp.no_sync():  # no all-reduce: not a step
            with self.autocast():
                loss = self.micro_loss(x[:micro], y[:micro])
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]

    def before_step(self, iteration: int) -> None:
        """Before the step at ``iteration``: rank 0 saves every ``checkpoint_interval`` steps (not where the run
        started), then evaluation every ``eval_interval`` (once per iteration, a resumed one included)."""
        if iteration > self.start and iteration % self.config.checkpoint_interval == 0 and self.main:
            self.save(iteration)
        if iteration % self.config.eval_interval == 0 and not any(h["iter"] == iteration for h in self.history):
            self.evaluation(iteration)

    def step(self, interrupt: "_Interrupt") -> float:
        """One optimizer step at ``self.iteration``; returns its loss (the global batch's mean, on every rank)."""
        lr = self.learning_rate(self.iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.next_batch()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._backward(x, y, interrupt)
        if not math.isfinite(loss):
            raise self.diverged(self.iteration, f"the training loss is {loss}")
        self.scaler.unscale_(self.optimizer)
        if self.config.grad_clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))
            if not math.isfinite(norm) and not self.scaler.is_enabled():  # the scaler skips such steps itself
                raise self.diverged(self.iteration, f"the gradient norm is {norm}")
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss

    def micro_loss(self, x: Int[Tensor, "b _"], y: Int[Tensor, "b _"]) -> Float[Tensor, ""]:
        """The loss of one micro-batch (called under :meth:`autocast`)."""
        return self.loss_of(x.to(self.device), y.to(self.device))

    def _backward(self, x: Int[Tensor, "b _"], y: Int[Tensor, "b _"], interrupt: "_Interrupt") -> float:
        """Gradients of the batch mean over ``grad_accum`` micro-batches; returns the loss (all-reduced)."""
        accum = self.config.grad_accum
        micro = x.shape[0] // accum
        total = torch.zeros((), device=self.device)
        for m in range(accum):
            sync = self.ddp is None or m == accum - 1  # DDP all-reduces the gradients on the last micro-batch only
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                with self.autocast():
                    loss = self.micro_loss(x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro])
                part = loss / accum if accum > 1 else loss
                self.scaler.scale(part).backward()  # type: ignore[no-untyped-call]
            total += part.detach().float()
        if self.world > 1:
            total = self._all_reduce(total, interrupt)
        return float(total)

    def _all_reduce(self, total: Float[Tensor, ""], interrupt: "_Interrupt") -> Float[Tensor, ""]:
        """One small all-reduce: the loss (for every rank's divergence check and the log) and whether any rank
        was asked to stop, so that all ranks stop at the same step."""
        import torch.distributed as dist

        asked = 0.0 if interrupt.requested is None else 1.0
        stats = torch.stack([total, torch.tensor(asked, device=self.device)])
        dist.all_reduce(stats)
        if float(stats[1]) > 0 and interrupt.requested is None:
            interrupt.requested = signal.SIGINT
        return stats[0] / self.world

    def after_step(self, iteration: int, loss: float) -> None:
        """After each optimizer step (``iteration`` steps done): the thread tuner sees the step's time, then
        ``on_step(iteration)``, then the progress bar (with :meth:`progress_postfix`)."""
        if self.run_threads is not None:
            self.run_threads.observe(self.last_step_seconds)
        if self.on_step is not None:
            self.on_step(iteration)
        if self.bar is not None:  # every step counts (the first too), so the bar ends at max_iters/max_iters
            postfix = self.progress_postfix(iteration, loss)
            if postfix:
                self.bar.set_postfix(**postfix, refresh=False)
            self.bar.update(1)

    def progress_postfix(self, iteration: int, loss: float) -> dict[str, str]:
        """What the progress bar shows after the step that made ``iteration``."""
        return {"loss": f"{loss:.4f}"}

    def say(self, message: str) -> None:
        """Print a line to the log (above the progress bar when there is one)."""
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, file=self.log, flush=True)

    def diverged(self, iteration: int, what: str) -> "TrainingDiverged":
        saved = self.saved
        kept = (f"kept the checkpoint of iteration {saved[0]} ({saved[1]})" if saved is not None
                else "no checkpoint was written")
        return TrainingDiverged(f"training diverged at iteration {iteration}: {what}; {kept}; lower the learning "
                                "rate (--lr)", iteration, saved[1] if saved is not None else None)


@shape_checked
class Trainer(StepLoop[TrainResult]):
    """The GPT's training loop (:func:`train` holds the run directory's lock around it): build it with
    ``train``'s arguments inside that lock, then :meth:`run` it once. The step path is :class:`StepLoop`'s.

    Extension points (override in a subclass, or pass ``on_step`` to :func:`train`):

    - :meth:`after_step` runs after every optimizer step with the new iteration and the step's loss; it calls
      ``on_step`` and advances the progress bar. Per-step work that is not training (re-checking the thread
      count, logging) goes there.
    - :meth:`next_batch` draws the step's global batch and returns this process's rows ``(inputs, targets)``;
      :meth:`micro_loss` is the loss of one micro-batch (``self.loss_of``: the model's ``(x, y) -> loss``).
    - :meth:`evaluate_splits` gives the evaluation losses by split; :meth:`save` writes the checkpoint (after
      checking that the weights are finite) and the loss plot.
    """

    model: GPT
    config: TrainConfig
    keeps_thread_state = True
    __shape_checked__ = ("next_batch",)

    def __init__(self, model: GPT, data: TextData, config: TrainConfig, out: Path, *, resume: Checkpoint | None = None,
                 device: str = "cpu", progress: bool = True, log: TextIO | None = None,
                 info: dict[str, Any] | None = None, on_step: Callable[[int], None] | None = None,
                 peak_flops: float | None = None, compile_backend: str = "inductor") -> None:
        self.data, self.info = data, info
        self._plotted = -1  # len(history) when loss.png was last drawn
        super().__init__(model, config, out, resume=resume, device=device, progress=progress, log=log,
                         on_step=on_step, peak_flops=peak_flops, compile_backend=compile_backend)
        self.tokens_per_step = config.batch_size * self.block

    def prepare(self) -> None:
        self.block = self.model.config.block_size
        self.eval_batches = self._eval_batches()

    def make_optimizer(self) -> torch.optim.Optimizer:
        # fused: one kernel for every parameter's update (CPU and CUDA), the same update as torch's default
        # foreach path up to float rounding (tested) and several times faster on CPU at the baby preset
        # (benchmarks/main_job_profile.py prints both side by side).
        fused = True if self.device_type in ("cpu", "cuda") else None
        betas = (self.config.beta1, self.config.beta2)
        if self.config.optimizer == "muon":  # Muon on the hidden matrices, AdamW on the rest (typed_transformer.muon)
            return MuonAdamW(muon_groups(self.model, [self.model.lm_head], weight_decay=self.config.weight_decay,
                                         lr_scale=self.config.muon_lr / self.config.learning_rate,
                                         ns_steps=self.config.ns_steps),
                             lr=self.config.learning_rate, betas=betas, fused=fused)
        return torch.optim.AdamW(self.model.parameter_groups(self.config.weight_decay), lr=self.config.learning_rate,
                                 betas=betas, fused=fused)

    def make_loss(self) -> Callable[[Tensor, Tensor], Tensor]:
        return _checked_call(self.model, self.net)

    def peak(self, peak_flops: float | None) -> float | None:
        self.peaks: tuple[float, ...] = ()
        if self.main and peak_flops is None:
            peak_flops = self.measure_peak()
            self.peaks = (peak_flops,)
        return peak_flops

    def measure_peak(self) -> float:
        return measure_peak_flops(self.device, torch.float32 if self.device_type == "cpu" else self.amp_dtype,
                                  self.config.threads)[0]

    def learning_rate(self, iteration: int) -> float:
        return learning_rate(self.config, iteration)

    def _eval_batches(self) -> dict[str, list[tuple[Int[Tensor, "b t"], Int[Tensor, "b t"]]]]:
        """Fixed evaluation batches: the same windows at every evaluation and after a resume (rank 0 evaluates)."""
        generator = torch.Generator().manual_seed(self.config.seed + 1)
        batches: dict[str, list[tuple[Tensor, Tensor]]] = {}
        size, count = self.config.batch_size, self.config.eval_iters
        for split, ids in (("train", self.data.train), ("val", self.data.val)) if self.main else ():
            pairs = (get_batch(ids, size, self.block, generator) for _ in range(count))
            batches[split] = [(x.to(self.device), y.to(self.device)) for x, y in pairs]
        return batches

    def _restore(self, resume: Checkpoint) -> None:
        """Continue ``resume``: optimizer, batch sampling and dropout states, history and iteration."""
        if resume.optimizer_state is not None:
            self.optimizer.load_state_dict(resume.optimizer_state)
        if "batches" in resume.rng:
            self.batch_generator.set_state(resume.rng["batches"])
        if "torch" in resume.rng and self.main:
            torch.set_rng_state(resume.rng["torch"])
        elif not self.main:  # the checkpoint holds rank 0's dropout state; the others draw fresh masks
            torch.manual_seed(self.config.seed + self.rank + 7919 * resume.iteration)
        self.history = list(resume.history)
        self.start = resume.iteration
        self.thread_state = resume.info.get("thread_state")
        if (self.out / CHECKPOINT_NAME).exists():
            self.saved = (self.start, self.out / CHECKPOINT_NAME)

    def next_batch(self) -> tuple[Int[Tensor, "b t"], Int[Tensor, "b t"]]:
        """This process's rows of the step's global batch, drawn from the seeded batch generator."""
        x, y = get_batch(self.data.train, self.config.batch_size, self.block, self.batch_generator)
        if self.world > 1:
            rows = self.config.batch_size // self.world
            x, y = x[self.rank * rows:(self.rank + 1) * rows], y[self.rank * rows:(self.rank + 1) * rows]
        return x, y

    def progress_postfix(self, iteration: int, loss: float) -> dict[str, str]:
        if self.step_seconds <= 0:
            return {}
        speed = self.tokens_per_step * (iteration - self.start - 1) / self.step_seconds
        mfu = (f"{100 * flops_per_token(self.model) * speed / (self.world * self.peak_flops):.1f}%"
               if self.peak_flops else "?")
        return {"loss": f"{loss:.4f}", "tok_s": f"{speed:,.0f}", "mfu": mfu}

    def evaluate_splits(self) -> dict[str, float]:
        """The mean loss of each split's fixed evaluation batches."""
        return evaluate(self.model, self.eval_batches, autocast=self.autocast)

    def evaluation(self, iteration: int) -> None:
        """Rank 0: evaluate, stop on a non-finite loss, append to the history and print."""
        if not self.main:
            return
        losses = self.evaluate_splits()
        if not all(math.isfinite(v) for v in losses.values()):
            raise self.diverged(iteration, f"the evaluation loss is {losses}")
        self.history.append({"iter": iteration, **losses})
        self.say(f"iter {iteration:5d}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    def save(self, iteration: int) -> Path:
        """Check the weights, write the checkpoint and (after a new evaluation) the loss plot; returns the path."""
        bad = _non_finite_weight(self.model)
        if bad is not None:
            raise self.diverged(iteration, f"weight {bad} holds NaN or infinity")
        # Finite but exploded weights (a huge step) show as a non-finite loss: one batch decides before saving.
        probe = evaluate(self.model, {"val": self.eval_batches["val"][:1]}, autocast=self.autocast)["val"]
        if not math.isfinite(probe):
            raise self.diverged(iteration, f"the loss of the weights to be saved is {probe}")
        rng = {"batches": self.batch_generator.get_state(), "torch": torch.get_rng_state()}
        info: dict[str, Any] = {} if self.info is None else {
            **self.info, "threads": f"{torch.get_num_threads()} ({self.threads.source})"}
        if self.run_threads is not None:  # the thread schedule, for a resumed run to continue
            info["thread_state"] = self.run_threads.state()
        path = save_checkpoint(self.out / CHECKPOINT_NAME, self.model, self.data.tokenizer, iteration=iteration,
                               train_config=asdict(self.config), history=self.history, optimizer=self.optimizer,
                               rng=rng, info=info)
        self.saved = (iteration, path)
        if self._plotted != len(self.history):  # the curve changes only with a new evaluation
            plot_history(self.history, self.out / "loss.png")
            self._plotted = len(self.history)
        return path

    def _result(self, path: Path, stop: int | None) -> TrainResult:
        """The run's result: throughput over the timed steps, MFU and (rank 0, finished runs) the sample."""
        steps = self.iteration - self.start - 1  # timed steps: all but the first
        speed = (self.tokens_per_step * steps / self.step_seconds if steps > 0 and self.step_seconds > 0
                 else float("nan"))
        mfu = flops_per_token(self.model) * speed / (self.world * self.peak_flops) if self.peak_flops else float("nan")
        sample = ""
        if self.config.sample_tokens and stop is None and self.main:
            sample = sample_text(self.model, self.data.tokenizer, self.config.sample_tokens, seed=self.config.seed,
                                 device=self.device, autocast=self.autocast)
        result = TrainResult(self.model, self.history, self.iteration, stop is not None, path, sample, signal=stop,
                             losses=self.losses, tokens_per_second=speed, mfu=mfu, threads=torch.get_num_threads())
        return remeasure_peak(result, self.peaks[0], self.measure_peak) if self.peaks else result


def __getattr__(name: str) -> Any:
    """Old import paths: ``compile_for_generation`` moved to :mod:`~typed_transformer.generation`."""
    if name == "compile_for_generation":
        from . import generation

        warn_deprecated("typed_transformer.training.compile_for_generation is deprecated, use "
                        "typed_transformer.generation.compile_for_generation")
        return generation.compile_for_generation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
