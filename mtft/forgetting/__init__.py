"""Forgetting monitors (Mao et al., 2022, Theorem 1; Springer et al., 2025): the masked-LM loss L_p on generic
text, λ_p by Hessian-vector products, bounds against measured forgetting, the Gaussian sensitivity probe.

- :mod:`.corpus`        the generic-text corpus: fixed-mask evaluation sets, packed pre-training blocks
- :mod:`.mlm`           the fine-tuned encoder under the backbone's own MLM head; L_p per language
- :mod:`.hessian`       Hessian-vector products, power iteration / Lanczos, the second-order prediction
- :mod:`.monitor`       the monitor a fine-tuning run drives (bounds, budget, regularisation, end-of-run probe);
                        ||Δθ_k||² and ||θ − θ_p||² come from the adapter method's displacement tracker
- :mod:`.probe`         the Gaussian probe (also ``run.py probe``)
- :mod:`.linear_theory` the two-layer linear network of Springer et al. (2025, Section 4): incremental learning of
                        singular values and progressive sensitivity under the probe's perturbation
- :mod:`.plots`, :mod:`.report`   PNG figures and report sections
"""

from __future__ import annotations


def build_monitor(setup, engine, data, is_main: bool, run_dir):
    """The run's monitor: a :class:`~mtft.forgetting.monitor.ForgettingMonitor` of ``setup`` (what
    :func:`~mtft.forgetting.monitor.prepare_forgetting` prepared), or one that does nothing."""
    from mtft.forgetting.monitor import ForgettingMonitor, NullMonitor

    if setup is None:
        return NullMonitor()
    return ForgettingMonitor(setup, engine, data, is_main, run_dir)
