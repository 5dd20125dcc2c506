"""column_values reads a split's column whole: the same values, in the same order, as iterating it row by row."""

from __future__ import annotations

import datasets

from mtft.tasks.columns import column_values


def test_the_values_are_the_rows_values_in_order():
    features = datasets.Features(
        {
            "label": datasets.ClassLabel(names=["a", "b", "c"]),
            "text": datasets.Value("string"),
            "answers": {
                "text": datasets.Sequence(datasets.Value("string")),
                "start": datasets.Sequence(datasets.Value("int32")),
            },
        }
    )
    rows = {
        "label": [2, 0, 1, 2],
        "text": ["x", "", "yz", "é"],
        "answers": [
            {"text": ["x"], "start": [0]},
            {"text": [], "start": []},
            {"text": ["y", "z"], "start": [0, 1]},
            {"text": ["é"], "start": [0]},
        ],
    }
    dataset = datasets.Dataset.from_dict(rows, features=features)
    for name in rows:
        values = column_values(dataset, name)
        assert isinstance(values, list) and values == [row[name] for row in dataset]
    assert column_values(dataset.select([3, 1]), "text") == ["é", ""]  # a selection's rows, not the table's
    assert column_values({"text": ("a", "b")}, "text") == ["a", "b"]  # a plain mapping of columns
