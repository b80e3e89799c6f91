"""A module's repro: the code that rebuilds a failing module and its weights."""

import inspect
import json
from typing import Any

import torch
from torch import nn

from ..core.examples import import_line
from .spec import REBUILDS, ModuleSpec


def _rebuild(spec: ModuleSpec) -> str | None:
    try:
        return REBUILDS.get(spec)
    except TypeError:  # a spec with an unhashable field is in no registry
        return None


def original_init(cls: type) -> Any:
    """``cls.__init__`` read through decorators: ``inspect.unwrap``, or, for a wrapper that keeps no
    ``__wrapped__`` (``(*args, **kwargs)`` only: the ``kernels`` package's ``use_kernelized_func``, which
    transformers puts on attention classes from 5.25), the ``__init__`` in its closure."""
    init: Any = inspect.unwrap(cls.__init__)  # type: ignore[misc]
    params = inspect.signature(init).parameters
    if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for n, p in params.items() if n != "self"):
        for cell in getattr(init, "__closure__", None) or ():
            inner = cell.cell_contents
            if inspect.isfunction(inner) and inner.__name__ == "__init__":
                return inspect.unwrap(inner)
    return init


def init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The parameters of ``cls.__init__`` after ``self``, read through decorators (:func:`original_init`)."""
    params = dict(inspect.signature(original_init(cls)).parameters)
    params.pop("self", None)
    return params


def _constructor_lines(module: nn.Module) -> str | None:
    """Lines that build a module of ``module``'s class with its constructor arguments, or None where its class
    does not keep them: a Hugging Face attention class ``(config[, layer_idx])`` from its config (eager
    attention), ``nn.MultiheadAttention`` from its attributes."""
    cls_line = import_line(type(module), "Module")
    if cls_line is None:
        return None
    if type(module) is nn.MultiheadAttention:
        m = module
        return (f"{cls_line}\nmodule = Module({m.embed_dim}, {m.num_heads}, bias={m.in_proj_bias is not None}, "
                f"add_bias_kv={m.bias_k is not None}, add_zero_attn={m.add_zero_attn}, kdim={m.kdim}, "
                f"vdim={m.vdim}, batch_first={m.batch_first})")
    config = getattr(module, "config", None)
    to_json = getattr(config, "to_json_string", None)
    config_line = None if config is None else import_line(type(config), "Config")
    params = list(init_parameters(type(module)))  # through decorators (transformers 5.25's use_kernelized_func)
    if to_json is None or config_line is None or params[:1] != ["config"] or not set(params[1:]) <= {"layer_idx"}:
        return None
    layer = f", layer_idx={getattr(module, 'layer_idx', 0) or 0}" if "layer_idx" in params else ""
    fields = json.dumps(json.loads(to_json(use_diff=True)), separators=(",", ":"))  # what differs from the defaults
    return (f"import json\n{config_line}\n{cls_line}\n"
            f"config = Config()\n"
            f"for key, value in json.loads({fields!r}).items():\n"
            f"    setattr(config, key, value)  # as built (a tiny config need not pass from_dict's validation)\n"
            f"config._attn_implementation = 'eager'\nmodule = Module(config{layer})")


#: the largest module whose weights a repro carries in its text (more: the repro draws its own and says so)
REPRO_WEIGHTS = 8192


def weights_lines(module: nn.Module) -> str:
    """The line that gives a rebuilt ``module`` the audited one's weights: ``randomize_parameters(module, seed)``
    when that is what they are (seeds 0-9), else the state dict itself, base64 in the text, for a module of at
    most :data:`REPRO_WEIGHTS` values; else random weights, with a comment that says they are not the audited ones."""
    params = list(module.parameters())
    for seed in range(10):
        generator = torch.Generator().manual_seed(seed)
        if all(torch.equal(p.detach().cpu(), (torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5
                                              ).to(p.dtype)) for p in params):
            return (f"from typed_transformer.strategies import randomize_parameters\n"
                    f"module = randomize_parameters(module, {seed})")
    state = module.state_dict()
    if sum(t.numel() for t in state.values()) <= REPRO_WEIGHTS:
        import base64
        import io

        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state.items()}, buffer)
        text = base64.b64encode(buffer.getvalue()).decode()
        return (f"import base64, io\nmodule.load_state_dict(torch.load(io.BytesIO(base64.b64decode({text!r}))))"
                f"  # the audited weights")
    return ("from typed_transformer.strategies import randomize_parameters\n"
            "module = randomize_parameters(module, 0)  # NOT the audited weights (too many to carry): a bug of the "
            "code shows with these too")
