"""Loading the original tutorial's trained weights (``GPT.from_tutorial_state_dict``,
``typed_transformer.tutorial.load_tutorial_weights``): state dicts made by the tutorial's own module tree
(``tests.support.tutorial_gpt``, written independently of this library), compared by their outputs."""

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.tutorial_gpt import TUTORIAL_TREE, BigramLanguageModel
from typed_transformer import GPT
from typed_transformer.tutorial import gpt_from_tutorial_state_dict, load_tutorial_weights

SMALL = {"vocab_size": 26, "n_embd": 48, "n_head": 3, "n_layer": 2, "block_size": 16}


def _tutorial(seed: int = 0, **sizes: int) -> BigramLanguageModel:
    torch.manual_seed(seed)
    model = BigramLanguageModel(**{**SMALL, **sizes})
    with torch.no_grad():  # nonzero biases and norms, so a mapping that drops or swaps one shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def test_the_tutorial_model_of_the_tests_prints_the_tutorials_tree() -> None:
    # torch >= 2.1 adds ", bias=True" to LayerNorm's repr; the tutorial's log is older
    printed = re.sub(r"(LayerNorm\(.*), bias=True\)", r"\1)", str(BigramLanguageModel()))
    assert printed == TUTORIAL_TREE.rstrip("\n")


@pytest.mark.parametrize("sizes", [{}, {"n_head": 1, "n_layer": 1}, {"n_head": 4, "n_embd": 32}])
def test_loaded_weights_give_the_tutorials_logits(sizes: dict[str, int]) -> None:
    theirs = _tutorial(**sizes)
    ours = GPT.from_tutorial_state_dict(theirs.state_dict()).eval()
    idx = torch.randint(0, 26, (3, theirs.position_embedding_table.weight.shape[0]))
    expected, _ = theirs(idx)
    got, _ = ours(idx, all_positions=True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert ours.config.tie_weights is False
    assert (ours.config.activation, ours.config.qkv_bias, ours.config.lm_head_bias) == ("relu", False, True)


def test_the_seed_sized_model_loads_with_its_printed_parameter_count() -> None:
    theirs = BigramLanguageModel().eval()  # 65 characters, 6 x 6 heads of 64, block 256: the printed model
    ours = gpt_from_tutorial_state_dict(theirs.state_dict()).eval()
    assert ours.num_parameters(non_embedding=False) == 10_788_929
    idx = torch.randint(0, 65, (1, 40))
    torch.testing.assert_close(ours(idx, all_positions=True)[0], theirs(idx)[0], rtol=1e-5, atol=1e-5)


def test_training_from_the_loaded_weights_follows_the_tutorials_losses() -> None:
    """Ten AdamW steps on the same batches with dropout off (both in eval mode), from the same weights: the same
    losses."""
    theirs = _tutorial()
    ours = GPT.from_tutorial_state_dict(theirs.state_dict()).eval()
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-3)
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(10):
        idx = torch.randint(0, 26, (4, 17), generator=generator)
        x, y = idx[:, :-1], idx[:, 1:]
        _, loss_theirs = theirs(x, y)
        _, loss_ours = ours(x, y)
        assert loss_theirs is not None
        assert loss_ours is not None
        torch.testing.assert_close(loss_ours, loss_theirs, rtol=1e-4, atol=1e-5)
        for opt, loss in ((opt_theirs, loss_theirs), (opt_ours, loss_ours)):
            opt.zero_grad()
            loss.backward()
            opt.step()


def test_the_lecture_codes_names_load_too() -> None:
    """The lecture's code names the feed-forward ``ffwd.net``; the printed tree ``ffd.network``."""
    theirs = _tutorial()
    renamed = {k.replace(".ffd.network.", ".ffwd.net."): v for k, v in theirs.state_dict().items()}
    idx = torch.randint(0, 26, (2, 8))
    got = gpt_from_tutorial_state_dict(renamed).eval()(idx, all_positions=True)[0]
    torch.testing.assert_close(got, theirs(idx)[0], rtol=1e-5, atol=1e-5)


