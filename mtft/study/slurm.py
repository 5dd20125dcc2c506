"""The Slurm executor, through submitit: one job array, one job per run, the job objects of the local executor.

What a job asks for comes from the study file's ``executor.slurm``: partition, time, nodes, GPUs per job. A job of
G GPUs on N nodes is N × G Slurm tasks (``tasks_per_node = G``); each task runs the same :class:`RunJob`, which makes
it one rank of one DeepSpeed run (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` from submitit's
``TorchDistributedEnvironment``), so a multi-GPU, multi-node run is an ordinary job of the array. On preemption or at
the time limit submitit calls :meth:`RunJob.checkpoint` and requeues the job; the run resumes from its checkpoint.

Without Slurm (``executor.slurm.cluster: local``) submitit runs the same job objects as local processes: this is
how the tests exercise this path.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from mtft.core.errors import ConfigError
from mtft.study.jobs import RunJob
from mtft.study.spec import SlurmSection


def run_slurm(
    jobs: list[RunJob], slurm: SlurmSection, folder: Path, on_result: Callable[[dict[str, Any]], None]
) -> None:
    """Submit ``jobs`` as one array and wait for them; ``on_result`` sees each outcome."""
    import submitit

    check_slurm(slurm)
    executor = submitit.AutoExecutor(folder=str(folder), cluster=slurm.cluster)
    executor.update_parameters(**slurm_parameters(slurm, executor.cluster))
    distributed = _tasks_per_node(slurm) * slurm.nodes > 1
    for job in jobs:
        job.distributed_from_submitit = distributed
        # submitit's local executor starts every job at once: one thread each on a shared machine
        job.threads = 1 if executor.cluster == "local" else slurm.cpus_per_task
    submitted = executor.submit_array(jobs) if executor.cluster != "local" else [executor.submit(j) for j in jobs]
    for job, handle in zip(jobs, submitted):
        try:
            outcome = handle.results()[0]  # one result per task; the first task is rank 0
        except Exception as error:  # the job died outside the run (node failure, cancelled): keep going
            outcome = {"key": job.key, "status": "failed", "returncode": None, "error": _first_line(error)}
        on_result(outcome)


def slurm_parameters(slurm: SlurmSection, cluster: str) -> dict[str, Any]:
    """What a job asks for, as submitit's ``update_parameters`` of an AutoExecutor on ``cluster``. On Slurm,
    submitit writes each value as one shell-quoted ``#SBATCH --key=value`` line (a comment to bash; sbatch reads
    it as one argument), so a value reaches no shell: the study file refuses only what that quoting cannot carry
    (:func:`mtft.study.spec._sbatch_value_problem`). ``setup`` lines are shell lines by design."""
    parameters: dict[str, Any] = {
        "timeout_min": slurm.time_min,
        "nodes": slurm.nodes,
        "tasks_per_node": _tasks_per_node(slurm),
        "cpus_per_task": slurm.cpus_per_task,
        "gpus_per_node": slurm.gpus_per_job,
        "slurm_array_parallelism": slurm.array_parallelism,
        "name": "mtft-study",
    }
    if slurm.partition:
        parameters["slurm_partition"] = slurm.partition
    if slurm.mem_gb:
        parameters["mem_gb"] = slurm.mem_gb
    if slurm.additional:
        parameters["slurm_additional_parameters"] = dict(slurm.additional)
    if slurm.setup:
        parameters["slurm_setup"] = list(slurm.setup)
    if cluster == "local":  # submitit's local executor knows only the generic keys
        parameters = {k: v for k, v in parameters.items() if not k.startswith("slurm_") and k not in ("mem_gb",)}
        for key in ("cpus_per_task", "name", "nodes"):
            parameters.pop(key)
    return parameters


def check_slurm(slurm: SlurmSection) -> None:
    """Before the study writes anything: Slurm must be there unless the study asks for submitit's local cluster
    (without it, submitit would silently run every job on this machine)."""
    if slurm.cluster in (None, "slurm"):
        missing = [name for name in ("sbatch", "srun") if shutil.which(name) is None]
        if missing:
            raise ConfigError(
                f"executor.name=slurm: Slurm is not available here ({' and '.join(missing)} not on PATH); run the "
                "study where Slurm is, or use executor.name=local"
            )
    elif slurm.gpus_per_job:
        raise ConfigError(f"executor.slurm.cluster={slurm.cluster} runs on this machine: set gpus_per_job: 0")


def _tasks_per_node(slurm: SlurmSection) -> int:
    """One process (DeepSpeed rank) per GPU, or ``processes_per_node``, or 1 without GPUs."""
    return slurm.processes_per_node or max(1, slurm.gpus_per_job)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[-1] if text else type(error).__name__)[:300]
