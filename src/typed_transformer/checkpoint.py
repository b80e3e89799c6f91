"""Checkpoints of the GPT: one safetensors file holding everything a run needs to continue, written atomically,
verified on load.

``checkpoint.safetensors`` holds tensors only (never pickle): the model weights under ``model.``, the
optimizer state under ``optim.``, the random-number states under ``rng.``. Everything else (model config,
tokenizer, training config, iteration, loss history) is JSON in the safetensors metadata header, together
with ``sha256``: a hash of every tensor (name, dtype, shape, bytes) and every other metadata field (format
``typed-transformer-gpt/2``; files of format ``/1``, written before the hash existed, still load, with every
field validated but without the hash check).

Guarantees (docs/reliability.md lists the faults they were tested against):

* Atomic and exclusive: the file is written through a temporary file and a rename, into a run directory locked
  for the run's lifetime (:mod:`~typed_transformer.run_files`, whose names this module re-exports).
* Verified: :func:`load_checkpoint` recomputes the hash and validates every field (model config, tokenizer,
  iteration, history, training config, optimizer tensors, random-number states, finite weights); anything
  wrong is a :class:`CheckpointError` with a one-line message.

``safetensors`` (the ``[train]`` extra) is imported only when a checkpoint is read or written.
"""

import contextlib
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Shaped, UInt8
from torch import Tensor, nn

from ._files import NotARegularFile, require_regular_file
from ._memory import out_of_memory
from .config import TrainConfig
from .data import CharTokenizer, DataError
from .gpt import GPT, GPTConfig
from .muon import MuonAdamW, check_muon_entry, muon_groups
from .run_files import (
    CHECKPOINT_NAME,
    LOCK_NAME,
    RunDirectoryError,
    checkpoint_bytes,
    content_digest,
    remove_temporaries,
    require_free_space,
    run_directory,
    temporary_path,
    write_atomically,
)
from .shapecheck import shape_checked, typechecked
from .validation import PARAMETER_DTYPES

__all__ = [
    "CHECKPOINT_NAME",
    "LOCK_NAME",
    "Checkpoint",
    "CheckpointError",
    "RunDirectoryError",
    "check_adam_state",
    "check_optimizer_state",
    "checked_model",
    "checkpoint_bytes",
    "load_checkpoint",
    "remove_temporaries",
    "require_free_space",
    "run_directory",
    "save_checkpoint",
    "saved_iteration",
    "temporary_path",
    "write_atomically",
]

FORMAT = "typed-transformer-gpt/2"
#: Checkpoints written before the integrity hash existed: loaded with every field validated, but unverified.
LEGACY_FORMAT = "typed-transformer-gpt/1"
_METADATA_KEYS = ("format", "model_config", "tokenizer", "iteration", "train_config", "history", "optimizer", "info")


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, damaged or not ours; the message is one line."""


@shape_checked
@dataclass
class Checkpoint:
    """What a checkpoint holds, loaded back."""

    __shape_checked__ = ("__init__",)

    model: GPT
    tokenizer: CharTokenizer
    iteration: int = 0
    train_config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    optimizer_state: dict[str, Any] | None = None
    rng: dict[str, UInt8[Tensor, " _"]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def _optimizer_tensors(state: dict[str, Any]) -> tuple[dict[str, Shaped[Tensor, "..."]], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (for safetensors) and JSON-able rest."""
    tensors: dict[str, Tensor] = {}
    per_param: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        entry: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                entry[key] = value
        per_param[str(index)] = entry
    return tensors, {"param_groups": state["param_groups"], "state": per_param}



