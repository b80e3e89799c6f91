"""The settings of a training run: :class:`TrainConfig` (optimisation, evaluation, checkpoints, precision), the
model presets' own training settings and the autocast dtypes.

This module sits below :mod:`~typed_transformer.checkpoint` and :mod:`~typed_transformer.training`: a checkpoint
validates the run settings it stores against :class:`TrainConfig` without importing the training loop.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch

from .validation import check_positive_int

__all__ = ["DTYPES", "PRESET_TRAINING", "TrainConfig"]

#: The ``dtype`` choices: the forward passes' autocast dtype (float32: no autocast).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: Training settings of a model preset where they differ from :class:`TrainConfig`'s defaults (nanoGPT's).
#: ``baby``: peak learning rate 3e-3 (min 3e-4) instead of nanoGPT's 1e-3. Over 2000 iterations on Tiny
#: Shakespeare, two seeds each, the full-split validation loss was 1.908 at 1e-3, 1.821 at 2e-3, 1.789 at
#: 3e-3 and 1.784 at 5e-3; 3e-3 is the smallest rate within noise of the best (README, "Quality").
PRESET_TRAINING: dict[str, dict[str, Any]] = {
    "baby": {"learning_rate": 3e-3, "min_lr": 3e-4},
    "seed": {},
}


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; the defaults are nanoGPT's CPU "baby GPT" run (:meth:`for_preset` adds a
    model preset's own settings: the command line's ``train`` starts from those)."""

    max_iters: int = 2000
    batch_size: int = 12
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # default: max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 20
    checkpoint_interval: int = 250
    seed: int = 1337
    sample_tokens: int = 300
    grad_accum: int = 1  # micro-batches per optimizer step in each process; batch_size is the global batch
    dtype: str = "float32"  # autocast dtype of the forward passes (DTYPES)
    compile: bool = False  # torch.compile the training steps
    #: Intra-op threads: "auto" (timed on the first steps, re-checked on drift; typed_transformer.threads) or a
    #: count. "auto" leaves a count the user set (OMP_NUM_THREADS, torch.set_num_threads) alone.
    threads: int | str = "auto"

    @classmethod
    def for_preset(cls, preset: str, **overrides: Any) -> "TrainConfig":
        """The defaults with the preset's own settings (:data:`PRESET_TRAINING`), then ``overrides``
        (see :meth:`overridden`)."""
        if preset not in PRESET_TRAINING:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESET_TRAINING)}")
        return cls.overridden(PRESET_TRAINING[preset], **overrides)

    @classmethod
    def overridden(cls, base: dict[str, Any], **overrides: Any) -> "TrainConfig":
        """The settings ``base`` (a preset's, or a checkpoint's ``train_config``) with ``overrides``.

        An overridden ``learning_rate`` without ``min_lr`` decays to a tenth of itself, as nanoGPT's does.
        """
        if "learning_rate" in overrides:
            overrides.setdefault("min_lr", overrides["learning_rate"] / 10)
        return cls(**{**base, **overrides})

    def __post_init__(self) -> None:
        positive = ("max_iters", "batch_size", "eval_interval", "eval_iters", "checkpoint_interval", "grad_accum")
        for name in positive:
            check_positive_int(None, name, getattr(self, name))
        for name in ("learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("warmup_iters", "seed", "sample_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        check_positive_int(None, "lr_decay_iters", self.lr_decay_iters, optional=True)
        if not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1:
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if not (self.learning_rate > 0 and self.min_lr >= 0 and self.min_lr <= self.learning_rate):
            raise ValueError(f"need 0 <= min_lr <= learning_rate and learning_rate > 0, got "
                             f"learning_rate={self.learning_rate}, min_lr={self.min_lr}")
        if self.warmup_iters < 0 or self.sample_tokens < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("warmup_iters, sample_tokens, grad_clip and weight_decay must be >= 0")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be True or False, got {self.compile!r}")
        if self.threads != "auto" and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                       or self.threads < 1):
            raise ValueError(f"threads must be 'auto' or a positive integer, got {self.threads!r}")
        if self.batch_size % self.grad_accum != 0:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}: "
                             "the global batch is split into equal micro-batches")
