"""One copy of what a multi-process run says (mtft.core.distributed): the first process of a node prints a user
error, the libraries' known per-rank noise is dropped, and real warnings still come through."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import transformers

from mtft.core.distributed import quiet_library_noise, report_to_launcher, speaks_for_node


@pytest.mark.parametrize(
    "world_size, local_rank, speaks",
    [
        (None, None, True),  # no launcher
        ("4", "0", True),
        ("4", "1", False),
        ("4", "3", False),
        ("1", "1", True),  # a stray LOCAL_RANK in a one-process run's environment
        (None, "1", True),
    ],
)
def test_the_first_process_of_a_node_speaks(monkeypatch, world_size, local_rank, speaks):
    for name, value in (("WORLD_SIZE", world_size), ("LOCAL_RANK", local_rank)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert speaks_for_node() is speaks


@pytest.fixture
def restored_transformers_verbosity():
    level = transformers.utils.logging.get_verbosity()
    yield
    transformers.utils.logging.set_verbosity(level)


@pytest.mark.parametrize("is_main", [True, False])
def test_known_noise_is_dropped_and_the_rest_kept(restored_transformers_verbosity, is_main):
    transformers.utils.logging.set_verbosity_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_library_noise(is_main)
        for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            message = f"`torch.distributed.{name}` is deprecated. Please use `torch.distributed.x` instead."
            warnings.warn(message, FutureWarning, stacklevel=1)
        warnings.warn("`torch.distributed.broadcast` is deprecated.", FutureWarning, stacklevel=1)
        warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated.", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [
        "`torch.distributed.broadcast` is deprecated.",
        "`torch.distributed.all_gather_into_tensor` is deprecated.",
    ]
    loader = logging.getLogger("transformers.modeling_utils")  # its weight-loading report is a warning
    assert loader.isEnabledFor(logging.WARNING) is is_main
    assert loader.isEnabledFor(logging.ERROR)


def test_a_silent_process_names_its_error_in_torchruns_report(tmp_path, monkeypatch):
    """The file torchrun reads into its ChildFailedError report, in torchrun's format; no file outside torchrun."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    report_to_launcher("ConfigError: nothing")  # no launcher: nothing written, nothing raised
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    report_to_launcher("ConfigError: the line")
    assert json.loads(path.read_text())["message"]["message"] == "ConfigError: the line"
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=2, error_file=str(path))  # how torchrun reads it
    assert failure.message["extraInfo"]["py_callstack"] == "ConfigError: the line"