def save_checkpoint(
    path: str | Path,
    model: GPT,
    tokenizer: CharTokenizer,
    *,
    iteration: int = 0,
    train_config: dict[str, Any] | None = None,
    history: list[dict[str, float]] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    rng: dict[str, UInt8[Tensor, " _"]] | None = None,
    info: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint file atomically; ``path`` is the file or the directory to put it in.

    Raises:
        OSError: the file cannot be written (the previous checkpoint, if any, is left as it was and the
            temporary file is removed).
    """
    path = Path(path)
    if path.is_dir() or not path.suffix:
        path = path / CHECKPOINT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Tensor] = {}
    for name, value in model.state_dict().items():
        if model.config.tie_weights and name == "lm_head.weight":
            continue  # the same tensor as tok_emb.weight; safetensors refuses shared storage
        tensors[f"model.{name}"] = value.detach().contiguous().cpu()
    optimizer_meta = None
    if optimizer is not None:
        optim_tensors, optimizer_meta = _optimizer_tensors(optimizer.state_dict())
        tensors.update(optim_tensors)
    for name, value in (rng or {}).items():
        tensors[f"rng.{name}"] = value.contiguous().cpu()
    metadata = {
        "format": FORMAT,
        "model_config": json.dumps(model.config.to_dict()),
        "tokenizer": json.dumps({"chars": tokenizer.chars}),
        "iteration": str(iteration),
        "train_config": json.dumps(train_config or {}),
        "history": json.dumps(history or []),
        "optimizer": json.dumps(optimizer_meta),
        "info": json.dumps(info or {}),
    }
    metadata["sha256"] = content_digest(tensors, metadata)
    write_atomically(path, tensors, metadata)
    return path


save_checkpoint = typechecked(save_checkpoint)


# ---------------------------------------------------------------------------------------------------
# Reading and validating
# ---------------------------------------------------------------------------------------------------


def _json(metadata: dict[str, str], key: str) -> Any:
    if key not in metadata:
        raise ValueError(f"no {key!r} field")
    try:
        return json.loads(metadata[key])
    except json.JSONDecodeError as err:
        raise ValueError(f"{key} is not valid JSON ({err.msg})") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _validate_history(history: Any, iteration: int) -> list[dict[str, float]]:
    if not isinstance(history, list):
        raise ValueError(f"history must be a list, got {type(history).__name__}")
    previous = -1.0
    for entry in history:
        if not isinstance(entry, dict) or "iter" not in entry:
            raise ValueError(f"history entry {entry!r} is not a dict with 'iter'")
        for key, value in entry.items():
            if key not in ("iter", "train", "val") or not _is_number(value):
                raise ValueError(f"history entry {entry!r}: {key!r} must be iter, train or val with a finite number")
        step = entry["iter"]
        if step != int(step) or not previous < step <= iteration:
            raise ValueError(f"history entry {entry!r}: iterations must increase and not pass {iteration}")
        previous = step
    return history


def _validate_train_config(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ValueError(f"train_config must be a dict, got {type(config).__name__}")
    known = set(TrainConfig.__dataclass_fields__)
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"train_config has unknown key {unknown[0]!r}")
    TrainConfig(**config)  # type and range checks
    return config


def _optimizer_state(tensors: dict[str, Shaped[Tensor, "..."]], meta: Any, model: GPT,
                     optimizer: str) -> dict[str, Any]:
    """Rebuild ``optimizer.state_dict()`` and check it fits ``model`` (AdamW over ``parameter_groups``, or
    :class:`~typed_transformer.muon.MuonAdamW` over :func:`~typed_transformer.muon.muon_groups`)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("param_groups"), list) \
            or not isinstance(meta.get("state"), dict):
        raise ValueError("optimizer metadata must hold param_groups and state")
    groups_of = (model.parameter_groups(0.0) if optimizer == "adamw"
                 else muon_groups(model, [model.lm_head], weight_decay=0.0, lr_scale=1.0))
    parameters = [p for group in groups_of for p in group["params"]]
    shapes = [p.shape for p in parameters]
    listed: list[Any] = []
    groups = []
    for group in meta["param_groups"]:
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            raise ValueError("optimizer param_groups entries must be dicts with params")
        listed += group["params"]
        # JSON has no tuples; AdamW's betas (and similar pairs) were tuples when saved.
        groups.append({k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()})
    if not all(isinstance(i, int) for i in listed) or sorted(listed) != list(range(len(shapes))):
        raise ValueError(f"optimizer param_groups do not list the model's {len(shapes)} parameters once each")
    state: dict[int, dict[str, Any]] = {}
    for index, entry in meta["state"].items():
        if not (isinstance(index, str) and index.isdigit() and int(index) < len(shapes)) or not isinstance(entry, dict):
            raise ValueError(f"optimizer state for unknown parameter {index!r}")
        if entry:  # AdamW's state is tensors only
            raise ValueError(f"optimizer state of parameter {index} has the unknown field {sorted(entry)[0]!r}")
        state[int(index)] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            parts = name.split(".", 2)
            if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) not in state:
                raise ValueError(f"optimizer tensor {name} belongs to no parameter")
            state[int(parts[1])][parts[2]] = value
    check_optimizer_state({"state": state, "param_groups": groups}, parameters, torch.optim.AdamW)
    return {"state": state, "param_groups": groups}


