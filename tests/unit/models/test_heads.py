"""The generalised head interface: label collation, mixed batches of different heads, exact (sum, count)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mtft.data.batching import BatchBuilder
from mtft.models.heads import IGNORE_INDEX, SequenceClassificationHead
from mtft.models.multitask import MultiTaskModel
from mtft.models.qa_head import QuestionAnsweringHead
from mtft.models.token_head import TokenClassificationHead
from mtft.tasks.kinds import build_head
from tests.helpers.models import tiny_model


def builder_for(kinds: list[str], pad_id: int = 1) -> BatchBuilder:
    tasks = {
        f"t{k}": SimpleNamespace(task=SimpleNamespace(head=kind, evaluate_with=None)) for k, kind in enumerate(kinds)
    }
    data = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=pad_id), tasks=tasks)
    return BatchBuilder(data)


def test_collate_mixes_heads_in_one_label_matrix_and_expands_multi_sequence_rows():
    builder = builder_for(
        ["sequence_classification", "token_classification", "question_answering", "sequence_classification"]
    )
    rows = [
        {"input_ids": [0, 5, 2], "labels": 2},
        {"input_ids": [0, 5, 6, 7, 2], "labels": [-100, 3, -100, 1, -100]},
        {"input_ids": [0, 8, 2, 9, 9, 2], "labels": [3, 4]},
        {"input_ids": [[0, 5, 2], [0, 6, 6, 2]], "labels": 1},  # a row holding two sequences
    ]
    batch = builder.collate(rows, heads=[0, 1, 2, 3], objectives=[0, 1, 2, 3])
    assert batch["input_ids"].shape == (5, 6) and batch["labels"].dtype == torch.float64
    assert batch["head_index"].tolist() == [0, 1, 2, 3, 3]
    assert batch["objective_index"].tolist() == [0, 1, 2, 3, 3]
    assert batch["group_index"].tolist() == [0, 1, 2, 3, 3]
    assert batch["attention_mask"].sum(1).tolist() == [3, 5, 6, 3, 4]
    assert batch["input_ids"][0].tolist() == [0, 5, 2, 1, 1, 1]
    labels = batch["labels"]
    assert labels[0].tolist() == [2] + [IGNORE_INDEX] * 4
    assert labels[1].tolist() == [-100, 3, -100, 1, -100]
    assert labels[2, :2].tolist() == [3, 4] and labels[3, 0] == labels[4, 0] == 1


def test_regression_targets_stay_exact_in_the_label_matrix():
    block = SequenceClassificationHead.collate_labels([3.8, 0.123456789012])
    assert block[:, 0].tolist() == [3.8, 0.123456789012]


def test_token_head_sums_labelled_tokens_and_counts_them():
    torch.manual_seed(0)
    head = TokenClassificationHead(8, ["O", "B-PER", "I-PER"], 0.0)
    hidden = torch.randn(2, 5, 8)
    labels = torch.tensor([[-100, 1, -100, 2, -100], [-100, 0, -100, -100, -100]], dtype=torch.float64)
    out = head(hidden, labels)
    logits = head.logits(hidden)

    def ce(r, t, y):
        return torch.nn.functional.cross_entropy(logits[r, t][None], torch.tensor([y]))

    torch.testing.assert_close(out.loss_sum, torch.stack([ce(0, 1, 1) + ce(0, 3, 2), ce(1, 1, 0)]))
    assert out.loss_count.tolist() == [2.0, 1.0]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    decoded = head.decode(logits, attention_mask=mask)
    assert [len(d) for d in decoded] == [5, 3] and set(decoded[0]) <= {"O", "B-PER", "I-PER"}


def test_qa_head_masks_padding_and_averages_start_end():
    torch.manual_seed(0)
    head = QuestionAnsweringHead(8, [], 0.0)
    hidden = torch.randn(2, 6, 8)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    out = head(hidden, torch.tensor([[2, 3], [0, 0]], dtype=torch.float64), attention_mask=mask)
    scores = head.qa_outputs(hidden)
    row1_start = torch.nn.functional.cross_entropy(scores[1, :4, 0][None], torch.tensor([0]))
    row1_end = torch.nn.functional.cross_entropy(scores[1, :4, 1][None], torch.tensor([0]))
    torch.testing.assert_close(out.loss_sum[1], (row1_start + row1_end) / 2)
    assert out.loss_count.tolist() == [1.0, 1.0]
    starts, ends = head.decode(out.logits, attention_mask=mask)[1]
    assert len(starts) == len(ends) == 4


def test_mixed_heads_share_one_encoder_forward_with_exact_per_objective_sums(tmp_path):
    model, tok = tiny_model(tmp_path, num_objectives=3)
    heads = {
        "cls": model.heads["a"],
        "ner": build_head("token_classification", 64, ["O", "B", "I"], 0.0),
        "qa": build_head("question_answering", 64, [], 0.0),
    }
    model = MultiTaskModel(model.encoder, heads, num_objectives=3).eval()
    calls = []
    model.encoder.register_forward_hook(lambda *_: calls.append(1))
    builder = builder_for(
        ["sequence_classification", "token_classification", "question_answering"], pad_id=tok.pad_token_id
    )
    texts = ["alpha", "beta gamma", "zeta eta"]
    ids = [tok(t)["input_ids"] for t in texts]
    rows = [
        {"input_ids": ids[0], "labels": 1},
        {"input_ids": ids[1], "labels": [-100] + [1] * (len(ids[1]) - 2) + [-100]},
        {"input_ids": ids[2], "labels": [1, 2]},
    ]
    batch = builder.collate(rows, heads=[0, 1, 2], objectives=[0, 1, 2])
    sums, counts = model(**batch)
    assert len(calls) == 1
    assert counts.tolist() == [1.0, float(len(ids[1]) - 2), 1.0]
    for k in range(3):  # each row alone (cls, ner, qa) gives the same sum
        alone = builder.collate([rows[k]], heads=[k], objectives=[k])
        alone_sums, _ = model(**alone)
        torch.testing.assert_close(sums[k], alone_sums[k], rtol=1e-4, atol=1e-5)
