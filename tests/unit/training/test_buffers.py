"""gradients.buffers: auto -- the buffers' bytes by formula (a ZeRO-3 partition counted at its full shape)
and the choice against a budget, with the reason for the log."""

from __future__ import annotations

import torch

from mtft.training.buffers import buffer_bytes, choose_buffers


def test_bytes_count_dense_parameters_over_the_ranks_and_the_rows_a_step_can_touch():
    dense, table = torch.zeros(10, 4), torch.zeros(1000, 8)
    assert buffer_bytes([dense, table], {table}, 3, 2, tokens_per_step=50) == 3 * (40 // 2 + 50 * 8) * 4


def test_a_zero3_partition_is_counted_at_its_full_shape():
    table = torch.zeros(0)  # ZeRO-3's placeholder between passes; its shape is ds_shape
    table.ds_shape, table.ds_numel = torch.Size([1000, 8]), 8000
    assert buffer_bytes([table], {table}, 2, 1, tokens_per_step=50, element_size=2) == 2 * 50 * 8 * 2


def test_auto_chooses_by_the_budget_and_says_why():
    cpu = torch.device("cpu")
    fits = choose_buffers("auto", 2**20, 0.5, cpu, 48)
    assert fits.mode == "full" and "fit in the budget of 512.0 MiB" in fits.why
    over = choose_buffers("auto", 2**31, 0.5, cpu, 48)
    assert over.mode == "none" and "2.00 GiB of per-objective buffers at T = 48 exceed" in over.why
    assert choose_buffers("bfloat16", 2**31, None, cpu, 48).mode == "bfloat16"


def test_auto_without_a_budget_decides_from_the_process_with_the_least_memory(monkeypatch):
    """Two ranks with different free memory take the same step: both decide from the smaller figure (a buffered and
    a bufferless rank would wait for each other's collectives forever)."""
    from mtft.training import buffers

    free = {"me": 8 * 2**30}
    monkeypatch.setattr(buffers, "free_memory", lambda device: (free["me"], "the host's available memory"))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: "gloo")

    def all_reduce(tensor, op):  # the other rank has 1 GiB free
        tensor.fill_(min(int(tensor.item()), 2**30))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    choice = buffers.choose_buffers("auto", 3 * 2**30, None, torch.device("cpu"), 15)  # fits 8 GiB / 2, not 1 GiB / 2
    assert choice.mode == "none" and "the smallest of the 2 processes'" in choice.why and "512.0 MiB" in choice.why
