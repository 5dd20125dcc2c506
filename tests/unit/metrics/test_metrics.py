"""Offline metrics: parity with seqeval / scikit-learn / scipy and hand-checked official-rule cases."""

from __future__ import annotations

import math

import pytest
import seqeval.metrics as sm
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import pearsonr, spearmanr
from seqeval.scheme import IOB2
from sklearn.metrics import f1_score, matthews_corrcoef

from mtft.metrics import common as M
from mtft.metrics.seqeval_metrics import entity_f1
from mtft.metrics.squad import exact_match, normalize_answer, squad_scores
from mtft.metrics.squad import f1 as squad_f1
from mtft.metrics.superglue import cb_scores, multirc_scores, record_scores

approx = pytest.approx

# ----- simple metrics --------------------------------------------------------------------------------------------


def test_registry_and_compute_keep_accuracy_api():
    assert set(M.METRICS) >= {"accuracy", "macro_f1", "mcc", "pearson", "spearman"}
    value = M.compute("accuracy", ["a", "b", "a"], ["a", "a", "a"])
    assert isinstance(value, float) and value == approx(2 / 3)
    with pytest.raises(ValueError):
        M.compute("accuracy", ["a"], ["a", "b"])
    with pytest.raises(KeyError):
        M.compute("bleu", ["a"], ["a"])


def test_binary_f1_needs_a_positive_label_and_matches_sklearn():
    refs = ["equivalent", "not_equivalent", "equivalent", "equivalent", "not_equivalent"]
    preds = ["equivalent", "equivalent", "not_equivalent", "equivalent", "not_equivalent"]
    with pytest.raises(ValueError):
        M.f1(preds, refs)
    expected = f1_score(refs, preds, pos_label="equivalent")
    assert M.f1(preds, refs, positive="equivalent") == approx(expected) == approx(2 / 3)
    # label_names in ClassLabel order: the positive class is at index 1 (GLUE MRPC/QQP).
    assert M.f1(preds, refs, label_names=["not_equivalent", "equivalent"]) == approx(expected)
    # "not_equivalent" sorts after "equivalent": a sorted-order default would score the wrong class.
    assert M.f1(preds, refs, positive="not_equivalent") == approx(f1_score(refs, preds, pos_label="not_equivalent"))
    assert M.f1(["no", "no"], ["no", "no"], positive="yes") == 0.0


def test_macro_f1_and_mcc_match_sklearn():
    refs = ["entailment", "entailment", "contradiction", "neutral", "neutral", "neutral"]
    preds = ["entailment", "contradiction", "contradiction", "neutral", "entailment", "neutral"]
    assert M.macro_f1(preds, refs) == approx(f1_score(refs, preds, average="macro"))
    assert M.macro_f1(preds, refs) == approx((0.5 + 2 / 3 + 0.8) / 3)
    assert M.mcc(preds, refs) == approx(matthews_corrcoef(refs, preds))
    assert M.compute("mcc", ["acceptable"] * 3, ["acceptable", "unacceptable", "acceptable"]) == 0.0


def test_correlations_match_scipy_and_accept_numeric_strings():
    preds = [0.1, 2.5, 3.0, 4.9, 1.2, 3.3]
    refs = [0.0, 2.0, 3.8, 5.0, 1.0, 2.5]
    assert M.pearson(preds, refs) == approx(pearsonr(preds, refs)[0])
    assert M.spearman(preds, refs) == approx(spearmanr(preds, refs)[0])
    assert M.compute("pearson", [str(p) for p in preds], [str(r) for r in refs]) == approx(pearsonr(preds, refs)[0])
    assert M.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0  # constant input: 0, not NaN
    assert M.spearman([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0


labels = st.sampled_from(["a", "b", "c"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(labels, labels), min_size=1, max_size=30))
def test_classification_metrics_parity_property(pairs):
    preds, refs = [p for p, _ in pairs], [r for _, r in pairs]
    assert M.accuracy(preds, refs) == approx(sum(p == r for p, r in pairs) / len(pairs))
    assert M.macro_f1(preds, refs) == approx(f1_score(refs, preds, average="macro", zero_division=0))
    assert M.mcc(preds, refs) == approx(matthews_corrcoef(refs, preds))
    assert -1.0 <= M.mcc(preds, refs) <= 1.0
    assert 0.0 <= M.f1(preds, refs, positive="a") <= 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5)), min_size=3, max_size=30), st.randoms())
def test_correlation_range_and_permutation_invariance(pairs, rnd):
    preds, refs = [p for p, _ in pairs], [r for _, r in pairs]
    value = M.spearman(preds, refs)
    assert -1.0 - 1e-9 <= value <= 1.0 + 1e-9 and not math.isnan(value)
    shuffled = pairs[:]
    rnd.shuffle(shuffled)
    assert M.spearman([p for p, _ in shuffled], [r for _, r in shuffled]) == approx(value, abs=1e-9)
    pv = M.pearson(preds, refs)
    assert not math.isnan(pv) and -1.0 - 1e-9 <= pv <= 1.0 + 1e-9


