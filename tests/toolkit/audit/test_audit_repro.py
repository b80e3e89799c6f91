"""Repro snippets run as printed in a fresh interpreter: a function's, a shipped spec's (the module rebuilt by the
command line with the same seeded weights) and a user's spec named by its import path, from the command line
and from Python."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from tests.support.limits import HANG_SECONDS
from typed_transformer.audit import AuditReport, Example, ModuleAdapter, audit_module
from typed_transformer.cli import main

ROOT = Path(__file__).resolve().parents[3]


def _repros(text: str) -> list[str]:
    """Every repro snippet of a printed report: from ``import torch`` to its ``# check`` line."""
    return re.findall(r"^import torch\n.*?# check \w+$", text, flags=re.MULTILINE | re.DOTALL)


def _run(snippet: str, folder: Path | None = None) -> float:
    """Run ``snippet`` in a fresh interpreter at the repository root (in ``folder``, with it on the path, when
    given); the max error it prints."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*([str(folder)] if folder else []), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", snippet], cwd=folder or ROOT, env=env, capture_output=True,
                          text=True, timeout=HANG_SECONDS, check=False)
    assert done.returncode == 0, f"{snippet}\n---\n{done.stderr}"
    found = re.search(r"^max error (\S+)$", done.stdout, flags=re.MULTILINE)
    assert found is not None, done.stdout
    return float(found.group(1))


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["audit", *argv, "--max-examples", "4", "--budget", "quick"]) == 1
    repros = _repros(capsys.readouterr().out)
    assert repros
    return repros


def test_a_functions_repro_runs_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    repro = _cli(["tests.support.audit_candidates:missing_scale", "--checks", "reference", "--dtypes", "float32"],
                 capsys)
    assert _run(repro[0]) > 1e-3  # no 1/sqrt(d): far from the reference


def test_a_shipped_specs_repro_rebuilds_the_cli_module(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    # Llama's float32 rotary table in a float64 audit: an error far above float64's
    repro = _cli(["--module", "transformers.models.llama.modeling_llama:LlamaAttention", "--spec", "llama",
                  "--config", '{"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1}',
                  "--checks", "reference", "--dtypes", "float64", "--seed", "3"], capsys)
    assert "randomize_parameters(module, 3)" in repro[0]
    assert 1e-10 < _run(repro[0]) < 1e-4


def test_a_user_specs_repro_imports_it_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    repro = _cli(["--module", "transformers.models.gpt_neox.modeling_gpt_neox:GPTNeoXAttention", "--spec",
                  "tests.support.audit_specs:NEOX_AS_BLOCKS", "--config",
                  '{"hidden_size": 16, "num_attention_heads": 2}', "--checks", "reference", "--dtypes", "float32"],
                 capsys)
    assert "import_module('tests.support.audit_specs').NEOX_AS_BLOCKS" in repro[0]
    assert _run(repro[0]) > 1e-2


def _neox() -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention

    from typed_transformer.strategies import randomize_parameters

    config = transformers.GPTNeoXConfig(hidden_size=16, num_attention_heads=2)
    config._attn_implementation = "eager"
    return randomize_parameters(GPTNeoXAttention(config, layer_idx=0), 0)  # type: ignore[no-untyped-call]


def test_a_user_spec_and_factory_passed_in_python_are_named_by_their_import_paths() -> None:
    from tests.support.audit_specs import NEOX_AS_BLOCKS

    report: AuditReport = audit_module(_neox, NEOX_AS_BLOCKS, checks=["reference"], max_examples=3, budget="quick")
    repro = report["reference"].repro
    assert repro is not None
    assert "from tests.support.audit_specs import NEOX_AS_BLOCKS as spec" in repro
    assert "from tests.toolkit.audit.test_audit_repro import _neox as factory" in repro
    assert _run(repro) > 1e-2


def test_a_module_object_is_rebuilt_from_its_config_with_its_weights() -> None:
    from tests.support.audit_specs import NEOX_AS_BLOCKS

    repro = audit_module(_neox(), NEOX_AS_BLOCKS, checks=["reference"], max_examples=3,
                         budget="quick")["reference"].repro
    assert repro is not None
    assert "config = Config()" in repro
    assert "module = randomize_parameters(module, 0)" in repro  # recognised as the seeded weights it has
    assert _run(repro) > 1e-2


_USER_MODULE = """
import dataclasses
import torch
from torch import nn
from typed_transformer.audit import SPECS

def halved(m, x, key, value, keep, is_causal):  # planted: half the output
    return 0.5 * SPECS["torch_mha"].forward(m, x, key, value, keep, is_causal)