def test_a_swapped_head_changes_the_logits() -> None:
    """The comparison can fail: the heads' order matters (head 0's query loaded as head 1's)."""
    theirs = _tutorial()
    state = theirs.state_dict()
    a, b = "blocks.0.sa.heads.0.query.weight", "blocks.0.sa.heads.1.query.weight"
    state[a], state[b] = state[b].clone(), state[a].clone()
    idx = torch.randint(0, 26, (2, 8))
    got = gpt_from_tutorial_state_dict(state).eval()(idx, all_positions=True)[0]
    assert not torch.allclose(got, theirs(idx)[0], atol=1e-4)


def test_a_pt_file_is_read_with_weights_only(tmp_path: Path) -> None:
    theirs = _tutorial()
    path = tmp_path / "model.pt"
    torch.save(theirs.state_dict(), path)
    idx = torch.randint(0, 26, (2, 8))
    got = load_tutorial_weights(path).eval()(idx, all_positions=True)[0]
    torch.testing.assert_close(got, theirs(idx)[0], rtol=1e-5, atol=1e-5)


def test_files_that_are_not_a_state_dict_are_refused_in_one_line(tmp_path: Path) -> None:
    whole = tmp_path / "whole.pt"
    torch.save(_tutorial(), whole)  # the pickled module: weights_only=True will not run its code
    refused = (r"whole\.pt: not a plain state dict that weights_only=True can read \(it holds "
               r"tests\.support\.tutorial_gpt\.BigramLanguageModel\); save model\.state_dict\(\), not the model$")
    with pytest.raises(ValueError, match=refused):
        load_tutorial_weights(whole)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"junk\.pt: not a file saved by torch\.save"):
        load_tutorial_weights(junk)
    with pytest.raises(ValueError, match=r"missing\.pt: no such file"):
        load_tutorial_weights(tmp_path / "missing.pt")
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(ValueError, match=r"list\.pt: holds a list, not a state dict of tensors"):
        load_tutorial_weights(listed)


@pytest.mark.parametrize(("change", "refused"), [
    # a 125 KB file whose token table claims 10^8 rows (a stride-0 view of 32 values): it grew to 20.9 GB
    (lambda w: torch.zeros(1, w.shape[1]).expand(10**8, w.shape[1]),
     r"token_embedding_table\.weight \(100000000, \d+\) holds \d+ bytes for \d+ values \(a view that repeats"),
    (lambda w: w.to(torch.int64), r"token_embedding_table\.weight is int64, expected floating-point weights"),
    (lambda w: w.masked_fill(torch.zeros_like(w, dtype=torch.bool).index_fill(0, torch.tensor([0]), True), math.nan),
     r"token_embedding_table\.weight holds non-finite values"),
])
def test_weights_that_are_not_saved_weights_are_refused_in_one_line(tmp_path: Path, change: Any,
                                                                    refused: str) -> None:
    """The loader never trusts its file: what the checkpoint loader refuses, this one refuses too (issue 44)."""
    state = _tutorial().state_dict()
    state["token_embedding_table.weight"] = change(state["token_embedding_table.weight"])
    path = tmp_path / "model.pt"
    torch.save(state, path)
    assert path.stat().st_size < 10**6
    with pytest.raises(ValueError, match=refused):
        load_tutorial_weights(path)


def test_a_state_dict_of_another_model_is_named() -> None:
    with pytest.raises(ValueError, match=r"no 'token_embedding_table\.weight'"):
        gpt_from_tutorial_state_dict({"wte.weight": torch.zeros(3, 4)})
    state = _tutorial().state_dict()
    state["blocks.0.sa.extra.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"unexpected \['blocks\.0\.sa\.extra\.weight'\]"):
        gpt_from_tutorial_state_dict(state)
    state = _tutorial().state_dict()
    del state["blocks.1.ln2.bias"]
    with pytest.raises(ValueError, match=r"no 'blocks\.1\.ln2\.bias'"):
        gpt_from_tutorial_state_dict(state)


def test_the_loader_says_which_scale_it_assumes_and_how_to_get_every_position() -> None:
    """Weights of the lecture's early C**-0.5 variant load silently (the file cannot say): the loader's docstring
    and docs/training.md name the scale assumed, and the call that gives the tutorial's logits at every position."""
    doc = load_tutorial_weights.__doc__ or ""
    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    for text in (doc, page):
        assert "head_size**-0.5" in text
        assert "C**-0.5" in text
        assert "all_positions=True" in text