# ----- seqeval ---------------------------------------------------------------------------------------------------

GOLD = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
# sentence 0: PER boundary error (only "B-PER"), LOC predicted as ORG (type error); sentence 1 correct.
PRED = [["B-PER", "O", "O", "B-ORG"], ["B-ORG", "O"]]


def test_entity_f1_hand_computed_boundary_and_type_errors():
    # 3 gold entities, 3 predicted, 1 exact match -> P = R = F1 = 1/3.
    scores = entity_f1(PRED, GOLD)
    assert scores == approx({"precision": 1 / 3, "recall": 1 / 3, "f1": 1 / 3})
    assert scores["f1"] == approx(sm.f1_score(GOLD, PRED))
    assert scores["precision"] == approx(sm.precision_score(GOLD, PRED))
    assert scores["recall"] == approx(sm.recall_score(GOLD, PRED))


def test_entity_f1_strict_differs_on_an_i_tag_starting_an_entity():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    pred = [["I-PER", "I-PER", "O", "B-LOC"]]
    default = entity_f1(pred, gold)
    strict = entity_f1(pred, gold, mode="strict")
    assert default["f1"] == approx(1.0)  # default mode: I-PER opens PER(0, 1), which matches
    assert strict == approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3})  # strict: only LOC is an entity
    assert strict["f1"] == approx(sm.f1_score(gold, pred, mode="strict", scheme=IOB2))
    with pytest.raises(ValueError):
        entity_f1(pred, gold, mode="lenient")  # type: ignore[arg-type]


def test_entity_f1_validates_lengths_naming_the_sentence():
    with pytest.raises(ValueError, match="sentence 1"):
        entity_f1([["O"], ["B-PER"]], [["O"], ["B-PER", "O"]])
    with pytest.raises(ValueError):
        entity_f1([["O"]], [["O"], ["O"]])
    assert entity_f1([["O", "O"]], [["O", "O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


tags = st.sampled_from(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])


@st.composite
def tagged_sentences(draw):
    n = draw(st.integers(1, 6))
    gold, pred = [], []
    for _ in range(n):
        length = draw(st.integers(1, 8))
        gold.append(draw(st.lists(tags, min_size=length, max_size=length)))
        pred.append(draw(st.lists(tags, min_size=length, max_size=length)))
    return pred, gold


@settings(max_examples=60, deadline=None)
@given(tagged_sentences(), st.randoms())
def test_entity_f1_parity_range_and_sentence_permutation(data, rnd):
    pred, gold = data
    for mode, options in (("default", {}), ("strict", {"mode": "strict", "scheme": IOB2})):
        scores = entity_f1(pred, gold, mode=mode)
        assert scores["f1"] == approx(sm.f1_score(gold, pred, zero_division=0, **options))
        assert all(0.0 <= v <= 1.0 for v in scores.values())
        order = list(range(len(gold)))
        rnd.shuffle(order)
        assert entity_f1([pred[i] for i in order], [gold[i] for i in order], mode=mode) == approx(scores)


# ----- SQuAD v1.1 ------------------------------------------------------------------------------------------------


def test_normalize_answer_official_rules():
    assert normalize_answer("The  Quick, Brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theatre and Anatomy") == "theatre and anatomy"  # articles only as whole words
    assert normalize_answer("U.S. don't") == "us dont"  # punctuation removed, not replaced by space
    assert normalize_answer("  tab\tand\nnewline ") == "tab and newline"
    assert normalize_answer("A") == ""


def test_squad_exact_match_and_f1_by_hand():
    assert exact_match("The Eiffel Tower.", "eiffel   tower") == 1.0
    assert exact_match("Eiffel Tower", "Tower") == 0.0
    # pred tokens [cat, sat], gold tokens [cat]: P = 1/2, R = 1, F1 = 2/3
    assert squad_f1("cat sat", "the cat") == approx(2 / 3)
    # [cat, sat, on, mat] vs [cat, on, mat, today]: 3 common, P = R = 3/4
    assert squad_f1("The cat sat on the mat", "a cat on the mat today") == approx(0.75)
    assert squad_f1("", "Paris") == 0.0 and exact_match("", "Paris") == 0.0
    # official v1.1 quirk: both sides normalise to "" -> EM 1, F1 0
    assert exact_match("The", "a") == 1.0 and squad_f1("The", "a") == 0.0


def test_squad_scores_max_over_golds_mean_over_questions():
    predictions = ["Paris", "in Paris France", ""]
    references = [["paris, France", "Paris"], ["Paris", "France"], ["London"]]
    scores = squad_scores(predictions, references)
    # q1: EM 1, F1 1; q2: EM 0, F1 max(1/3 precision, recall 1 -> 0.5); q3: 0, 0
    assert scores == approx({"exact_match": 1 / 3, "f1": (1 + 0.5 + 0) / 3})
    with pytest.raises(ValueError):
        squad_scores(["a"], [[]])
    with pytest.raises(ValueError):
        squad_scores(["a"], ["a"])  # a bare string is not a list of golds
    with pytest.raises(ValueError):
        squad_scores(["a", "b"], [["a"]])


words = st.sampled_from(["the", "a", "Paris", "paris,", "France", "tower", "Eiffel", "in", "!", "an", "1889"])
answers = st.lists(words, max_size=6).map(" ".join)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(answers, st.lists(answers, min_size=1, max_size=3)), min_size=1, max_size=8), st.randoms())
def test_squad_properties(items, rnd):
    predictions = [p for p, _ in items]
    references = [g for _, g in items]
    scores = squad_scores(predictions, references)
    assert 0.0 <= scores["exact_match"] <= 1.0 and 0.0 <= scores["f1"] <= 1.0
    for p, golds in items:
        for gold in golds:
            assert 0.0 <= squad_f1(p, gold) <= 1.0
            if normalize_answer(gold):  # EM <= F1 except the v1.1 empty-vs-empty quirk
                assert exact_match(p, gold) <= squad_f1(p, gold)
        assert exact_match(p, p) == 1.0
    shuffled = items[:]
    rnd.shuffle(shuffled)
    assert squad_scores([p for p, _ in shuffled], [g for _, g in shuffled]) == approx(scores)


