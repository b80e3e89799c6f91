"""Memory a training run needs for its parameters, checked before it is allocated.

A model too large for the machine otherwise fails while it is built or at its first step, as an allocation
error that reads like any other ("out of memory: lower --batch-size", although the batch is not the cause), or
not at all: with Linux's overcommit the kernel's OOM killer ends the process without a word. The parameters'
share is known exactly before anything is allocated (the model built on the ``meta`` device), so it is compared
with what this process can still use: the smallest of the system's available memory (``MemAvailable``), the
address-space limit (``ulimit -v``) less what the process already maps, and its cgroup's memory limit less its
usage. Where none of them can be read (not Linux), nothing is checked. Activations come on top, so passing the
check is necessary, not sufficient.
"""

import resource
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn


def out_of_memory(err: BaseException) -> bool:
    """A failed allocation, as torch and Python report it on CPU (``RuntimeError``) or CUDA: the one test the
    checkpoint loader and the command line share."""
    if isinstance(err, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "not enough memory" in text)


#: Bytes per float32 parameter while training with AdamW: the weight, its gradient and the two moments.
TRAINING_BYTES_PER_PARAMETER = 4 * 4


def _kib_field(path: str, name: str) -> int | None:
    """``name:  N kB`` of a /proc file, in bytes."""
    try:
        for line in Path(path).read_text(encoding="ascii").splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes() -> int | None:
    """What this process can still allocate, as far as the system says; None where it cannot be read."""
    found = []
    system = _kib_field("/proc/meminfo", "MemAvailable")
    if system is not None:
        found.append(system)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _kib_field("/proc/self/status", "VmSize")
    if soft != resource.RLIM_INFINITY and mapped is not None:
        found.append(max(0, soft - mapped))
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text(encoding="ascii").strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text(encoding="ascii").strip()
        if limit != "max":
            found.append(max(0, int(limit) - int(used)))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**28 else f"{count / 2**20:.0f} MiB"


def parameter_count(build: Callable[[], nn.Module]) -> int:
    """The number of parameters of ``build()``, built on the ``meta`` device (no memory; tied weights once)."""
    with torch.device("meta"):
        module = build()
    return sum(p.numel() for p in module.parameters())


def require_training_memory(parameters: int, *, allocated: int = 0, advice: str) -> None:
    """Refuse a run whose ``parameters`` cannot be trained in the memory this process can still use:
    ``TRAINING_BYTES_PER_PARAMETER`` each, less the ``allocated`` parameters whose weights already exist.

    Raises:
        ValueError: one line with the parameter count, the memory needed and available, and ``advice``.
    """
    needed = TRAINING_BYTES_PER_PARAMETER * parameters - 4 * allocated
    available = available_bytes()
    if available is not None and needed > available:
        raise ValueError(f"not enough memory to train a model of {parameters:,} parameters: its float32 weights, "
                         f"gradients and AdamW's two moments need {_gib(needed)} more, and this process can use "
                         f"{_gib(available)}; {advice}")
