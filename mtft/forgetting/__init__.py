"""Forgetting monitors (SPEC §1 Theorem 1, §4): the masked-LM loss L_p on generic text, λ_p by Hessian-vector
products, bounds against measured forgetting, the Gaussian sensitivity probe, and masked-LM pre-training.

- :mod:`.corpus`        the generic-text corpus: fixed-mask evaluation sets, packed pre-training blocks
- :mod:`.mlm`           the fine-tuned encoder under the backbone's own MLM head; L_p per language
- :mod:`.hessian`       Hessian-vector products, power iteration / Lanczos, the second-order prediction
- :mod:`.displacement`  ||Δθ_k||² and ||θ − θ_p||² every step (full weights, or Multi-LoRA without a base copy)
- :mod:`.monitor`       the monitor a fine-tuning run drives (bounds, budget, regularisation, end-of-run probe)
- :mod:`.probe`         the Gaussian probe (also ``run.py probe``)
- :mod:`.pretrain`      ``run.stage: pretrain`` and the cached ``pretrain.before_finetune`` prelude
- :mod:`.plots`, :mod:`.report`   PNG figures and report sections
"""

from __future__ import annotations


def build_monitor(setup, config, engine, data, is_main: bool, run_dir):
    """The run's monitor: a :class:`~mtft.forgetting.monitor.ForgettingMonitor`, or one that does nothing."""
    from mtft.forgetting.monitor import ForgettingMonitor, NullMonitor

    if setup is None:
        return NullMonitor()
    return ForgettingMonitor(setup, config, engine, data, is_main, run_dir)
