"""The run report's weighting section."""

from __future__ import annotations

from mtft.reporting.report import _weighting_section


def weighting_events(weights: list[tuple[float, float]]) -> list[dict]:
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
        }
        for i, (a, b) in enumerate(weights)
    ]


def test_report_says_when_one_objective_took_all_the_weight():
    events = weighting_events([(0.5, 0.5), (0.3, 0.7), (0.001, 0.999), (0.0, 1.0), (0.0, 1.0), (0.003, 0.997)])
    text = "\n".join(_weighting_section(events))
    assert "From step 30 to the end, **xnli/ar** took 0.999 of the weight on average" in text


def test_report_is_silent_when_the_weights_stay_spread_or_concentrate_only_at_the_end():
    spread = weighting_events([(0.5, 0.5), (0.4, 0.6), (0.3, 0.7), (0.45, 0.55), (0.5, 0.5)])
    late = weighting_events([(0.5, 0.5), (0.4, 0.6), (0.3, 0.7), (0.45, 0.55), (0.2, 0.8), (0.0, 1.0)])
    interrupted = weighting_events([(0.0, 1.0), (0.0, 1.0), (0.5, 0.5), (0.0, 1.0), (0.0, 1.0), (0.3, 0.7)])
    for events in (spread, late, interrupted):
        assert "of the weight on average" not in "\n".join(_weighting_section(events))
