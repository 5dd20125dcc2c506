"""The multi-task model: heads, per-objective loss sums, and the step's exact global means."""

from __future__ import annotations

import subprocess
import sys

import torch

from mtft.models.heads import SequenceClassificationHead
from tests.helpers.launch import clean_env
from tests.helpers.models import batch, tiny_model


def test_tiny_encoder_shape_and_no_pooler(tmp_path):
    model, tok = tiny_model(tmp_path)
    assert model.encoder.config.model_type == "xlm-roberta"
    assert model.encoder.config.vocab_size == len(tok)
    assert model.encoder.pooler is None


def test_per_objective_sums_match_per_example_losses(tmp_path):
    model, tok = tiny_model(tmp_path)
    b = batch(tok, heads=[0, 1, 0, 1], objectives=[0, 2, 0, 1], labels=[1, 2, 0, 0])
    sums, counts = model(**b)
    hidden = model.encoder(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    per_example = [
        torch.nn.functional.cross_entropy(model.heads["ab"[h]].logits(hidden[i : i + 1]), b["labels"][i : i + 1])
        for i, h in enumerate([0, 1, 0, 1])
    ]
    torch.testing.assert_close(sums, torch.stack([per_example[0] + per_example[2], per_example[3], per_example[1]]))
    assert counts.tolist() == [2.0, 1.0, 1.0]


def test_absent_head_still_takes_part_with_zero_gradient(tmp_path):
    model, tok = tiny_model(tmp_path)
    sums, _ = model(**batch(tok, heads=[0, 0], objectives=[0, 1], labels=[1, 0]))
    sums.sum().backward()
    for name, param in model.heads["b"].named_parameters():
        assert param.grad is not None and torch.count_nonzero(param.grad) == 0, name
    assert any(torch.count_nonzero(p.grad) > 0 for p in model.heads["a"].parameters())


def test_head_decodes_label_names():
    head = SequenceClassificationHead(4, ["neg", "pos"], 0.0)
    assert head.decode(torch.tensor([[0.1, 0.9], [2.0, -1.0]])) == ["pos", "neg"]


def test_tiny_tokenizer_is_a_function_of_its_texts(tmp_path):
    """Trained in separate processes (the Rust trainer's hash-map order changes per process), the tokenizer --
    and so every embedding row of a model pre-trained on it -- comes out identical."""
    script = (
        "import sys; from pathlib import Path; from mtft.fixtures.generic_text import rows; "
        "from mtft.models.tokenizer import tiny_tokenizer\n"
        "texts = [r['text'] for lang in ('en', 'zh', 'ar') for r in rows(lang, 'train', 200)]\n"
        "tiny_tokenizer(texts, 400, Path(sys.argv[1]))\n"
    )
    trained = []
    for attempt in range(3):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / str(attempt))], check=True, env=clean_env())
        [folder] = (tmp_path / str(attempt) / "tokenizers").iterdir()
        trained.append((folder / "tokenizer.json").read_text())
    assert trained[0] == trained[1] == trained[2]
