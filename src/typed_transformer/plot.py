"""Pictures of a model and its training: the loss curve of a run (:func:`plot_history`) and attention maps.

Attention maps: one heatmap per layer and head, query positions down, key positions across.

    weights[l, h, i, j] = softmax_j(q_i . k_j / sqrt(d) + mask)        (what query i takes from key j)

Row ``i`` of a panel is query position ``i`` (the token on the left), column ``j`` is key position ``j`` (the
token below); every row sums to 1 (0 for a query row without keys). In a causal model every cell above the
diagonal (aligned bottom-right when ``t != s``) is 0. Colours run from 0 to 1 in every panel, so panels compare.

matplotlib is imported when a picture is drawn, not when the package is imported: it belongs to the
``[train]`` extra (``pip install 'typed-transformer[train]'``, or ``pip install -e '.[train]'`` in a checkout).
"""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxtyping import Float
from torch import Tensor

from ._install import install_hint
from ._paths import temporary_path
from .shapecheck import raise_shape_error, typechecked

__all__ = ["plot_attention", "plot_history", "token_label"]

_NAME = "typed_transformer.plot.plot_attention"

#: Characters that would be invisible or break a tick label, shown as visible stand-ins.
_VISIBLE = {" ": "·", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def token_label(token: str) -> str:
    """A tick label for a token: whitespace and control characters made visible (``' '`` -> ``'·'``,
    ``'\\n'`` -> ``'\\\\n'``), anything else as it is."""
    if token in _VISIBLE:
        return _VISIBLE[token]
    if len(token) == 1 and not token.isprintable():
        return f"\\x{ord(token):02x}" if ord(token) < 256 else f"\\u{ord(token):04x}"
    return token


def _checked_labels(tokens: Sequence[str], key_tokens: Sequence[str] | None, t: int, s: int) -> Sequence[str]:
    """The key labels, after checking that the query and key labels fit the ``t`` and ``s`` axes of the weights."""
    if len(tokens) != t:
        raise_shape_error(_NAME, "tokens", f"has {len(tokens)} tokens, expected {t} (axis t of weights)",
                          axis="t", actual=len(tokens), expected=t, bound_by="weights")
    if key_tokens is None:
        if s != t:
            raise_shape_error(_NAME, "key_tokens", f"is None, but weights have s={s} keys for t={t} queries: "
                              "pass the key tokens", axis="s", expected=s, bound_by="weights")
        key_tokens = tokens
    if len(key_tokens) != s:
        raise_shape_error(_NAME, "key_tokens", f"has {len(key_tokens)} tokens, expected {s} (axis s of weights)",
                          axis="s", actual=len(key_tokens), expected=s, bound_by="weights")
    return key_tokens


def plot_attention(
    weights: Float[Tensor, "h t s"] | Float[Tensor, "l h t s"],
    tokens: Sequence[str],
    key_tokens: Sequence[str] | None = None,
    *,
    path: str | Path | None = None,
    title: str | None = None,
    panel_size: float = 2.5,
    dpi: int = 100,
) -> Any:
    """Draw attention weights as heatmaps: one panel per head, one row of panels per layer.

    Args:
        weights: ``(h, t, s)`` for one layer (e.g. ``MultiHeadAttention(...)(x, need_weights=True,
            average_attn_weights=False)[1][0]``) or ``(l, h, t, s)`` for ``l`` layers
            (:meth:`typed_transformer.GPT.attention_weights` gives ``(l, b, h, t, t)``: pick a batch row).
        tokens: the ``t`` query tokens (a string is a sequence of characters); they label the rows, and the
            columns too when ``key_tokens`` is not given and ``s == t``.
        key_tokens: the ``s`` key tokens, when they differ from the queries.
        path: also write the figure there (PNG, or any format matplotlib knows by the suffix).
        title: a title over the panels.
        panel_size: width and height of one panel in inches; the figure is ``heads * panel_size`` wide
            and ``layers * panel_size`` high.
        dpi: resolution: a PNG is ``heads * panel_size * dpi`` by ``layers * panel_size * dpi`` pixels.

    Returns:
        The ``matplotlib.figure.Figure``; panel ``(layer, head)`` is ``figure.axes[layer * h + head]`` and
        its image (``.images[0].get_array()``) holds exactly the plotted weights.

    Raises:
        ShapeError: ``tokens`` or ``key_tokens`` do not match the ``t`` or ``s`` axis of ``weights``.
        ValueError: ``panel_size`` or ``dpi`` is not positive.
        ModuleNotFoundError: matplotlib is not installed (it comes with the ``[train]`` extra).
    """
    grid = weights if weights.ndim == 4 else weights[None]
    layers, heads, t, s = grid.shape
    key_tokens = _checked_labels(tokens, key_tokens, t, s)
    if not panel_size > 0 or dpi <= 0:
        raise ValueError(f"plot_attention: panel_size and dpi must be positive, got {panel_size} and {dpi}")
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"plot_attention needs matplotlib: {install_hint('train')}",
                                  name=err.name) from err

    data = grid.detach().float().cpu().numpy()
    figure = Figure(figsize=(heads * panel_size, layers * panel_size), dpi=dpi, layout="constrained")
    if title:
        figure.suptitle(title, fontsize=9)
    axes = figure.subplots(layers, heads, squeeze=False)
    # One character per cell: the font fills most of a cell (points), between 4 and 9; where cells are too small
    # for 4-point text only every step-th position is labelled.
    cell = 0.75 * panel_size * 72 / max(t, s, 1)
    font = max(4.0, min(9.0, 0.8 * cell))
    step = max(1, math.ceil(4.0 / (0.8 * cell)))
    image = None
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(data[layer, head], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest",
                              aspect="auto")
            ax.set_title(f"layer {layer}, head {head}" if weights.ndim == 4 else f"head {head}", fontsize=7)
            ax.set_xticks(range(0, s, step), [token_label(k) for k in key_tokens][::step], fontsize=font)
            ax.set_yticks(range(0, t, step), [token_label(q) for q in tokens][::step], fontsize=font)
            ax.tick_params(length=0, pad=1)
    assert image is not None  # at least one panel
    figure.colorbar(image, ax=axes, shrink=0.6, aspect=30).ax.tick_params(labelsize=6)
    if path is not None:
        figure.savefig(path, dpi=dpi)
    return figure


plot_attention = typechecked(plot_attention)
token_label = typechecked(token_label)


def plot_history(history: list[dict[str, float]], path: Path, title: str = "") -> Path | None:
    """Write the train/val loss curve of a run's ``history`` (entries ``{"iter", "train", "val"}``) as a PNG,
    atomically (a temporary file renamed onto ``path``); returns None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    for split in ("train", "val"):
        points = [(h["iter"], h[split]) for h in history if split in h]
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", markersize=3, label=split)
    axes.set_xlabel("iteration")
    axes.set_ylabel("cross-entropy (nats/char)")
    axes.set_title(title or "GPT training loss")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    temporary = temporary_path(path)
    try:
        figure.savefig(temporary, format="png")
        temporary.replace(path)
    finally:
        plt.close(figure)
        temporary.unlink(missing_ok=True)
    return path