HALVED = dataclasses.replace(SPECS["torch_mha"], name="halved", forward=halved)

class Opaque(nn.MultiheadAttention):
    def __init__(self, *args):  # its constructor arguments are not kept
        super().__init__(8, 2, batch_first=True)
"""


def _user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A user's module ``user_attention_specs`` in a temporary folder on ``sys.path``."""
    import importlib

    (tmp_path / "user_attention_specs.py").write_text(_USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("user_attention_specs")


def test_a_user_spec_in_a_module_and_an_instance_with_its_own_weights_run(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    user = _user_folder(tmp_path, monkeypatch)
    module = nn.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True)
    with torch.no_grad():
        for i, param in enumerate(module.parameters()):  # weights no seed draws: carried in the repro
            param.copy_(torch.linspace(-1, 1, param.numel()).reshape(param.shape) * (i + 1) / 3)
    report = audit_module(module, user.HALVED, checks=["reference"], max_examples=3, dtypes=[torch.float64],
                          budget="quick")
    repro = report["reference"].repro
    assert repro is not None
    assert "from user_attention_specs import HALVED as spec" in repro
    assert "module = Module(8, 2, bias=True, add_bias_kv=True" in repro
    assert "# the audited weights" in repro
    printed = _run(repro, tmp_path)
    assert printed > 1e-2  # half the output: far from the reference
    fields = dict(report["reference"].counterexample or {})
    example = Example(**{**fields, "widths": tuple(fields["widths"])})
    adapter = ModuleAdapter(module, user.HALVED)
    out = adapter.call(example.inputs(), example.mask(), example.is_causal, example.torch_dtype)
    here = float((out.detach().double() - adapter.reference(example.inputs(), example.mask(), example.is_causal,
                                                   torch.float64)).abs().max())
    assert printed == pytest.approx(here, rel=1e-9)  # the audited module's own difference, in a fresh interpreter


def test_a_module_whose_class_keeps_no_constructor_arguments_says_so(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    user = _user_folder(tmp_path, monkeypatch)
    repro = audit_module(user.Opaque(), user.HALVED, checks=["reference"], max_examples=3,
                         budget="quick")["reference"].repro
    assert repro is not None
    assert "module = ...  # the Opaque you audited: build it here (its constructor arguments are not kept" in repro


def test_a_zero_spec_hugging_face_repro_rebuilds_module_and_spec(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    import torch
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    from typed_transformer.audit import hf_build, hf_spec
    from typed_transformer.strategies import randomize_parameters

    module = randomize_parameters(hf_build(GptOssAttention), 2)
    report = audit_module(module, hf_spec(module), checks=["reference"], max_examples=3, dtypes=[torch.float64],
                          conventions="infer", budget="quick")
    repro = report["reference"].repro
    assert repro is not None
    assert "spec = hf_spec(module)" in repro
    assert "module = randomize_parameters(module, 2)" in repro
    assert _run(repro, tmp_path) < 1e-6  # the rebuilt class: its float32 rotary tables in a float64 run only
    # a spec changed by hand cannot be rebuilt
    changed = audit_module(module, dataclasses.replace(hf_spec(module), sinks=None), checks=["reference"],
                           max_examples=3, budget="quick")["reference"].repro
    assert changed is not None
    assert "spec = ...  # the ModuleSpec 'hf:GptOssAttention' you passed" in changed


def test_a_spec_defined_in_a_script_is_not_imported_from_the_script() -> None:
    """A script's own names cannot be imported in a fresh interpreter, under ``__main__`` or its aliases (importing
    the audit registers multiprocessing's ``__mp_main__``, the same module): the repro says what to fill in."""
    script = (
        "from torch import nn\n"
        "from typed_transformer.audit import SPECS, audit_module\n"
        "import dataclasses\n"
        "def doubled(m, x, key, value, keep, is_causal):  # planted: twice the output\n"
        "    return 2 * SPECS['torch_mha'].forward(m, x, key, value, keep, is_causal)\n"
        "spec = dataclasses.replace(SPECS['torch_mha'], name='mine', forward=doubled)\n"
        "module = nn.MultiheadAttention(8, 2, batch_first=True)\n"
        "report = audit_module(module, spec, checks=['reference'], max_examples=3)\n"
        "print(report['reference'].repro)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HANG_SECONDS, check=False)
    assert done.returncode == 0, done.stderr
    assert "__main__" not in done.stdout, done.stdout
    assert "__mp_main__" not in done.stdout, done.stdout
    assert "spec = ...  # the ModuleSpec 'mine' you passed: define or import it here" in done.stdout