def check_optimizer_state(state_dict: dict[str, Any], parameters: list[Float[Tensor, "..."]],
                          kind: type[torch.optim.Optimizer] = torch.optim.AdamW) -> None:
    """:func:`check_adam_state` for an ``Adam``/``AdamW`` state, or for a
    :class:`~typed_transformer.muon.MuonAdamW` one (its groups say ``muon``): its AdamW groups through
    :func:`check_adam_state` with ``kind``, its Muon groups' settings through ``MuonAdamW``'s constructor and
    their parameters' state through :func:`~typed_transformer.muon.check_muon_entry`.

    Raises:
        ValueError: the first thing wrong.
    """
    groups = state_dict["param_groups"]
    if not any("muon" in group for group in groups):
        check_adam_state(state_dict, parameters, kind)
        return
    if not all(isinstance(group.get("muon"), bool) for group in groups):
        raise ValueError("optimizer param_groups: every group of Muon's optimizer says muon: true or false")
    muon_groups_ = [group for group in groups if group["muon"]]
    muon_params = {i for group in muon_groups_ for i in group["params"]}
    settings = {"momentum", "nesterov", "ns_steps", "weight_decay", "lr_scale"}
    for group in muon_groups_:
        try:
            MuonAdamW([{"params": [torch.zeros(1, 1)], "muon": True, **{k: v for k, v in group.items()
                                                                         if k in settings}}], lr=group.get("lr", 0.0))
        except (ValueError, TypeError) as err:
            raise ValueError(f"optimizer param_groups: {str(err).splitlines()[0]}") from None
    adam = {"param_groups": [group for group in groups if not group["muon"]],
            "state": {i: entry for i, entry in state_dict["state"].items() if i not in muon_params}}
    check_adam_state(adam, parameters, kind)
    for index in sorted(set(state_dict["state"]) & muon_params):
        if not (isinstance(index, int) and 0 <= index < len(parameters)):
            raise ValueError(f"optimizer state for unknown parameter {index!r}")
        check_muon_entry(index, state_dict["state"][index], parameters[index])


check_optimizer_state = typechecked(check_optimizer_state)


def check_adam_state(state_dict: dict[str, Any], parameters: list[Float[Tensor, "..."]],
                     kind: type[torch.optim.Optimizer] = torch.optim.AdamW) -> None:
    """Check a saved ``Adam``/``AdamW`` ``state_dict()`` against the ``parameters`` it will drive (in the
    optimizer's order) before ``load_state_dict``, which casts dtypes silently: each group's settings through
    ``kind``'s own constructor (learning rate, betas, eps, weight decay), then each parameter's state (see
    :func:`_check_adam_entry`).

    Raises:
        ValueError: the first thing wrong, naming the group setting or the tensor (``0.step``).
    """
    import inspect

    accepted = set(inspect.signature(kind).parameters) - {"params"}
    amsgrad: set[int] = set()
    for group in state_dict["param_groups"]:
        settings = {k: v for k, v in group.items() if k in accepted}
        try:
            kind([torch.zeros(1)], **settings)
        except (ValueError, TypeError) as err:
            raise ValueError(f"optimizer param_groups: {str(err).splitlines()[0]}") from None
        if group.get("amsgrad"):
            amsgrad.update(group["params"])
    for index, entry in state_dict["state"].items():
        if not (isinstance(index, int) and 0 <= index < len(parameters)):
            raise ValueError(f"optimizer state for unknown parameter {index!r}")
        parameter = parameters[index]
        _check_adam_entry(index, entry, parameter.shape, parameter.dtype, index in amsgrad, kind.__name__)


