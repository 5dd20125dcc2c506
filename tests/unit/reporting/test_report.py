"""The run report's weighting section."""

from __future__ import annotations

from mtft.reporting.report import Report, TaskTable, _weighting_section


def weighting_events(weights: list[tuple[float, float]], **logged: float) -> list[dict]:
    return [
        {
            "kind": "weighting",
            "step": 10 * (i + 1),
            "weight/xnli/en": a,
            "weight/xnli/ar": b,
            "d_norm_sq": 1e-3,
            "stationarity": 1e-4,
            "fw_gap": 0.0,
            "seconds": 1e-4,
            **logged,
        }
        for i, (a, b) in enumerate(weights)
    ]


def test_report_says_when_one_objective_took_all_the_weight():
    events = weighting_events([(0.5, 0.5), (0.3, 0.7), (0.001, 0.999), (0.0, 1.0), (0.0, 1.0), (0.003, 0.997)])
    text = "\n".join(_weighting_section(events))
    assert "From step 30 to the end, **xnli/ar** took 0.999 of the weight on average" in text
    assert "Pareto stationarity (Theorem 3)" in text and "`weighting.options.floor`" in text
    # an unfloored run logged with floor 0 reads the same, with no collapse-guard paragraph
    logged = "\n".join(_weighting_section(weighting_events([(0.0, 1.0)] * 6, floor=0.0, min_d_dot_g=1e-3)))
    assert "of the weight on average: once an objective is fitted" in logged
    assert "Collapse guard" not in logged and "min_t dᵀg_t |" not in logged


def test_report_is_silent_when_the_weights_stay_spread_or_concentrate_only_at_the_end():
    spread = weighting_events([(0.5, 0.5), (0.4, 0.6), (0.3, 0.7), (0.45, 0.55), (0.5, 0.5)])
    late = weighting_events([(0.5, 0.5), (0.4, 0.6), (0.3, 0.7), (0.45, 0.55), (0.2, 0.8), (0.0, 1.0)])
    interrupted = weighting_events([(0.0, 1.0), (0.0, 1.0), (0.5, 0.5), (0.0, 1.0), (0.0, 1.0), (0.3, 0.7)])
    for events in (spread, late, interrupted):
        assert "of the weight on average" not in "\n".join(_weighting_section(events))


def test_floored_run_does_not_claim_theorem2_and_counts_the_steps_that_raised_a_loss():
    events = weighting_events([(0.3, 0.7), (0.25, 0.75), (0.25, 0.75), (0.3, 0.7)], floor=0.5, min_d_dot_g=2e-4)
    events[1]["min_d_dot_g"] = -3e-3
    events[2]["min_d_dot_g"] = -1e-4
    text = "\n".join(_weighting_section(events))
    assert "β = 0.5" in text and "| min_t dᵀg_t |" in text and "-3.00e-03" in text
    assert "not guaranteed to decrease every objective (Theorem 2 holds only for β = 0)" in text
    assert "min_t dᵀg_t was negative -- some objective's loss rose to first order -- at 2 of 4 logged steps" in text
    assert "lowest -3.00e-03" in text
    for e in events:
        e["min_d_dot_g"] = 1e-4
    assert "here min_t dᵀg_t stayed ≥ 0 at all 4 logged steps" in "\n".join(_weighting_section(events))


def test_floored_run_with_a_dominant_objective_is_described_without_the_collapse_explanation():
    events = weighting_events([(0.5, 0.5), (0.005, 0.995)] + [(0.005, 0.995)] * 5, floor=0.01, min_d_dot_g=-1e-5)
    text = "\n".join(_weighting_section(events))
    assert "**xnli/ar** took 0.995 of the weight on average, with the floor β = 0.01 holding" in text
    assert "Theorem 3" not in text.split("Collapse guard")[1] and "min-norm direction is about" not in text


