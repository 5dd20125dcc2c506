"""``run.py export --transformers``: each task as the Transformers model a user of the ecosystem loads with one call.

A sequence-classification (and regression) task becomes ``AutoModelForSequenceClassification``, token
classification ``AutoModelForTokenClassification``, extractive QA ``AutoModelForQuestionAnswering``, each of the
backbone's own family (``XLMRobertaFor...``, ``BertFor...``) with ``id2label`` from the run's label names, and a
LoRA or Multi-LoRA task's adapter merged into its encoder's weights (W0 + s·B·A). mtft's heads are the shapes of
those classes' heads (:mod:`mtft.models.heads`): the pooled head (first token -> dense -> tanh -> projection) is
RoBERTa's ``classifier.dense`` / ``classifier.out_proj``, and BERT's ``pooler.dense`` + ``classifier``; the token
head is ``classifier``; the QA head is ``qa_outputs``. Every folder is checked before it is kept: the loaded model's
logits on a probe batch must equal the run's own, else the export stops with one line (a backbone family whose head
is another shape, DistilBERT's ``pre_classifier`` for one, is refused rather than exported wrong).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from mtft.core.errors import CheckpointError
from mtft.training.restore import LoadedRun

AUTO = {
    "sequence_classification": AutoModelForSequenceClassification,
    "regression": AutoModelForSequenceClassification,
    "token_classification": AutoModelForTokenClassification,
    "question_answering": AutoModelForQuestionAnswering,
    "multiple_choice": AutoModelForMultipleChoice,
}
ROBERTA_LIKE = {"xlm-roberta", "roberta", "camembert", "xlm-roberta-xl"}
BERT_LIKE = {"bert"}
PROBE = ["Der Hund schläft.", "The cat is awake, and it runs fast."]


def exportable(kind: str) -> bool:
    return kind in AUTO


def transformers_model(encoder: torch.nn.Module, head: torch.nn.Module, kind: str, label_names: list[str], task: str):
    """The task's ``AutoModelFor...`` of ``encoder``'s family holding ``encoder``'s weights and ``head``'s."""
    if kind not in AUTO:
        raise CheckpointError(
            f"task {task!r} has a {kind} head, which no Transformers AutoModelFor class holds; export it without "
            "--transformers (its head.safetensors and head.json beside the encoder)"
        )
    config = encoder.config.__class__.from_dict(encoder.config.to_dict())
    family = getattr(config, "model_type", "")
    if family not in ROBERTA_LIKE | BERT_LIKE:
        raise CheckpointError(
            f"task {task!r}: --transformers writes the heads of the RoBERTa and BERT families; the backbone is "
            f"{family!r}: export it without --transformers"
        )
    if kind == "regression":
        config.num_labels, config.problem_type = 1, "regression"
    elif kind not in ("question_answering", "multiple_choice"):
        config.num_labels = len(label_names)
        config.id2label = dict(enumerate(label_names))
        config.label2id = {name: i for i, name in enumerate(label_names)}
        if kind == "sequence_classification":
            config.problem_type = "single_label_classification"
    with torch.random.fork_rng(devices=[]):
        model = AUTO[kind].from_config(config)
    base = getattr(model, model.base_model_prefix)
    state = {k: v for k, v in encoder.state_dict().items() if not k.startswith("pooler.")}
    missing, unexpected = base.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("pooler.") for k in missing):
        raise CheckpointError(f"task {task!r}: the encoder's weights do not fit {type(model).__name__} ({missing[:3]})")
    with torch.no_grad():
        if kind in ("sequence_classification", "regression"):
            dense, projection = head.dense, head.out_proj
            if family in ROBERTA_LIKE:
                model.classifier.dense.load_state_dict(dense.state_dict())
                model.classifier.out_proj.load_state_dict(projection.state_dict())
            else:  # BERT: its pooler is the dense + tanh on [CLS], its classifier the projection
                base.pooler.dense.load_state_dict(dense.state_dict())
                model.classifier.load_state_dict(projection.state_dict())
        elif kind == "multiple_choice":  # both families: the pooler (dense + tanh on the first token), a scorer
            base.pooler.dense.load_state_dict(head.dense.state_dict())
            model.classifier.load_state_dict(head.out_proj.state_dict())
        elif kind == "token_classification":
            model.classifier.load_state_dict(head.classifier.state_dict())
        else:
            model.qa_outputs.load_state_dict(head.qa_outputs.state_dict())
    return model.eval()


def check_logits(model, run: LoadedRun, task: str, kind: str, slot_objective: Any = None) -> None:
    """The loaded model's logits on a probe batch equal the run's (unpadded positions), or one line."""
    tokenizer = run.tokenizer
    enc = tokenizer(PROBE, padding=True, return_tensors="pt")
    token_types = enc.get("token_type_ids")
    choices = kind == "multiple_choice"  # the probe's two sequences as two choices of one question
    with torch.no_grad():
        theirs = model(**({k: v[None] for k, v in enc.items()} if choices else enc))
        ours = run.model.predict_logits(
            task,
            enc["input_ids"],
            enc["attention_mask"],
            group_index=torch.zeros(len(PROBE), dtype=torch.long) if choices else None,
            objective=slot_objective,
            token_type_ids=token_types,
        )
    if kind == "question_answering":
        theirs = torch.stack([theirs.start_logits, theirs.end_logits], dim=-1)
        mask = enc["attention_mask"].bool()
        theirs, ours = theirs[mask], ours[mask]
    else:
        theirs = theirs.logits.reshape(ours.shape) if kind in ("regression", "multiple_choice") else theirs.logits
        if kind == "token_classification":
            mask = enc["attention_mask"].bool()
            theirs, ours = theirs[mask], ours[mask]
    gap = float((theirs - ours).abs().max())
    if not gap <= 1e-4 * max(1.0, float(ours.abs().max())):
        raise CheckpointError(f"task {task!r}: the Transformers model's logits differ from the run's by {gap:.2e}")


def save_transformers(model, run: LoadedRun, folder: Path) -> None:
    model.save_pretrained(str(folder))
    run.tokenizer.save_pretrained(str(folder))
