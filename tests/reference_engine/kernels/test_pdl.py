"""Programmatic dependent launch switch (`kernels/pdl.py`): off by default, never under the interpreter,
set by a tuning file. The launches themselves are compared with and without PDL on CUDA
(tests/reference_engine/test_cuda_graphs.py)."""

from __future__ import annotations

import json

import pytest

from reference_engine.kernels import pdl, tuning


def test_off_by_default_and_under_the_interpreter(monkeypatch):
    assert pdl.PDL is False
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert pdl.launch_args() == {}
    monkeypatch.setattr(pdl, "PDL", True)
    assert pdl.launch_args() == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.launch_args() == {}


def test_tuning_file_sets_it_and_rejects_a_non_boolean(tmp_path, monkeypatch):
    monkeypatch.setattr(pdl, "PDL", False)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "test", "pdl": True}))
    tuning.apply_tuning(path)
    assert pdl.PDL is True
    path.write_text(json.dumps({"device": "test", "pdl": "sometimes"}))
    with pytest.raises(ValueError, match="pdl"):
        tuning.apply_tuning(path)
