"""The figures' shared parts (mtft/reporting/figures.py): log-axis labels as text, the same ticks labelled as
matplotlib labels them, no mathtext drawn, and one way to save."""

from __future__ import annotations

import io

import matplotlib.mathtext
import pytest
from matplotlib import ticker

from mtft.reporting.figures import as_text, log_scale, plt, save_figure

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "label, text",
    [
        (r"$\mathdefault{10^{-3}}$", "10⁻³"),
        (r"$\mathdefault{10^{12}}$", "10¹²"),
        (r"$\mathdefault{10^{0}}$", "10⁰"),
        (r"$\mathdefault{2\times10^{-1}}$", "2\u2009×\u200910⁻¹"),
        (r"$\mathdefault{-10^{-4}}$", "−10⁻⁴"),
        (r"$\mathdefault{0}$", "0"),
        ("", ""),
        # not a form the scientific-notation formatter writes: left to mathtext
        (r"$\mathdefault{10^{1.50}}$", r"$\mathdefault{10^{1.50}}$"),
        (r"$\alpha$", r"$\alpha$"),
    ],
)
def test_a_log_label_becomes_the_same_text(label, text):
    assert as_text(label) == text


def _labels(ax, axis: str) -> tuple[list[str], list[str]]:
    """(major, minor) tick labels of ``ax``'s ``axis`` as drawn."""
    ax.figure.canvas.draw()
    target = ax.xaxis if axis == "x" else ax.yaxis
    return [t.get_text() for t in target.get_majorticklabels()], [t.get_text() for t in target.get_minorticklabels()]


@pytest.mark.parametrize(
    "scale, limits",
    [
        ({}, (1e-6, 1e2)),  # many decades: decades only
        ({}, (0.15, 0.6)),  # less than one decade: matplotlib labels minor ticks too
        ({}, (2e-3, 3e-2)),
        ({"base": 2}, (1, 64)),
        ({"kind": "symlog", "linthresh": 1e-4}, (-1e-2, 1e3)),
    ],
)
@pytest.mark.parametrize("axis", ["x", "y"])
def test_the_same_ticks_are_labelled_as_matplotlib_labels_them(scale, limits, axis):
    figures = []
    for ours in (False, True):
        fig, ax = plt.subplots()
        kind = dict(scale).pop("kind", "log")
        options = {k: v for k, v in scale.items() if k != "kind"}
        if ours:
            log_scale(ax, axis, **scale)
        else:
            (ax.set_xscale if axis == "x" else ax.set_yscale)(kind, **options)
        (ax.set_xlim if axis == "x" else ax.set_ylim)(*limits)
        figures.append(_labels(ax, axis))
        plt.close(fig)
    theirs, ours = figures
    assert any(label for label in theirs[0] + theirs[1])
    for their_labels, our_labels in zip(theirs, ours):
        assert [as_text(label) for label in their_labels] == our_labels
        assert not any("$" in label for label in our_labels)


def test_a_figure_with_log_axes_is_saved_without_mathtext(tmp_path, monkeypatch):
    """What makes the labels worth having: drawing them never reaches matplotlib's mathtext parser."""

    def no_mathtext(*args, **kwargs):
        raise AssertionError("mathtext parsed")

    monkeypatch.setattr(matplotlib.mathtext.MathTextParser, "parse", no_mathtext)
    fig, (left, right) = plt.subplots(1, 2)
    left.plot([1, 2, 3], [1e-5, 3e-2, 0.4])
    log_scale(left, "y")
    right.plot([1e-3, 1e-1, 1.0], [-1e-3, 0.0, 5.0])
    log_scale(right, "x")
    log_scale(right, "y", kind="symlog", linthresh=1e-4)
    assert save_figure(fig, tmp_path / "f.png", dpi=50) == tmp_path / "f.png"
    assert (tmp_path / "f.png").read_bytes().startswith(PNG)
    assert not plt.get_fignums()  # closed
    assert isinstance(left.yaxis.get_major_formatter(), ticker.LogFormatterSciNotation)


def test_save_figure_writes_png_to_an_open_file():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    out = io.BytesIO()
    save_figure(fig, out, dpi=30)
    assert out.getvalue().startswith(PNG)
