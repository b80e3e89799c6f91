"""Attention maps: plot_attention and `typed-transformer attention`, on tiny models."""

import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import typed_transformer as tt
from typed_transformer import GPT, GPTConfig, MultiHeadAttention, ShapeError, plot_attention
from typed_transformer._install import install_hint
from typed_transformer.checkpoint import save_checkpoint
from typed_transformer.cli import main
from typed_transformer.data import CharTokenizer
from typed_transformer.plot import token_label

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header (IHDR is the first chunk)."""
    data = path.read_bytes()
    assert data[:8] == PNG, "not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def plotted(figure: object, layers: int, heads: int) -> np.ndarray:
    """The data drawn in every panel, (layers, heads, t, s), read back from the figure."""
    axes = figure.axes  # type: ignore[attr-defined]
    return np.stack([np.stack([np.asarray(axes[layer * heads + head].images[0].get_array())
                               for head in range(heads)]) for layer in range(layers)])


def tiny_gpt(text: str, positional: str = "learned") -> tuple[GPT, CharTokenizer]:
    torch.manual_seed(0)
    tokenizer = CharTokenizer.from_text(text)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=3, n_embd=12,
                       positional=positional)  # type: ignore[arg-type]
    return GPT(config).eval(), tokenizer


def test_import_does_not_import_matplotlib() -> None:
    code = "import sys, typed_transformer; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_multihead_weights_are_plotted_exactly_one_panel_per_head(tmp_path: Path) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 4).eval()
    x = torch.randn(1, 5, 8)
    _, weights = mha(x, is_causal=True, need_weights=True, average_attn_weights=False)
    assert weights is not None
    figure = plot_attention(weights[0], "hello", path=tmp_path / "mha.png", panel_size=1.5, dpi=40)
    assert png_size(tmp_path / "mha.png") == (4 * 60, 1 * 60)
    drawn = plotted(figure, 1, 4)
    np.testing.assert_array_equal(drawn[0], weights[0].detach().numpy())
    assert [ax.get_title() for ax in figure.axes[:4]] == ["head 0", "head 1", "head 2", "head 3"]
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == list("hello")


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_a_causal_gpt_plots_zero_above_the_diagonal(tmp_path: Path, positional: str) -> None:
    text = "def main():\n    pass\n"
    model, tokenizer = tiny_gpt(text, positional)
    prompt = "def main():"
    weights = model.attention_weights(torch.tensor([tokenizer.encode(prompt)]))
    assert weights.shape == (2, 1, 3, len(prompt), len(prompt))
    figure = plot_attention(weights[:, 0], prompt, path=tmp_path / "gpt.png", panel_size=2, dpi=30)
    assert png_size(tmp_path / "gpt.png") == (3 * 60, 2 * 60)
    drawn = plotted(figure, 2, 3)
    t = len(prompt)
    above = np.triu(np.ones((t, t), dtype=bool), k=1)
    assert np.all(drawn[:, :, above] == 0)
    assert np.all(drawn[:, :, ~above] > 0)  # softmax: every allowed key gets some weight
    np.testing.assert_allclose(drawn.sum(-1), 1.0, rtol=1e-5)
    assert [ax.get_title() for ax in figure.axes[:4]] == ["layer 0, head 0", "layer 0, head 1", "layer 0, head 2",
                                                          "layer 1, head 0"]
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["d", "e", "f", "·", "m", "a", "i", "n",
                                                                      "(", ")", ":"]


def test_attention_weights_equal_each_layers_own_attention() -> None:
    """Independent reference: run the blocks by hand, asking each attention for its weights."""
    model, tokenizer = tiny_gpt("abcdefgh")
    idx = torch.tensor([tokenizer.encode("abcabc"), tokenizer.encode("hgfedc")])
    got = model.attention_weights(idx)
    x = model.tok_emb(idx) + model.pos.weight[:6]  # type: ignore[union-attr,index]
    for layer, block in enumerate(model.blocks):
        h = block.ln_1(x)  # type: ignore[operator]
        q, k, _ = block.attn.in_proj(h).split(12, dim=-1)  # type: ignore[union-attr,operator]
        q, k = (z.reshape(2, 6, 3, 4).transpose(1, 2) for z in (q, k))
        logits = q @ k.transpose(-1, -2) / 2.0
        logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(got[layer], logits.softmax(-1))
        x = block(x)


def test_bad_tokens_name_the_axis() -> None:
    weights = torch.full((2, 3, 4), 0.25)
    with pytest.raises(ShapeError) as info:
        plot_attention(weights, "ab")
    assert info.value.summary == ("typed_transformer.plot.plot_attention(): tokens: has 2 tokens, expected 3 "
                                  "(axis t of weights)")
    with pytest.raises(ShapeError, match="key_tokens: is None, but weights have s=4 keys for t=3 queries"):
        plot_attention(weights, "abc")
    figure = plot_attention(weights, "abc", "wxyz")
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == list("wxyz")
    with pytest.raises(tt.TypeCheckError):
        plot_attention(torch.ones(3, 3), "abc")  # (t, s) without heads


def test_token_labels_make_whitespace_visible() -> None:
    assert [token_label(c) for c in " \n\ta\x00é"] == ["·", "\\n", "\\t", "a", "\\x00", "é"]


# ----------------------------------------------------------------------------------------------------
# typed-transformer attention
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    model, tokenizer = tiny_gpt("def main():\n    return 0\n")
    save_checkpoint(tmp_path / "run", model, tokenizer)
    return tmp_path / "run"


def test_cli_writes_one_panel_per_layer_and_head(run_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "attention.png"
    code = main(["attention", "--checkpoint", str(run_dir), "--text", "def main():", "--out", str(out),
                 "--panel-size", "2", "--dpi", "25", "--device", "cpu"])
    assert code == 0
    assert capsys.readouterr().out == f"wrote {out}: 2 layers x 3 heads over 11 characters\n"
    assert png_size(out) == (3 * 50, 2 * 50)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--text", "déf"], "characters not in the vocabulary"),
        (["--text", "x" * 17], "--text has 17 characters, more than the model's block_size 16"),
        (["--text", ""], "--text is empty"),
        (["--out", "/nonexistent/dir/a.png"], "--out: the directory /nonexistent/dir does not exist"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              argv: list[str], message: str) -> None:
    args = {"--text": "def", "--out": str(tmp_path / "a.png")}
    args.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    code = main(["attention", "--checkpoint", str(run_dir), *[x for kv in args.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("typed-transformer: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_cli_missing_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["attention", "--checkpoint", str(tmp_path / "none"), "--text", "a"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("typed-transformer: error: ")
    assert err.count("\n") == 1


def test_cli_without_matplotlib_names_the_extra(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError, as when it is not installed
    code = main(["attention", "--checkpoint", str(run_dir), "--text", "def", "--out", str(tmp_path / "a.png")])
    assert code == 2
    assert capsys.readouterr().err == ("typed-transformer: error: attention needs the [train] extra: "
                                       f"{install_hint('train')} (missing: matplotlib)\n")
    assert not (tmp_path / "a.png").exists()


def test_plot_attention_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    hint = re.escape(install_hint("train"))
    with pytest.raises(ModuleNotFoundError, match=f"^plot_attention needs matplotlib: {hint}$"):
        plot_attention(torch.full((1, 2, 2), 0.5), "ab")
