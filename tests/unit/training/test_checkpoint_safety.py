"""What resume trusts in a checkpoint: the marker's file manifest, a loader that never unpickles code, and a full
disk that leaves nothing looking complete (mtft.training.checkpoint)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from mtft.core.atomic import STAMP, AtomicFolder, is_complete, marker
from mtft.core.errors import CheckpointError, DiskFullError
from mtft.training import checkpoint as ckpt


class _Planted:
    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (self.target, "pwned"))


class _Inner:
    """Stands in for DeepSpeed's checkpoint engine: everything but ``load`` is delegated to it."""

    name = "inner"

    def load(self, path, map_location=None):  # pragma: no cover - must never be reached
        raise AssertionError("the unsafe loader was used")


def test_planted_pickle_is_refused_without_running(tmp_path):
    target = tmp_path / "PWNED"
    file = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": _Planted(target)}, file)
    loader = ckpt.WeightsOnlyLoads(_Inner())
    with pytest.raises(CheckpointError, match="mp_rank_00_model_states.pt cannot be loaded safely"):
        loader.load(str(file), map_location="cpu")
    assert not target.exists() and loader.name == "inner"


def test_engine_state_of_zero_0_to_2_loads(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    state = {
        "optimizer_state_dict": {
            "zero_stage": ZeroStageEnum.gradients,
            "loss_scaler": LossScaler(1.0),
            "address": fragment_address(numel=3, start=0),
            "step": torch.ones(2),
        },
        "lr": [0.1],
        "name": "x",
    }
    file = tmp_path / "optim_states.pt"
    torch.save(state, file)
    loaded = ckpt.WeightsOnlyLoads(_Inner()).load(str(file), map_location="cpu")
    assert loaded["optimizer_state_dict"]["zero_stage"] is ZeroStageEnum.gradients
    assert torch.equal(loaded["optimizer_state_dict"]["step"], torch.ones(2)) and loaded["lr"] == [0.1]


def _checkpoint(tmp_path: Path, step: int = 4) -> Path:
    folder = AtomicFolder(ckpt.step_dir(tmp_path, step))
    partial = folder.begin()
    (partial / "engine").mkdir()
    (partial / "engine/state.pt").write_bytes(b"0123456789")
    (partial / "trainer_state.json").write_text(json.dumps({"step": step}))
    (partial / "model.safetensors").write_bytes(b"weights")
    return folder.commit(kind="checkpoint", step=step, files=ckpt.file_manifest(partial))


def test_manifest_records_size_and_hash_of_every_file(tmp_path):
    path = _checkpoint(tmp_path)
    files = marker(path)["files"]
    # the partial folder's stamp was there when the manifest was taken; it is neither listed nor kept
    assert sorted(files) == ["engine/state.pt", "model.safetensors", "trainer_state.json"]
    assert not (path / STAMP).exists()
    assert files["engine/state.pt"]["size"] == 10 and len(files["engine/state.pt"]["sha256"]) == 64
    assert ckpt.damage(path) is None


@pytest.mark.parametrize(
    "spoil, reason",
    [
        (lambda p: (p / "engine/state.pt").unlink(), "engine/state.pt is missing"),
        (lambda p: (p / "engine/state.pt").write_bytes(b"0123"), "engine/state.pt has 4 bytes, 10 were written"),
        (lambda p: (p / "model.safetensors").write_bytes(b"WEIGHTS"), "model.safetensors differs from what was"),
    ],
)
def test_damage_is_recognised_before_loading(tmp_path, spoil, reason):
    path = _checkpoint(tmp_path)
    spoil(path)
    assert reason in ckpt.damage(path)


def test_resume_falls_back_and_fails_in_one_line_when_nothing_is_left(tmp_path, monkeypatch):
    older, newer = _checkpoint(tmp_path, 2), _checkpoint(tmp_path, 4)
    assert ckpt.complete_checkpoints(tmp_path) == [newer, older]
    (newer / "model.safetensors").unlink()
    loaded = []
    monkeypatch.setattr(ckpt, "load_checkpoint", lambda engine, path, rank: loaded.append(path) or {"step": 2})
    warnings = []
    assert ckpt.resume_checkpoint(None, tmp_path, 0, warn=warnings.append) == (older, {"step": 2})
    assert loaded == [older]
    assert warnings == [f"checkpoint {newer} is damaged (model.safetensors is missing); falling back to step-00000002"]
    (older / "trainer_state.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no intact checkpoint .*step-00000004: model.safetensors is missing; "):
        ckpt.resume_checkpoint(None, tmp_path, 0, warn=warnings.append)


class _FullDiskEngine:
    def save_checkpoint(self, folder, tag, save_latest):
        Path(folder, tag).mkdir()
        Path(folder, tag, "state.pt").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_while_saving_leaves_nothing_complete(tmp_path):
    with pytest.raises(DiskFullError, match=r"^no space left on .*step-00000002; nothing of it was kept"):
        ckpt.save_checkpoint(_FullDiskEngine(), tmp_path, 2, {"step": 2}, {}, rank=0, keep_last=2)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_disk_full_while_writing_the_weights(tmp_path, monkeypatch):
    class Engine(_FullDiskEngine):
        module = torch.nn.Linear(2, 2)

        def save_checkpoint(self, folder, tag, save_latest):
            Path(folder, tag).mkdir()

        def zero_optimization_stage(self):
            return 0

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "write_weights", full)
    with pytest.raises(DiskFullError):
        ckpt.save_checkpoint(Engine(), tmp_path, 2, {"step": 2}, {}, rank=0, keep_last=2)
    assert list((tmp_path / "checkpoints").iterdir()) == [] and not is_complete(ckpt.step_dir(tmp_path, 2))
