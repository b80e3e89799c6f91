"""The argument rules the modules share, each written once.

* :func:`check_token_ids`: token ids lie in ``[0, vocab_size)`` (``-1`` also allowed where it marks an ignored
  target). The GPT, the encoder-decoder model and the character tokenizer all raise :class:`TokenIdError`, a
  ``ValueError``, with one message: ``"<owner>: <argument> holds token id <id>, outside the vocabulary 0..<n-1>"``.
* :func:`check_positive_int`: a size is an ``int`` (not a ``bool``) greater than zero.
* :func:`check_parameter_dtype`: a module's ``dtype=`` is None or a floating-point dtype
  (:data:`PARAMETER_DTYPES`), which every module and checkpoint of the library holds its weights in.

Shapes are not values: a wrong shape is a :class:`~typed_transformer.ShapeError`; a right shape holding a
wrong token id is a :class:`TokenIdError`.
"""

import torch
from jaxtyping import Int
from torch import Tensor

from .shapecheck import typechecked

__all__ = ["PARAMETER_DTYPES", "TokenIdError", "check_parameter_dtype", "check_positive_int", "check_token_ids"]


class TokenIdError(ValueError):
    """A tensor of token ids holds an id outside the vocabulary.

    Attributes: ``owner`` (the function or class that refused it), ``argument``, ``token_id`` (the smallest
    id when one is below the range, else the largest), ``vocab_size``.
    """

    def __init__(self, owner: str, argument: str, token_id: int, vocab_size: int, *, ignore_index: bool = False,
                 bound_by: str | None = None) -> None:
        ignored = " (or -1, ignored)" if ignore_index else ""
        named = f" ({bound_by}={vocab_size})" if bound_by else ""
        super().__init__(f"{owner}: {argument} holds token id {token_id}, outside the vocabulary "
                         f"0..{vocab_size - 1}{ignored}{named}")
        self.owner = owner
        self.argument = argument
        self.token_id = token_id
        self.vocab_size = vocab_size


def check_token_ids(owner: str, argument: str, ids: Int[Tensor, "*shape"] | list[int], vocab_size: int, *,
                    ignore_index: bool = False, bound_by: str | None = None) -> None:
    """Raise :class:`TokenIdError` unless every id lies in ``[0, vocab_size)``.

    Args:
        owner: who checks (``"GPT.forward"``), the message's first word.
        argument: the argument that holds the ids (``"idx"``).
        ids: token ids, a tensor of any shape or a list.
        vocab_size: the number of ids.
        ignore_index: also accept ``-1`` (a target position the loss ignores).
        bound_by: the setting that fixes ``vocab_size`` (``"src_vocab_size"``), named in the message.

    Inside ``torch.compile`` the check is skipped: reading the ids' values would break the graph.
    """
    if isinstance(ids, Tensor):
        if ids.numel() == 0 or torch.compiler.is_compiling():
            return
        smallest, largest = int(ids.min()), int(ids.max())
    else:
        if not ids:
            return
        smallest, largest = min(ids), max(ids)
    low = -1 if ignore_index else 0
    if smallest < low or largest >= vocab_size:
        bad = smallest if smallest < low else largest
        raise TokenIdError(owner, argument, bad, vocab_size, ignore_index=ignore_index, bound_by=bound_by)


def check_positive_int(owner: str | None, name: str, value: object, *, optional: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``int`` greater than zero (``None`` too with ``optional``).

    ``bool`` is refused although it is an ``int`` (``True`` as a size is a mistake), and so are floats
    (``2.0``) and strings. The message: ``"<owner>: <name> must be a positive int, got <value!r>"`` (``"must be
    None or a positive int"`` with ``optional``; without the owner's prefix when ``owner`` is None).
    """
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        prefix = f"{owner}: " if owner else ""
        allowed = "None or a positive int" if optional else "a positive int"
        raise ValueError(f"{prefix}{name} must be {allowed}, got {value!r}")


#: The parameter dtypes a module of the library can be built in (``dtype=`` of the constructors).
PARAMETER_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_parameter_dtype(owner: str, dtype: object) -> None:
    """Refuse a constructor's ``dtype`` other than None or one of :data:`PARAMETER_DTYPES` with a ValueError
    naming ``owner`` (torch would fail later, inside ``nn.Parameter``, without naming the argument)."""
    if dtype is not None and dtype not in PARAMETER_DTYPES:
        names = ", ".join(str(d) for d in PARAMETER_DTYPES[:-1]) + f" or {PARAMETER_DTYPES[-1]}"
        raise ValueError(f"{owner}: dtype must be None or a floating-point dtype ({names}), got {dtype!r}")


check_token_ids = typechecked(check_token_ids)
