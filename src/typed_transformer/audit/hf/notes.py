"""What a Hugging Face class's audit leaves untested (notes) and what it reads from the class (limits): both folds over
the registered traits (:mod:`.traits`), each reading the class once."""

from torch import nn

from ..core.conventions import AuditUsageError
from .facts import _input_norms, _norm_paths
from .layout import find_layout
from .traits import Seen, all_traits


def hf_notes(module: nn.Module) -> list[str]:
    """True behaviours of the class, as its model calls it, that pass the audit but a user should know: each trait's
    notes, in the order the traits are registered."""
    seen = Seen(module)
    return [note for trait in all_traits() if (found := trait.found(seen)) is not None
            for note in trait.notes(seen, found)]


def _layout_reads(module: nn.Module) -> set[str]:
    """The direct children a classic layout reads (a block's attention and output modules, its norms)."""
    try:
        layout = find_layout(module, _norm_paths(module))
    except AuditUsageError:
        return set()
    return layout.reads() | ({"relative_attention_bias"} if layout.relative_bias else set()) | {"q_attn"}


def hf_limits(module: nn.Module) -> list[str]:
    """What this class computes that the reference does not model (the sweep reports such a class as recognised but
    not audited: its FAILs would be about the reference, not the class): each trait's limits, then every submodule
    and parameter of the class that neither the common shape nor one of its traits reads."""
    seen = Seen(module)
    found = [(trait, f) for trait in all_traits() if (f := trait.found(seen)) is not None]
    limits = [limit for trait, f in found for limit in trait.limits(seen, f)]
    read = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "rotary_emb", *_norm_paths(module),
            *_input_norms(module), *_layout_reads(module),
            *(name for trait, f in found for name in trait.reads(seen, f))}
    for name, child in module.named_children():
        # dropout of any class (DeBERTa's StableDropout): off in eval mode
        # (a softmax over the keys as a module of its own: CPM-Ant's nn.Softmax(dim=-1))
        inert = isinstance(child, nn.Dropout | nn.Identity) or (isinstance(child, nn.Softmax) and child.dim == -1)
        if name not in read and not inert and not type(child).__name__.endswith("Dropout"):
            limits.append(f"submodule {name!r} ({type(child).__name__}) the spec does not read")
    # parameters of the class itself (attention sinks, differential lambdas, decomposed relative position tables)
    own = {name for trait, f in found for name in trait.own(seen, f)}
    limits += [f"parameter {name!r} the spec does not read" for name, _ in module.named_parameters(recurse=False)
               if name not in own]
    return limits
