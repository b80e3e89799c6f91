"""The audit on a device (issue 42): ``device=`` on audit_attention, audit_module and infer_conventions, ``--device``
on the command line. On this CPU-only CI the device path runs with an explicit ``device="cpu"`` and a candidate that
asserts the device of every tensor it receives; with CUDA present the same tests run on ``cuda`` too."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tests.support import kernels
from typed_transformer.audit import audit_attention, audit_module, infer_conventions
from typed_transformer.cli import main

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _on(device: str) -> Any:
    """The tiled kernel, asserting that every tensor it is given is on ``device``; its output stays there."""
    seen: list[torch.device] = []

    def candidate(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
        for x in (q, k, v, attn_mask):
            if x is not None:
                assert x.device.type == device, f"got a tensor on {x.device}"
                seen.append(x.device)
        return kernels.paper_kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    candidate.seen = seen  # type: ignore[attr-defined]
    return candidate


@pytest.mark.parametrize("device", DEVICES)
def test_a_function_is_called_on_the_device_with_the_same_examples(device: str) -> None:
    candidate = _on(device)
    report = audit_attention(candidate, conventions="infer", device=device, seed=0, max_examples=4, budget="quick",
                             dtypes=[torch.float32])
    assert report.passed, report.table()
    assert candidate.seen
    assert report.environment["device"] == device
    assert report.environment["device_name"]
    here = audit_attention(kernels.paper_kernel, conventions="infer", seed=0, max_examples=4, budget="quick",
                           dtypes=[torch.float32])
    assert [r.ratio for r in report.results] == [r.ratio for r in here.results]  # the same examples, the same errors


def test_infer_conventions_takes_a_device() -> None:
    candidate = _on("cpu")
    inference = infer_conventions(candidate, device="cpu")
    assert inference.findings == []
    assert candidate.seen


class _Checked(nn.MultiheadAttention):
    """torch's MHA asserting the device of its inputs."""

    expected = "cpu"

    def forward(self, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Any:
        for x in (query, key, value, kwargs.get("attn_mask"), kwargs.get("key_padding_mask")):
            assert x is None or x.device.type == self.expected, f"got a tensor on {x.device}"
        return super().forward(query, key, value, *args, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_a_modules_copies_move_with_their_weights_and_its_own_device_is_the_default(device: str) -> None:
    module = _Checked(8, 2, batch_first=True).to(device)
    module.expected = device
    import dataclasses

    from typed_transformer.audit import SPECS

    spec = dataclasses.replace(SPECS["torch_mha"], module_type="")
    report = audit_module(module, spec, checks=["reference", "masking"], dtypes=[torch.float32], max_examples=3,
                          budget="quick")
    assert report.passed, report.table()
    assert report.environment["device"] == device
    assert next(module.parameters()).device.type == device  # the caller's module stays where it was


def test_a_device_that_is_not_here_is_one_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="device 'nowhere' is not usable here"):
        audit_attention(kernels.paper_kernel, device="nowhere", budget="quick")
    assert main(["audit", "tests.support.kernels:paper_kernel", "--device", "nowhere", "--budget", "quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("typed-transformer: error: --device: device 'nowhere' is not usable here")


def test_the_command_line_device_flag_is_recorded_in_the_json_report(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    assert main(["audit", "tests.support.kernels:paper_kernel", "--device", "cpu", "--budget", "quick", "--checks",
                 "reference", "--dtypes", "float32", "--json", str(out)]) == 0
    environment = json.loads(out.read_text())["environment"]
    assert environment["device"] == "cpu"
    assert {"torch", "device_name"} <= set(environment)