check_adam_state = typechecked(check_adam_state)


#: The dtypes of Adam's step count (torch keeps it as a float tensor: float64 when that is the default dtype).
STEP_DTYPES = (torch.float32, torch.float64)


def _check_adam_entry(index: int, entry: dict[str, Any], shape: torch.Size, dtype: torch.dtype,
                      amsgrad: bool, kind: str) -> None:
    """One parameter's Adam(W) state: exactly its tensors, each of the right dtype (checked first: torch's
    ``load_state_dict`` would cast it silently) and shape, finite, and within Adam's invariants: ``step`` a
    whole number >= 1 (the bias corrections divide by ``1 - beta ** step``), ``exp_avg_sq`` (a running mean of
    squares) >= 0."""
    expected = {"exp_avg": shape, "exp_avg_sq": shape, "step": torch.Size()}
    if amsgrad:
        expected["max_exp_avg_sq"] = shape
    for key in entry:
        if key not in expected:
            raise ValueError(f"optimizer tensor {index}.{key} is not part of {kind}'s state")
    for key, size in expected.items():
        value = entry.get(key)
        if not isinstance(value, Tensor):
            raise ValueError(f"optimizer state of parameter {index} lacks the tensor {key}")
        if key == "step" and value.dtype not in STEP_DTYPES:
            raise ValueError(f"optimizer tensor {index}.step is {value.dtype}, expected torch.float32 or "
                             f"torch.float64 ({kind}'s step count is a float tensor)")
        if key != "step" and value.dtype != dtype:
            raise ValueError(f"optimizer tensor {index}.{key} is {value.dtype}, expected {dtype} (the dtype of "
                             "its parameter)")
        if value.shape != size:
            raise ValueError(f"optimizer tensor {index}.{key} has shape {tuple(value.shape)}, expected {tuple(size)}")
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"optimizer tensor {index}.{key} holds NaN or infinity")
        if key in ("exp_avg_sq", "max_exp_avg_sq") and bool((value < 0).any()):
            raise ValueError(f"optimizer tensor {index}.{key} holds a negative value ({float(value.min()):g}); "
                             "it is a running mean of squared gradients")
    step = float(entry["step"])
    if step < 1 or step != int(step):
        raise ValueError(f"optimizer tensor {index}.step is {step:g}, expected a whole number >= 1 (the number of "
                         "steps taken)")


def _validate_rng(rng: dict[str, Shaped[Tensor, "..."]]) -> dict[str, UInt8[Tensor, " _"]]:
    size = torch.Generator().get_state().shape
    for name, value in rng.items():
        if name not in ("batches", "torch"):
            raise ValueError(f"unknown random-number state rng.{name}")
        if value.dtype != torch.uint8 or value.shape != size:
            raise ValueError(f"random-number state rng.{name} is {value.dtype} {tuple(value.shape)}, "
                             f"expected uint8 {tuple(size)}")
        try:
            torch.Generator().set_state(value)
        except RuntimeError as err:
            raise ValueError(f"random-number state rng.{name} is invalid ({str(err).splitlines()[0]})") from None
    return rng


