"""forgetting.hessian_examples / prediction_examples take each language's first N held-out texts: fewer than the
first one holding a masked token is refused in one line naming the setting and the minimum (the loss of that
language would be 0/0, a ZeroDivisionError in LpObjective)."""

from __future__ import annotations

import pytest

from mtft.config.load import load_config
from mtft.core.errors import ConfigError
from mtft.core.labels import IGNORE_INDEX
from mtft.forgetting.corpus import MaskedExample, MlmEvalSet
from mtft.forgetting.monitor import check_fixed_batches
from tests.helpers.launch import REPO
from tests.helpers.runs import BASE_CONFIG

X = IGNORE_INDEX
# per language, each text's labels (X: not masked)
EVAL_SET = {"en": [[X, 5, X]], "de": [[X, X], [X, X, X], [X, 7], [4]]}


def eval_set() -> MlmEvalSet:
    examples = {lang: [MaskedExample([1] * len(labels), labels) for labels in rows] for lang, rows in EVAL_SET.items()}
    return MlmEvalSet(examples, 0)


def test_fewest_masked_per_language():
    assert {lang: eval_set().fewest_masked(lang) for lang in EVAL_SET} == {"en": 1, "de": 3}


@pytest.mark.parametrize(
    "overrides, expect",
    [
        (
            ["forgetting.prediction_examples=2"],
            "forgetting.prediction_examples=2: the first 2 held-out text(s) of "
            "corpus language 'de' hold no masked token (corpus.mlm_probability=0.15); set "
            "forgetting.prediction_examples to at least 3",
        ),
        (["forgetting.hessian_examples=1"], "forgetting.hessian_examples to at least 3"),
        (["forgetting.hessian_examples=3", "forgetting.prediction_examples=3"], None),
        ([], None),  # the defaults, 64 and 16
    ],
)
def test_too_few_texts_for_a_masked_token_are_refused(overrides, expect):
    config = load_config(REPO / BASE_CONFIG, ["forgetting.enabled=true", *overrides])
    if expect is None:
        check_fixed_batches(config.forgetting, config.corpus, eval_set())
        return
    with pytest.raises(ConfigError) as caught:
        check_fixed_batches(config.forgetting, config.corpus, eval_set())
    assert str(caught.value) == expect or expect in str(caught.value)
