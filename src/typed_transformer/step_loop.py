"""The step loop every trainer of the package shares (:class:`StepLoop`): one step path for every setting
(micro-batches, autocast, the gradient scaler, ``DistributedDataParallel``, clipping), the stop on Ctrl-C or
SIGTERM between two steps, the thread count, and the errors a run ends with (:class:`TrainingDiverged`,
:class:`PeerFailed`). The GPT's trainer is :class:`~typed_transformer.training.Trainer`, the encoder-decoder's
:class:`~typed_transformer.seq2seq_training.Seq2SeqTrainer`.
"""

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, Generic, Protocol, TextIO, TypeVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ._signals import Terminated, note_taken
from .config import DTYPES
from .run_files import CHECKPOINT_NAME
from .shapecheck import shape_checked
from .threads import RunThreads, fix_threads

__all__ = ["LoopSettings", "PeerFailed", "StepLoop", "TrainingDiverged", "rank_and_world"]

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


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised default ``torch.distributed`` group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class LoopSettings(Protocol):
    """What :class:`StepLoop` reads of a run's settings (:class:`~typed_transformer.config.TrainConfig` has
    every one)."""

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
    every ``checkpoint_interval`` steps, then evaluate every ``eval_interval``).
    :class:`~typed_transformer.training.Trainer` is the GPT's; the encoder-decoder's is in
    :mod:`~typed_transformer.seq2seq_training`.
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
        self.rank, self.world = rank_and_world()
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
        from .checkpoint import saved_iteration
        from .run_files import LOCK_NAME

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