def _read_verified(path: Path) -> tuple[dict[str, Shaped[Tensor, "..."]], dict[str, str]]:
    """The tensors and metadata of the checkpoint file ``path``, after the format and integrity checks."""
    from safetensors import SafetensorError, safe_open

    try:
        path.stat()  # not path.exists(): a directory the user cannot enter raises, and is no "write" error
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        require_regular_file(path, "the checkpoint")  # a FIFO or a device would block or never end
        with open(path, "rb"):  # the real cause of an unreadable file (safetensors reports another)
            pass
    except NotARegularFile as err:
        raise CheckpointError(str(err)) from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        tensors: dict[str, Tensor] = {}
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[name] = handle.get_tensor(name)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: not a readable checkpoint ({str(err).splitlines()[0]})") from None
    if metadata.get("format") not in (FORMAT, LEGACY_FORMAT):
        raise CheckpointError(f"{path}: not a typed-transformer GPT checkpoint (format {metadata.get('format')!r})")
    if metadata["format"] == FORMAT and "sha256" not in metadata:
        raise CheckpointError(f"{path}: corrupt checkpoint (no sha256 integrity field)")
    if "sha256" in metadata and content_digest(tensors, metadata) != metadata["sha256"]:
        raise CheckpointError(f"{path}: corrupt checkpoint (integrity check failed: the tensors or metadata were "
                              "modified or damaged after it was written)")
    return tensors, metadata


def saved_iteration(path: Path) -> int | None:
    """The iteration recorded in the checkpoint file ``path`` (its header only: cheap at any model size), or
    None when there is no readable checkpoint there. For a message naming the last checkpoint, not for loading:
    :func:`load_checkpoint` verifies the file."""
    from safetensors import safe_open

    try:
        require_regular_file(path, "the checkpoint")
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            iteration = (handle.metadata() or {}).get("iteration", "")
    except Exception:  # any unreadable file: there is no checkpoint to name
        return None
    return int(iteration) if iteration.isdigit() else None


def _model_from(tensors: dict[str, Shaped[Tensor, "..."]], config: GPTConfig, path: Path) -> GPT:
    """A :class:`GPT` of ``config`` holding the ``model.`` tensors (see :func:`checked_model`)."""
    weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    model = checked_model(lambda: GPT(config), weights, path)
    assert isinstance(model, GPT)
    return model


def check_tensor_names(tensors: dict[str, Shaped[Tensor, "..."]], prefixes: tuple[str, ...]) -> None:
    """The loaders' one rule for tensors nothing reads: a name outside ``prefixes`` (``junk.x``) is refused.

    Raises:
        ValueError: ``unexpected tensor NAME``.
    """
    unexpected = sorted(k for k in tensors if k.split(".", 1)[0] not in prefixes)
    if unexpected:
        raise ValueError(f"unexpected tensor {unexpected[0]}")


