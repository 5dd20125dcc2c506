"""The report's forgetting section from logged rows, including a run whose last row is all null (its weights
became NaN: strict JSON writes NaN as null)."""

from __future__ import annotations

import json

from mtft.forgetting.report import monitor_sections

EIGEN = {
    "kind": "lambda_p",
    "step": 0,
    "lambda_p": 50.0,
    "eigen_converged": True,
    "parameters": 1000,
    "hessian_examples_per_language": 8,
    "eigen_method": "power",
    "eigen_products": 5,
    "eigen_residual": 1e-4,
    "cached": False,
    "prediction_examples_per_language": 4,
}
KEYS = ("F_p", "lp/en", "F_p/en", "bound_displacement", "bound_path", "F_batch", "prediction", "linear", "quadratic")


def row(step: int, value):
    return {"kind": "forgetting", "step": step, "K": step, **{k: value for k in KEYS}}


def test_a_null_row_is_shown_as_a_dash_and_compared_with_nothing(tmp_path):
    rows = [EIGEN, row(50, 0.5), row(100, None)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = "\n".join(monitor_sections(tmp_path))
    assert "| 100 | 100 | – |" in text and "| 50 | 50 | 5.000e-01 |" in text
    assert "Beyond the quadratic regime" not in text  # 0.5 is not more than twice 0.5; the null row is not compared


def test_the_retrieval_table_has_theta_p_then_every_measurement(tmp_path):
    eigen = {**EIGEN, "retrieval_pretrained": 0.8, "retrieval_pretrained/en-de": 0.9, "retrieval_pretrained/en-zh": 0.7}
    measured = {**row(50, 0.5), "retrieval": 0.6, "retrieval/en-de": 0.75, "retrieval/en-zh": 0.45}
    measured["retrieval_drop"] = 0.2
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (eigen, measured)))
    text = "\n".join(monitor_sections(tmp_path))
    assert "| step | retrieval (mean) | en-de | en-zh | drop |" in text
    assert "| θ_p | 0.800 | 0.900 | 0.700 | – |" in text and "| 50 | 0.600 | 0.750 | 0.450 | +0.200 |" in text
    # a run without forgetting.retrieval has no table
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (EIGEN, row(50, 0.5))))
    assert "retrieval" not in "\n".join(monitor_sections(tmp_path))
