"""The features of attention variants a spec declares: differential attention, latent (MLA) projections, output
gates."""

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Differential:
    """Differential attention (Ye et al., 2024, "Differential Transformer"; DiffLlama): query heads ``p`` and
    ``p + h/2`` are the two maps of one differential head ``p``, whose value is the key/value heads ``j`` and
    ``j + g/2`` side by side (``j`` the key/value head of query head ``p``, ``2 dv`` wide):
    ``o_p = (softmax(s_p) - lambda softmax(s_{p + h/2})) [v_j; v_{j + g/2}]``, then the spec's ``sub_norm`` (the
    paper's group norm, over each differential head) and ``(1 - lambda_init)``. ``lambda = exp(lambda_q1 . lambda_k1)
    - exp(lambda_q2 . lambda_k2) + lambda_init``: the four attribute paths of the learned vectors and that of
    ``lambda_init`` (or a number)."""

    lambda_q1: str = "lambda_q1"
    lambda_k1: str = "lambda_k1"
    lambda_q2: str = "lambda_q2"
    lambda_k2: str = "lambda_k2"
    lambda_init: float | str = "lambda_init"


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2, 2024; DeepSeek V2/V3): keys and values come from one compressed
    latent ``c = RMSNorm(x W_kva^c)`` of ``rank`` features per token, ``[k_nope_h; v_h] = c W_kvb`` for each head;
    the rotary part of the keys ``k_rope = x W_kva^r`` (``rope`` features, the rows of ``kv_a`` after the latent's) is
    one for every head. Each head's query is ``[q_nope_h; q_rope_h]``, from ``q`` (a full-rank projection) or, where
    that attribute is None, from the low-rank ``q_b(RMSNorm(q_a(x)))``; its key ``[k_nope_h; k_rope]``. The rotary
    embedding turns the last ``rope`` features of each query and key. Attribute paths of the module's layers and
    sizes."""

    q: str = "q_proj"
    q_a: str = "q_a_proj"
    q_norm: str = "q_a_layernorm"
    q_b: str = "q_b_proj"
    kv_a: str = "kv_a_proj_with_mqa"
    kv_norm: str = "kv_a_layernorm"
    kv_b: str = "kv_b_proj"
    rank: str = "kv_lora_rank"
    nope: str = "qk_nope_head_dim"
    rope: str = "qk_rope_head_dim"
    value: str = "v_head_dim"


@dataclass(frozen=True)
class OutputGate:
    """An output gate (Qwen3-Next, AFMoE, Step 3.7, LFM 3, Beam, Laguna): the attention output ``o (b, t, h, dv)``
    times ``sigmoid(x W_g^T + b_g)`` (or ``softplus``), one gate per head or per output feature as the gate
    projection's width says (``h`` or ``h dv`` outputs). ``proj``: the gate's linear layer; ``in_query=True``: the
    gate is the second half of each head's rows of the query projection (Qwen3-Next's ``q_proj`` of ``h * 2d``
    outputs, chunked per head)."""

    proj: str = "gate_proj"
    in_query: bool = False
    #: a bias of one value per head added to the gate's logits (Beam's ``gate_bias``), an attribute path
    bias: str | None = None
    #: the gate's function of its logits: ``sigmoid``, or ``softplus`` (Laguna's)
    activation: Literal["sigmoid", "softplus"] = "sigmoid"
