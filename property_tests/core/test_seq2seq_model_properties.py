"""Properties of the encoder-decoder model itself, as the design card asks of every model: output shapes; the
decoder's causality, by perturbation (changing target position ``j`` leaves the logits before ``j`` exactly as
they were) and by gradient (the logits at ``i`` have zero gradient with respect to the embedded targets after
``i``, and a nonzero one up to ``i``); source padding invariance (extra padding columns, and each sentence run
alone without its padding, give the same logits); incremental decoding (one position at a time from the
cached encoder output, as greedy and beam decoding do) equal to the full teacher-forced forward.

Models are small random float64 encoder-decoders over every positional encoding, pre- and post-LN, with every
parameter randomized (widths of 4 and more); sources are right-padded random ids, targets random ids without padding.
"""

from dataclasses import dataclass

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from tests.support.properties import assert_close
from typed_transformer.seq2seq import Positions, Seq2SeqTransformer
from typed_transformer.strategies import randomize_parameters, seeds

PAD = 0
EXACT = {"atol": 1e-12, "rtol": 1e-12}
POSITIONALS: tuple[Positions, ...] = ("sinusoidal", "learned", "rope", "none")


@dataclass(frozen=True)
class Case:
    model: Seq2SeqTransformer
    src: Tensor
    lengths: list[int]
    tgt: Tensor


@st.composite
def cases(draw: st.DrawFn) -> Case:
    src_vocab = draw(st.integers(3, 9), label="src_vocab")
    tgt_vocab = draw(st.integers(3, 9), label="tgt_vocab")
    nhead = draw(st.integers(1, 3), label="nhead")
    # a width of at least 4: a post-LN layer norm over 2 features has two outputs, and no gradient
    head_dim = draw(st.sampled_from([2, 4]) if nhead > 1 else st.just(4), label="head_dim")
    seed = draw(seeds(), label="seed")
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(src_vocab, tgt_vocab, PAD, PAD, d_model=nhead * head_dim, nhead=nhead,
                               num_encoder_layers=draw(st.integers(1, 2), label="encoder_layers"),
                               num_decoder_layers=draw(st.integers(1, 2), label="decoder_layers"),
                               dim_feedforward=8, dropout=0.0, norm_first=draw(st.booleans(), label="norm_first"),
                               positional=draw(st.sampled_from(POSITIONALS), label="positional"), max_length=16,
                               dtype=torch.float64)
    model = randomize_parameters(model, seed, std=0.5).eval()
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3), label="source lengths")
    t = draw(st.integers(1, 6), label="t")
    generator = torch.Generator().manual_seed(seed + 1)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for row, n in enumerate(lengths):
        src[row, :n] = torch.randint(1, src_vocab, (n,), generator=generator)
    tgt = torch.randint(1, tgt_vocab, (len(lengths), t), generator=generator)
    return Case(model, src, lengths, tgt)


@given(case=cases())
def test_shapes(case: Case) -> None:
    b, s = case.src.shape
    with torch.no_grad():
        memory = case.model.encode(case.src)
        logits = case.model(case.src, case.tgt)
    assert memory.shape == (b, s, case.model.d_model)
    assert logits.shape == (b, case.tgt.shape[1], case.model.tgt_vocab_size)
    assert logits.dtype == torch.float64
    assert bool(torch.isfinite(logits).all())


@given(case=cases(), data=st.data())
def test_the_decoder_is_causal_by_perturbation(case: Case, data: st.DataObject) -> None:
    t = case.tgt.shape[1]
    j = data.draw(st.integers(0, t - 1), label="changed position")
    changed = case.tgt.clone()
    changed[:, j] = changed[:, j] % (case.model.tgt_vocab_size - 1) + 1  # another non-padding id
    with torch.no_grad():
        before, after = case.model(case.src, case.tgt), case.model(case.src, changed)
    assert_close(after[:, :j], before[:, :j], EXACT)
    assert not torch.allclose(after[:, j:], before[:, j:], atol=1e-9)  # and the change is seen from j on


@given(case=cases(), data=st.data())
def test_the_decoder_is_causal_by_gradient(case: Case, data: st.DataObject) -> None:
    t = case.tgt.shape[1]
    i = data.draw(st.integers(0, t - 1), label="output position")
    embedded: list[Tensor] = []

    def keep(_module: torch.nn.Module, _inputs: tuple[Tensor, ...], output: Tensor) -> None:
        embedded.append(output)

    handle = case.model.tgt_embedding.register_forward_hook(keep)
    try:
        logits = case.model(case.src, case.tgt)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logits[:, i].sum(), embedded[0])
    assert bool((grad[:, i + 1:] == 0).all()), "the logits at i depend on later target positions"
    assert bool((grad[:, : i + 1].abs().sum(dim=-1) > 0).all()), "the logits at i ignore an earlier position"


@given(case=cases(), extra=st.integers(1, 3))
def test_source_padding_changes_nothing(case: Case, extra: int) -> None:
    padded = torch.cat([case.src, torch.full((case.src.shape[0], extra), PAD)], dim=1)
    with torch.no_grad():
        logits = case.model(case.src, case.tgt)
        assert_close(case.model(padded, case.tgt), logits, EXACT)
        for row, n in enumerate(case.lengths):  # each sentence alone, without its padding
            alone = case.model(case.src[row: row + 1, :n], case.tgt[row: row + 1])
            assert_close(alone, logits[row: row + 1])


@given(case=cases())
def test_incremental_decoding_equals_the_full_forward(case: Case) -> None:
    with torch.no_grad():
        full = case.model(case.src, case.tgt)
        memory, src_mask = case.model.encode(case.src), case.model.source_mask(case.src)
        for i in range(case.tgt.shape[1]):
            step = case.model.decode(case.tgt[:, : i + 1], memory, src_mask)[:, -1]
            assert_close(step, full[:, i])
