"""``run.py probe`` on a fine-tuning checkpoint: rebuilt by the one restore path, and probed once per adapter the
method routes to -- per loss objective for a Multi-LoRA run with ``granularity: objective``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForMaskedLM, XLMRobertaConfig

from mtft.adapters.multi_lora import inject_multi_lora, multi_lora_layers
from mtft.adapters.options import MultiLoraOptions
from mtft.commands.probe import ProbeInputError, build_parser, main
from mtft.config import load_config
from mtft.forgetting.corpus import build_eval_set
from mtft.forgetting.mlm import attach_head, lp_per_language
from mtft.models.heads import SequenceClassificationHead
from mtft.models.multitask import MultiTaskModel
from mtft.models.tokenizer import tiny_tokenizer
from mtft.training.restore import save_encoder_files

OBJECTIVES = ["xnli/en", "xnli/de"]
LABELS = ["entailment", "neutral", "contradiction"]


def objective_run(tmp_path):
    """A Multi-LoRA run with one B per objective on a local masked-LM backbone, as its files lie on disk: the
    checkpoint's weights, the plain encoder, and the run's config."""
    tok = tiny_tokenizer(
        ["alpha beta gamma delta", "epsilon zeta eta theta", "the cat sleeps", "der Hund"] * 5, 80, tmp_path / "tok"
    )
    backbone = tmp_path / "backbone"
    cfg = XLMRobertaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=34,
        type_vocab_size=1,
        pad_token_id=tok.pad_token_id,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(cfg).save_pretrained(str(backbone))
    tok.save_pretrained(str(backbone))
    run_dir = tmp_path / "run"
    (run_dir / "config.yaml").parent.mkdir()
    (run_dir / "config.yaml").write_text(
        json.dumps(
            {
                "run": {"output_dir": str(run_dir)},
                "model": {
                    "backbone": str(backbone),
                    "adapter": {
                        "method": "multi_lora",
                        "granularity": "objective",
                        "r": 4,
                        "target_modules": ["query", "value"],
                    },
                },
                "data": {"tasks": [{"name": "xnli", "languages": ["en", "de"]}], "max_length": 32},
                "weighting": {"method": "mean"},
                "corpus": {"languages": ["en", "de"]},
            }
        )
    )
    encoder = AutoModel.from_pretrained(str(backbone))
    encoder.pooler = None
    plain = copy.deepcopy(encoder)
    save_encoder_files(run_dir, encoder, tok)
    inject_multi_lora(
        encoder, MultiLoraOptions(r=4, target_modules=["query", "value"]), len(OBJECTIVES), seed=0, route_by="objective"
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in multi_lora_layers(encoder):
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=generator))
            layer.lora_B.weight[1] *= 5.0  # objective xnli/de's adapter moved much further
    model = MultiTaskModel(encoder, {"xnli": SequenceClassificationHead(16, LABELS, 0.0)}, len(OBJECTIVES))
    checkpoint = run_dir / "checkpoints" / "step-00000002"
    checkpoint.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(checkpoint / "model.safetensors"))
    (checkpoint / "heads.json").write_text(
        json.dumps({"xnli": {"kind": "sequence_classification", "label_names": LABELS}})
    )
    (checkpoint / "trainer_state.json").write_text(json.dumps({"objectives": OBJECTIVES}))
    (checkpoint / "COMPLETE").write_text("{}\n")
    return checkpoint, encoder, plain, tok


def merged(encoder, plain, slot):
    """``plain`` with objective slot's adapter merged into its weights: W0 + s·B_slot·A, no routing involved."""
    out = copy.deepcopy(plain)
    with torch.no_grad():
        for name, module in encoder.named_modules():
            if hasattr(module, "lora_B"):
                out.get_submodule(name).weight += module.scaling * module.lora_B.weight[slot] @ module.lora_A
    return out


def test_probe_of_an_objective_granularity_checkpoint_goes_through_each_objectives_adapter(tmp_path):
    checkpoint, encoder, plain, tok = objective_run(tmp_path)
    args = build_parser().parse_args(
        ["--checkpoint", str(checkpoint), "--gamma", "0.1", "--max-examples", "8", "--out", str(tmp_path / "probe")]
    )
    assert main(args) == 0
    results = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert [r["model"] for r in results] == [f"step-00000002/{name}" for name in OBJECTIVES]
    config = load_config(checkpoint.parent.parent / "config.yaml", ["corpus.max_eval_examples=8"])
    eval_set = build_eval_set(config.corpus, config.data, tok, ["en", "de"], 32)
    head_source = AutoModelForMaskedLM.from_pretrained(config.model.backbone)
    for slot, result in enumerate(results):
        expected = lp_per_language(attach_head(merged(encoder, plain, slot), head_source), eval_set, 64, "cpu")
        assert result["baseline"] == pytest.approx(expected, rel=1e-5)
    assert results[0]["baseline"]["en"] != pytest.approx(results[1]["baseline"]["en"], rel=1e-3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gamma", "0.1,nan"], "--gamma '0.1,nan': every γ must be a number > 0, and finite"),
        (["--gamma", "inf"], "--gamma 'inf': every γ must be a number > 0, and finite"),
        (["--gamma", "0.1", "--batch-size", "0"], "--batch-size 0: must be at least 1"),
        (["--gamma", "0.1", "--max-examples", "0"], "--max-examples 0: must be at least 1"),
        (["--gamma", "0.1", "--max-length", "-5"], "--max-length -5: must be at least 8"),
        (["--gamma", "0.1", "--mask-seed", "-1"], "--mask-seed -1: must be at least 0"),
        (["--gamma", "0.1", "--out", "{tmp}/taken"], "--out {tmp}/taken: {tmp}/taken is a file, not a folder"),
        (["--gamma", "0.1", "--out", "{tmp}/taken/probe"], "{tmp}/taken is a file, not a folder"),
    ],
)
def test_bad_arguments_are_refused_before_any_checkpoint_is_read(tmp_path, args, message):
    """Each is refused in one line before a model is loaded: the checkpoint, an empty folder, would be refused
    next (CheckpointError) -- after the whole probe, for a bad γ or --out, before the fix."""
    (tmp_path / "taken").write_text("mine\n")
    (tmp_path / "ckpt").mkdir()
    argv = ["--checkpoint", str(tmp_path / "ckpt")] + [a.replace("{tmp}", str(tmp_path)) for a in args]
    with pytest.raises(ProbeInputError) as refused:
        main(build_parser().parse_args(argv))
    assert message.replace("{tmp}", str(tmp_path)) in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "taken"]
    assert (tmp_path / "taken").read_text() == "mine\n" and not any((tmp_path / "ckpt").iterdir())