# ----- SuperGLUE -------------------------------------------------------------------------------------------------


def test_multirc_grouped_by_question_by_hand():
    # q1 options: gold T F T, pred T F F (one wrong); q2 options: gold F T, pred F T (all right). Interleaved.
    question_ids = [("p0", 1), ("p0", 2), ("p0", 1), ("p0", 2), ("p0", 1)]
    references = ["True", "False", "False", "True", "True"]
    predictions = ["True", "False", "False", "True", "False"]
    scores = multirc_scores(predictions, references, question_ids)
    # EM: 1 of 2 questions fully right. F1a: 3 gold positives, 2 predicted, 2 correct -> P 1, R 2/3, F1 0.8.
    assert scores == approx({"exact_match": 0.5, "f1a": 0.8})
    assert scores["f1a"] == approx(f1_score([r == "True" for r in references], [p == "True" for p in predictions]))
    assert multirc_scores([1, 0, 0, 1, 0], [True, False, False, True, True], question_ids) == approx(scores)
    with pytest.raises(ValueError):
        multirc_scores(["maybe"], ["True"], [0])
    with pytest.raises(ValueError):
        multirc_scores(["True"], ["True"], [0, 1])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 4)), min_size=1, max_size=20),
    st.randoms(),
)
def test_multirc_properties(rows, rnd):
    scores = multirc_scores([p for p, _, _ in rows], [g for _, g, _ in rows], [q for _, _, q in rows])
    assert 0.0 <= scores["exact_match"] <= 1.0 and 0.0 <= scores["f1a"] <= 1.0
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    again = multirc_scores([p for p, _, _ in shuffled], [g for _, g, _ in shuffled], [q for _, _, q in shuffled])
    assert again == approx(scores)
    if all(p == g for p, g, _ in rows):
        assert scores["exact_match"] == 1.0


def test_record_max_over_gold_entities():
    predictions = ["Barack Obama", "President Obama", "Trump"]
    references = [["Obama", "Barack Obama"], ["Obama", "Barack Obama"], ["Obama"]]
    scores = record_scores(predictions, references)
    # q2: vs "Obama" P 1/2 R 1 -> 2/3; vs "Barack Obama" P 1/2 R 1/2 -> 1/2; max 2/3.
    assert scores == approx({"exact_match": 1 / 3, "f1": (1 + 2 / 3 + 0) / 3})


def test_cb_accuracy_and_macro_f1_by_hand():
    refs = ["entailment", "entailment", "contradiction", "neutral", "neutral", "neutral"]
    preds = ["entailment", "contradiction", "contradiction", "neutral", "entailment", "neutral"]
    # entailment P 1/2 R 1/2 F1 1/2; contradiction P 1/2 R 1 F1 2/3; neutral P 1 R 2/3 F1 0.8
    scores = cb_scores(preds, refs)
    assert scores == approx({"accuracy": 4 / 6, "macro_f1": (0.5 + 2 / 3 + 0.8) / 3})
    assert scores["macro_f1"] == approx(f1_score(refs, preds, average="macro"))
