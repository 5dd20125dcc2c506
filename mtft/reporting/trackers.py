"""Where a run's metrics go besides ``metrics.jsonl`` (``logging.report_to``): TensorBoard, Weights & Biases, MLflow,
each through the library itself, as HF Trainer's ``report_to`` sends them.

Every row of ``metrics.jsonl`` -- per-objective losses, the weights and the solver's certificates, the forgetting
monitors' measurements, evaluations -- reaches every tracker as ``<kind>/<key>`` scalars at its step, from rank 0
only. The libraries are optional extras (``pip install tensorboard``, ``wandb``, ``mlflow-skinny``); one that is
named but not installed is one line before the run starts. Each library is configured as its users expect, by its
own environment: W&B reads ``WANDB_PROJECT`` (default ``mtft``), ``WANDB_MODE`` (``offline`` writes
``<run>/wandb/``, to ``wandb sync`` later) and its login; MLflow reads ``MLFLOW_TRACKING_URI`` (default: a file
store in ``<run>/mlruns``) and ``MLFLOW_EXPERIMENT_NAME`` (default ``mtft``). A resumed run continues the same W&B and
MLflow run: their ids are kept in ``<run>/trackers.json``.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Optional, Protocol

from mtft.core.atomic import write_json
from mtft.core.errors import ConfigError

TRACKERS = ("tensorboard", "wandb", "mlflow")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
IDS = "trackers.json"  # a run's W&B and MLflow run ids, so that a resume continues them


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def check_trackers(names: list[str]) -> None:
    """One line, before anything starts, for a tracker whose library is not installed."""
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:  # the module each library installs: tensorboard, wandb, mlflow
            raise ConfigError(
                f"logging.report_to: {name} needs the {PACKAGES[name]} package: pip install {PACKAGES[name]}"
            )


class TensorBoard:
    def __init__(self, run_dir: Path, resume_step: Optional[int]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, run_dir: Path, name: str, params: dict[str, Any], ids: dict[str, str]):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")  # its console banner is not the run's; the log says where
        ids.setdefault("wandb", secrets.token_hex(4))  # W&B's own ids are 8 characters of [0-9a-z]
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "mtft"),
            name=name,
            id=ids["wandb"],
            resume="allow",
            dir=str(run_dir),
            config=params,
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MLflow:
    def __init__(self, run_dir: Path, name: str, params: dict[str, Any], ids: dict[str, str]):
        if "MLFLOW_TRACKING_URI" not in os.environ:  # the run's own file store (MLflow's maintenance-mode backend)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir / "mlruns").resolve().as_uri()
        else:
            uri = os.environ["MLFLOW_TRACKING_URI"]
        import mlflow

        self.client = mlflow.MlflowClient(tracking_uri=uri)
        if "mlflow" not in ids:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "mtft")
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(experiment_id, run_name=name)
            ids["mlflow"] = run.info.run_id
            for key, value in list(params.items())[:100]:  # a run's flattened config; MLflow caps params at 500 chars
                self.client.log_param(ids["mlflow"], key, str(value)[:500])
        self.run_id = ids["mlflow"]

    def log(self, step: int, values: dict[str, float]) -> None:

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(self.name(k), v, now, step) for k, v in values.items()])

    @staticmethod
    def name(key: str) -> str:
        """``train/loss/xnli/en`` as ``train/loss.xnli.en``: MLflow's file store keeps a metric as a file named by its
        key's path, where ``train/loss`` (a file) could not also be the folder of ``train/loss/xnli/en``."""
        kind, _, rest = key.partition("/")
        return f"{kind}/{rest.replace('/', '.')}"

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def build_trackers(
    names: list[str], run_dir: Path, name: str, params: dict[str, Any], resume_step: Optional[int]
) -> list[Tracker]:
    check_trackers(names)
    path = run_dir / IDS
    ids: dict[str, str] = json.loads(path.read_text()) if path.is_file() else {}
    trackers: list[Tracker] = []
    for tracker in names:
        if tracker == "tensorboard":
            trackers.append(TensorBoard(run_dir, resume_step))
        elif tracker == "wandb":
            trackers.append(WandB(run_dir, name, params, ids))
        else:
            trackers.append(MLflow(run_dir, name, params, ids))
    if ids:
        write_json(path, ids)
    return trackers


def flat(values: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys (the params a tracker shows)."""
    if not isinstance(values, dict):
        return {prefix: values}
    out: dict[str, Any] = {}
    for key, value in values.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
