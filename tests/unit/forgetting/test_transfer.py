"""The fixture world's transfer property on a reduced setting (mtft/forgetting/transfer.py, docs/fixtures.md):
fine-tuned on en only, the tiny encoder pre-trained on the world of translations scores de far above chance, the same
architecture randomly initialised does not, and neither does the encoder pre-trained on a world whose languages share
nothing (``shared=False``, the fixtures before the redesign). One layer of 32: with two layers the independent world
already transfers part of XNLI's structure (0.55 on de), the structural transfer of K et al. (2020), which would blur
what this test is about -- lexical knowledge that only shared structure gives."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mtft.forgetting.transfer import Setting, finetune, pretrain, random_like

REDUCED = Setting(
    languages=("en", "de"),
    sources=("en",),
    hidden_size=32,
    layers=1,
    vocab_size=500,
    pretrain_steps=1500,
    pretrain_lr=1e-2,
    finetune_steps=100,
    retrieval_sentences=50,
)


@pytest.fixture
def one_thread():
    """This reduced setting is at the edge of what the tiny encoder learns: its outcome moves with the seed and with
    the order of float sums, so the test fixes both (seed 0; one thread, whatever the worker's share)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # three encoders pre-trained and fine-tuned (22 s alone): in the full suite, not the fast loop
def test_target_accuracy_comes_from_pretraining_on_a_world_of_translations(tmp_path, one_thread):
    pre = pretrain(REDUCED, tmp_path)
    transferred = finetune(pre, REDUCED)["accuracy"]
    scratch = finetune(random_like(pre, REDUCED.seed), REDUCED)["accuracy"]
    independent = replace(REDUCED, shared=False)
    unrelated = finetune(pretrain(independent, tmp_path), independent)["accuracy"]
    # XNLI's chance is 1/3: the pre-trained encoder transfers, the random one and the unrelated world do not.
    # Measured (one thread): de 0.75 here; with seeds 1 and 2, 0.65 and 0.54, against at most 0.37 (random) and
    # 0.41 (independent world). The full-size evidence, with its command, is in docs/fixtures.md.
    assert transferred["de"] >= 0.5, transferred
    assert scratch["de"] <= 0.45 and unrelated["de"] <= 0.45, (scratch, unrelated)
    assert transferred["de"] - max(scratch["de"], unrelated["de"]) >= 0.15
    assert transferred["en"] > 0.9 and scratch["en"] > 0.9  # both learn the source language
