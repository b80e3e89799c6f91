"""FlexAttention mods for the audit's tests and docs/audit-torch-kernels.md: correct ones (causal, a sliding window,
documents, ALiBi for 6 and 8 heads, Gemma 2's soft-cap) and planted bugs (a window off by one, ALiBi's power-of-two
slopes for 6 heads, a soft-cap before the scale)."""

import math

import torch
from torch import Tensor

from typed_transformer.positions import alibi_slopes

WINDOW = 4
SOFTCAP = 50.0
HEAD_DIM = 16
#: three documents of a packed sequence of 16 tokens
DOCUMENT_ID = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2])
ALIBI_6 = alibi_slopes(6)
ALIBI_8 = alibi_slopes(8)
POWER_OF_TWO_6 = torch.tensor([2.0 ** (-8.0 * i / 6) for i in range(1, 7)], dtype=torch.float64)


def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return q_idx >= kv_idx


def sliding_window(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)


def document(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return DOCUMENT_ID[q_idx] == DOCUMENT_ID[kv_idx]


def causal_document(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return (DOCUMENT_ID[q_idx] == DOCUMENT_ID[kv_idx]) & (q_idx >= kv_idx)


def alibi_6(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return score + ALIBI_6[h] * (kv_idx - q_idx)


def alibi_8(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return score - ALIBI_8[h] * (q_idx - kv_idx).abs()


def softcap(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return SOFTCAP * torch.tanh(score / SOFTCAP)


def softcap_scale_inside(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Called with ``scale=1.0``: scales, then caps (Gemma 2's order, the scale written in the mod)."""
    return SOFTCAP * torch.tanh(score / math.sqrt(HEAD_DIM) / SOFTCAP)


# -- planted bugs -------------------------------------------------------------------------------------


def window_off_by_one(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Keeps WINDOW + 1 keys: ``<=`` where a window of WINDOW keys needs ``<``."""
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)


def alibi_power_of_two_slopes_6(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """2^(-8 i / 6): the paper's rule for a power of two, applied to 6 heads."""
    return score + POWER_OF_TWO_6[h] * (kv_idx - q_idx)


def softcap_before_scale(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Called with ``scale=1.0``: caps the raw logit, then scales (a port of ``softcap(q @ k.T) / sqrt(HEAD_DIM)``)."""
    capped: Tensor = SOFTCAP * torch.tanh(score / SOFTCAP)
    return capped / math.sqrt(HEAD_DIM)