def checked_model(build: Callable[[], nn.Module], weights: dict[str, Shaped[Tensor, "..."]], path: Path) -> nn.Module:
    """``build()`` holding ``weights``, which must fit it exactly (names and shapes; a name tied to another,
    such as a GPT's ``lm_head.weight``, may be left out), all be of one floating-point dtype (never a silent
    cast: the model is built in that dtype) and be finite.

    The fit is checked first on the model built on the ``meta`` device (no memory), so a config that asks for
    a model far larger than the weights in the file (``n_layer`` 2000 beside 4 layers' weights) is refused as
    what it is, not after trying to allocate it; a model that fits its file but not the memory is named as such.

    Raises:
        CheckpointError: the weights do not fit the model, or building it runs out of memory (naming ``path``).
        ValueError: a weight of another dtype, or holding NaN or infinity (its name in the message).
    """
    with torch.device("meta"):
        reference = build()
    try:
        with warnings.catch_warnings():  # torch says that copying into meta tensors copies nothing: the point here
            warnings.filterwarnings("ignore", message=".*to a meta parameter", category=UserWarning)
            missing, unexpected = reference.load_state_dict(weights, strict=False)  # names and shapes
    except RuntimeError as err:  # a shape mismatch
        message = " ".join(str(err).split())
        raise CheckpointError(f"{path}: weights do not fit the model ({message[:200]})") from None
    expected = reference.state_dict(keep_vars=True)
    names: dict[int, list[str]] = {}  # the names of each tensor (tied weights: several)
    for name, value in expected.items():
        names.setdefault(id(value), []).append(name)
    missing = [k for k in missing if not any(other in weights for other in names[id(expected[k])])]
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit the model (missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]})")
    first = next(k for k, v in expected.items() if v.is_floating_point())
    dtype = weights[first].dtype
    if dtype not in PARAMETER_DTYPES:
        raise ValueError(f"weight {first} is {dtype}, expected a floating-point dtype "
                         f"({', '.join(str(d) for d in PARAMETER_DTYPES)})")
    for name, value in weights.items():
        wanted = dtype if expected[name].is_floating_point() else expected[name].dtype
        if value.dtype != wanted:
            why = f" (the dtype of {first}; a model holds one dtype)" if wanted == dtype else ""
            raise ValueError(f"weight {name} is {value.dtype}, expected {wanted}{why}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"weight {name} holds NaN or infinity")
    try:
        model = build().to(dtype)
        model.load_state_dict(weights, strict=False)
    except (RuntimeError, MemoryError) as err:
        if not out_of_memory(err):
            raise
        size = sum(v.numel() * v.element_size() for v in weights.values())
        count = sum(p.numel() for p in reference.parameters())
        raise CheckpointError(f"{path}: out of memory building its model ({count:,} parameters, "
                              f"{size / 2**30:.2f} GiB of {str(dtype).removeprefix('torch.')} weights)") from None
    return model


checked_model = typechecked(checked_model)


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read and verify a checkpoint written by :func:`save_checkpoint`; ``path`` is the file or its directory.

    Raises:
        CheckpointError: missing, unreadable, not ours, failing the integrity check (modified or damaged),
            or a field out of range (one line naming the path and the field).
    """
    path = Path(path)
    with contextlib.suppress(OSError):  # a path that cannot be looked at: _read_verified names why
        if path.is_dir():
            path = path / CHECKPOINT_NAME
    tensors, metadata = _read_verified(path)
    try:
        unknown = sorted(set(metadata) - {*_METADATA_KEYS, "sha256"})
        if unknown:
            raise ValueError(f"unknown metadata field {unknown[0]!r}")
        model_config = _json(metadata, "model_config")
        if not isinstance(model_config, dict):
            raise ValueError("model_config must be a dict")
        config = GPTConfig.from_dict(model_config)
        tokenizer_meta = _json(metadata, "tokenizer")
        if not isinstance(tokenizer_meta, dict) or not isinstance(tokenizer_meta.get("chars"), str):
            raise ValueError("tokenizer must be a dict with the string 'chars'")
        tokenizer = CharTokenizer(tokenizer_meta["chars"])
        if tokenizer.vocab_size != config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} characters, the model's vocab_size is "
                             f"{config.vocab_size}")
        text = metadata.get("iteration", "")
        if not text.isdigit():
            raise ValueError(f"iteration must be a non-negative integer, got {text!r}")
        iteration = int(text)
        history = _validate_history(_json(metadata, "history"), iteration)
        train_config = _validate_train_config(_json(metadata, "train_config"))
        info = _json(metadata, "info")
        if not isinstance(info, dict):
            raise ValueError("info must be a dict")
        check_tensor_names(tensors, ("model", "optim", "rng"))
        model = _model_from(tensors, config, path)
        optimizer_meta = _json(metadata, "optimizer")
        optimizer_state = None if optimizer_meta is None else _optimizer_state(
            tensors, optimizer_meta, model, str(train_config.get("optimizer", "adamw")))
        if optimizer_meta is None and any(k.startswith("optim.") for k in tensors):
            raise ValueError("optimizer tensors without optimizer metadata")
        rng = _validate_rng({k.removeprefix("rng."): v for k, v in tensors.items() if k.startswith("rng.")})
    except CheckpointError:
        raise
    except (KeyError, ValueError, TypeError, DataError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: corrupt checkpoint ({reason})") from None
    if optimizer_state is not None and str(map_location) != "cpu":
        for entry in optimizer_state["state"].values():
            for key, value in entry.items():
                if isinstance(value, Tensor) and key != "step":
                    entry[key] = value.to(map_location)
    return Checkpoint(model=model.to(map_location), tokenizer=tokenizer, iteration=iteration,
                      train_config=train_config, history=history, optimizer_state=optimizer_state, rng=rng,
                      info=info)