def test_descent_check_and_metric_are_reported():
    """With gradients.descent_check the section counts the steps whose applied update decreased every objective
    (an absent objective's NaN left out of its fraction); with gradients.metric=optimizer it says in which inner
    product ‖d‖² and the certificate are."""
    nan = float("nan")
    changes = [(-1.0, -2.0), (-1.0, 0.5), (-1.0, nan), (0.1, -0.2)]
    events = weighting_events([(0.5, 0.5)] * 4, metric_preconditioned=1.0)
    events[0]["metric_preconditioned"] = 0.0
    for event, (en, ar) in zip(events, changes):
        common = float(en < 0 and (ar != ar or ar < 0))
        event.update({"first_order/xnli/en": en, "first_order/xnli/ar": ar, "common_descent": common})
    text = "\n".join(_weighting_section(events))
    assert "at 2 of 4 steps (0.50)" in text
    assert "xnli/en 0.75, xnli/ar 0.67" in text
    assert "formed in the optimizer's metric" in text and "(at 3 of 4 steps;" in text
    plain = "\n".join(_weighting_section(weighting_events([(0.5, 0.5)] * 4)))
    assert "First-order check" not in plain and "optimizer's metric" not in plain


def test_evaluation_table_shows_the_majority_class_baseline_only_where_the_run_scored_one(tmp_path):
    final = {"rte/en/accuracy": 0.6, "rte/accuracy": 0.6, "rte/majority_accuracy": 0.527, "stsb/pearson": 0.8}
    metrics = {"rte": ["accuracy"], "stsb": ["pearson"]}
    tables = {task: TaskTable(names, ["en"]) for task, names in metrics.items()}
    text = Report("t", [], final, tables).write(tmp_path).read_text()
    rte, stsb = text.split("### stsb")
    assert "| majority-class baseline (macro) | 0.5270 |" in rte and "majority" not in stsb


def test_a_run_at_its_majority_baseline_everywhere_says_so(tmp_path):
    """Every (task, language) metric at or below its majority-class baseline: one sentence in the report (and the
    log); one metric above it and the run has learnt something, so nothing is said."""
    from mtft.reporting.report import learnt_nothing

    flat = {"xnli/en/accuracy": 0.3467, "xnli/en/majority_accuracy": 0.3467, "xnli/de/accuracy": 0.30}
    flat.update({"xnli/de/majority_accuracy": 0.3467, "xnli/accuracy": 0.323, "xnli/majority_accuracy": 0.3467})
    said = learnt_nothing(flat)
    assert said is not None and said.startswith("Every objective ended at or below its majority-class baseline (2")
    text = Report("t", [], flat, {"xnli": TaskTable(["accuracy"], ["en", "de"])}).write(tmp_path).read_text()
    assert f"**{said}**" in text
    assert learnt_nothing({**flat, "xnli/de/accuracy": 0.5}) is None
    assert learnt_nothing({"stsb/en/pearson": 0.1}) is None  # no baseline: nothing to say


def test_every_report_has_the_training_curves(tmp_path):
    """Each objective's training loss (an objective absent from a logged window is a gap, not a zero), and the tasks'
    macro metrics once the run was evaluated twice: a figure in every report, monitors or not."""
    import json

    rows = [
        {"step": s, "kind": "train", "loss": 1.0 / s, "loss/x/en": 1.0 / s, "loss/x/de": None if s == 2 else 2.0 / s}
        for s in (1, 2, 3)
    ]
    rows += [{"step": s, "kind": "eval", "x/accuracy": 0.5 + s / 10, "x/majority_accuracy": 0.4} for s in (2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = Report("t", [], {}, {}).write(tmp_path).read_text()
    assert "![Training loss per objective and evaluation per task](training_curves.png)" in text
    assert (tmp_path / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "training_curves.png").unlink()
    assert "training_curves" not in Report("t", [], {}, {}).write(tmp_path).read_text()  # an evaluation alone: none
