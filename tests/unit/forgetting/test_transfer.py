"""The fixture world's transfer property on a reduced setting (mtft/forgetting/transfer.py, docs/fixtures.md):
fine-tuned on en only, the tiny encoder pre-trained on the world of translations scores de far above chance, the same
architecture randomly initialised does not, and neither does the encoder pre-trained on a world whose languages share
only the grammar (``shared=False``: no word, fact, parallel or code-switched sentence). One layer of 32: with two
layers at full size the independent world transfers much of XNLI through the grammar alone (docs/fixtures.md), the
structural transfer of K et al. (2020), which would blur what this test is about -- lexical knowledge (which de word
is en's "indeed", "maybe", "not") that only the shared world gives."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mtft.forgetting.transfer import Setting, finetune, pretrain, random_inits

REDUCED = Setting(
    languages=("en", "de"),
    sources=("en",),
    hidden_size=32,
    layers=1,
    vocab_size=500,
    pretrain_steps=3000,
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


@pytest.mark.slow  # two encoders pre-trained, five fine-tuned (about 90 s alone): in the full suite, not the fast loop
def test_target_accuracy_comes_from_pretraining_on_a_world_of_translations(tmp_path, one_thread):
    pre = pretrain(REDUCED, tmp_path)
    transferred = finetune(pre, REDUCED)["accuracy"]
    # A random encoder's de accuracy is all or nothing per initialisation (random_inits): read over three.
    scratch = [finetune(init, REDUCED)["accuracy"] for init in random_inits(REDUCED, tmp_path, 3)]
    scratch_de = sum(accuracy["de"] for accuracy in scratch) / len(scratch)
    independent = replace(REDUCED, shared=False)
    unrelated = finetune(pretrain(independent, tmp_path), independent)["accuracy"]
    # XNLI's chance is 1/3: the pre-trained encoder transfers, the random one and the unrelated world do not.
    # Measured (one thread): de 0.98 here; with seeds 1 and 2, 0.41 and 0.95, against random initialisations' 0.31,
    # 0.32 and 0.34 (mean of three; seed 2's three: 0.37, 0.01, 0.63) and the independent world's 0.30, 0.31, 0.33.
    # Seed 1 does not transfer: at this size the outcome is a coin the seed tosses, so the evidence is the full-size
    # runs in docs/results.md ("Transfer in the fixture world"), with their command; this test pins one seed that
    # does. 1,500 pre-training steps were too few for the world of markers (de 0.48, 0.36, 0.32).
    assert transferred["de"] >= 0.5, transferred
    assert scratch_de <= 0.45 and unrelated["de"] <= 0.45, (scratch, unrelated)
    assert transferred["de"] - max(scratch_de, unrelated["de"]) >= 0.15
    assert transferred["en"] > 0.9 and all(accuracy["en"] > 0.9 for accuracy in scratch)  # both learn the source


def test_the_command_refuses_unknown_encoders_in_one_line(capsys):
    from mtft.forgetting.transfer import main

    with pytest.raises(SystemExit) as exit_:
        main(["--encoders", "translations,scratch"])
    assert exit_.value.code == 2
    assert "--encoders takes a comma list of translations, random, independent" in capsys.readouterr().err


def test_random_initialisations_differ_and_share_the_tokenizer(tmp_path):
    setting = replace(REDUCED, pretrain_steps=1)
    first, second = random_inits(setting, tmp_path, 2)
    assert first.tokenizer.get_vocab() == second.tokenizer.get_vocab() and first.loss is None
    embeddings = [b.encoder.embeddings.word_embeddings.weight for b in (first, second)]
    assert not torch.equal(*embeddings)
    assert torch.equal(random_inits(setting, tmp_path, 1)[0].encoder.embeddings.word_embeddings.weight, embeddings[0])
