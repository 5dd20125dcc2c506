"""mtft: multilingual multi-task fine-tuning that learns every language without forgetting.

The package mirrors the pipeline of a run:

- :mod:`mtft.config`     typed run configuration (YAML + command-line overrides)
- :mod:`mtft.tasks`      task definitions: declarative files or Python classes, discovered from folders
- :mod:`mtft.data`       loading (Hub or local files), tokenisation, multi-objective sampling, batching
- :mod:`mtft.models`     backbone, tokenizer, per-task heads, the multi-task model
- :mod:`mtft.training`   the DeepSpeed loop, the pluggable loss weighting, checkpoints
- :mod:`mtft.evaluation` metrics and evaluation per objective
- :mod:`mtft.reporting`  JSONL/TensorBoard logs and the Markdown report
"""

__version__ = "0.1.0"
