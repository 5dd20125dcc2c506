"""The session's set-up: offline Hub, a private cache per session, the warm Python, markers and the cost table.
What tests share as code lives in tests/helpers/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the launchers (tests.helpers.launch imports no torch, so the thread settings below come first)
from tests.helpers.launch import (
    MULTIPROCESS,
    REPO,
    THREADS,
    WARM,
)

# A pytest-xdist worker computes with its share of the cores, as its launches do (THREADS): two workers of two
# threads each on two cores spin against each other. Set before torch is first imported here.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_variable, str(THREADS))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the marker into the group it schedules by
def pytest_collection_modifyitems(config, items):
    """Everything under tests/e2e/ runs the training loop: marked slow by directory, so that
    ``python -m pytest -m "not slow"`` is the fast loop (tests/unit/). A multi-process test must carry its own
    ``@pytest.mark.timeout(N)``: a hung collective then fails that test instead of blocking CI.

    Under pytest-xdist (``--dist loadgroup``, setup.cfg) the tests of a module that share a run (a module-scoped
    fixture) go to one worker together, so that the run is made once; every other test goes wherever a worker is
    free."""
    untimed = []
    for item in items:
        if "e2e" in item.path.relative_to(REPO / "tests").parts:
            item.add_marker(pytest.mark.slow)
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures is not None and any(
            definition.scope in ("module", "class", "package")
            for definitions in fixtures.name2fixturedefs.values()
            for definition in definitions
        ):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if item.get_closest_marker("multiprocess") and not item.get_closest_marker("timeout"):
            untimed.append(item.nodeid)
    if untimed:
        raise pytest.UsageError("marked multiprocess without @pytest.mark.timeout(N): " + ", ".join(untimed))


def session_folder(tmp_path_factory) -> Path:
    """The folder of this test session, shared by its pytest-xdist workers (each has a sub-folder of its own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Tokenizers, datasets and pre-trained backbones are cached in a folder of this test session, not the user's,
    shared by its workers (mtft's stage cache and datasets' lock their entries, so a backbone is pre-trained once)."""
    cache = session_folder(tmp_path_factory) / "cache"
    cache.mkdir(exist_ok=True)
    os.environ["MTFT_CACHE"] = str(cache / "mtft")
    os.environ["HF_DATASETS_CACHE"] = str(cache / "datasets")
    import datasets.config

    datasets.config.HF_DATASETS_CACHE = Path(os.environ["HF_DATASETS_CACHE"])
    return cache


@pytest.fixture(scope="session", autouse=True)
def machine(private_cache, tmp_path_factory):
    """The lock of multi-process launches shared by the session's workers, and this test process's warm Python
    (tests/helpers/launch.py), started at the first launch after :func:`private_cache` has set the environment it
    imports the libraries with; ``MTFT_TESTS_COLD=1`` launches fresh interpreters instead."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        MULTIPROCESS.path = session_folder(tmp_path_factory) / "multiprocess.lock"
        import torch

        torch.set_num_threads(THREADS)  # in case a plugin imported torch before this file set OMP_NUM_THREADS
    if os.environ.get("MTFT_TESTS_COLD") != "1":
        WARM.folder = tmp_path_factory.mktemp("warm")
    yield
    WARM.stop()
    if MULTIPROCESS.path is not None:  # for the summary of the session (pytest_terminal_summary)
        with open(MULTIPROCESS.path.with_suffix(".held_s"), "a") as log:
            log.write(f"{MULTIPROCESS.held_s}\n")
    MULTIPROCESS.path = None


@pytest.fixture
def repo() -> Path:
    return REPO


# ----- what the suite costs -----------------------------------------------------------------------------------
_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Each test's seconds, set-up (its share of a module's shared runs) and tear-down included."""
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The slowest test files and tests of the session, so that what the suite costs stays visible (docs/testing.md,
    its figures in docs/results.md: a new end-to-end test reuses a shared run unless it needs its own)."""
    if not _SECONDS:
        return
    files: dict[str, float] = {}
    for nodeid, seconds in _SECONDS.items():
        files[nodeid.split("::")[0]] = files.get(nodeid.split("::")[0], 0.0) + seconds
    write = terminalreporter.write_line
    terminalreporter.section("what the suite costs")
    write(f"{sum(_SECONDS.values()):.0f} s in {len(_SECONDS)} tests (summed over the workers); slowest files:")
    for name, seconds in sorted(files.items(), key=lambda item: -item[1])[:12]:
        write(f"  {seconds:7.1f} s  {name}")
    held = Path(terminalreporter.config._tmp_path_factory.getbasetemp(), "multiprocess.held_s")
    if held.is_file():  # written by each worker at its end (the fixture machine)
        serial = sum(float(line) for line in held.read_text().split())
        write(f"multi-process launches ran one at a time for {serial:.0f} s")
    write("slowest tests:")
    for nodeid, seconds in sorted(_SECONDS.items(), key=lambda item: -item[1])[:12]:
        write(f"  {seconds:7.1f} s  {nodeid}")
