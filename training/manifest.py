"""What preprocessing produced: the feature spec every later stage needs, and the manifest.

Both are plain JSON-able dataclasses: they travel in checkpoints (loaded with weights_only=True),
MLflow artifacts and Prefect results.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

SPLITS = ("train", "val", "test")

# Column names of the processed parquet files.
FEATURES = "features"
LABEL = "label"
SAMPLE_ID = "sample_id"


@dataclass
class FeatureSpec:
    """How raw rows become model inputs, and how model outputs become labels."""

    label_column: str
    classes: list[Any]  # original label values; index i is class i
    input_shape: list[int]  # [n_features] or [C, H, W]
    mean: list[float]  # per flattened input position, fitted on train only
    std: list[float]
    feature_columns: list[str] | None = None
    image_column: str | None = None
    task: str = "classification"  # or "regression": classes is empty, the label a number
    # A regression's label normalisation, fitted on train only: the model learns
    # (label - label_mean) / label_std and predictions are mapped back.
    label_mean: float = 0.0
    label_std: float = 1.0
    # A table's fitted state (train split only), plain data for weights_only loading: a numeric
    # column's median fills its gaps (one per feature_columns entry; empty: gaps are refused),
    # indicator_columns get a 0/1 "was missing" feature, categories maps each categorical
    # column to its vocabulary (most frequent first), datetime_years the year filling a
    # missing date. column_roles: every input column -> its role, or why it is not used.
    # text_columns: free-text columns, each hashed into text_features n-gram buckets;
    # text_found: those found text by their values, with why (said on the console; serving
    # reads text_columns alone, so a spec without it transforms the same).
    # datetime_formats: a text datetime column's format (strftime, or ISO8601), as training
    # parsed it (a value that does not fit is a gap); datetime_found: the string columns found
    # datetime by their values (their rows are hashed by their text, as the plan read them),
    # with how the format reads; datetime_cycles: the (sin, cos) cycles of each date, empty in
    # a spec from before day of year (then month, weekday, hour).
    medians: list[float] = field(default_factory=list)
    indicator_columns: list[str] = field(default_factory=list)
    categories: dict[str, list[str]] = field(default_factory=dict)
    datetime_columns: list[str] = field(default_factory=list)
    datetime_years: dict[str, float] = field(default_factory=dict)
    datetime_formats: dict[str, str] = field(default_factory=dict)
    datetime_found: dict[str, str] = field(default_factory=dict)
    datetime_cycles: list[str] = field(default_factory=list)
    column_roles: dict[str, str] = field(default_factory=dict)
    text_columns: list[str] = field(default_factory=list)
    text_features: int = 0
    text_found: dict[str, str] = field(default_factory=dict)
    # Per feature position: a categorical's number of codes, 0 for a number (networks embed).
    cardinalities: list[int] = field(default_factory=list)
    # The train split as a later run's drift check reads it (training.data.drift): per numeric
    # column a percentile sketch and its share of gaps, per categorical column value shares.
    drift_reference: dict[str, Any] = field(default_factory=dict)
    # A text model's tokens step (``trainflow_pyfunc.tokens``): the text column, the tokenizer's
    # JSON, max_length and pad_id. input_shape is then [max_length], mean and std are empty.
    tokens: dict[str, Any] = field(default_factory=dict)

    @property
    def num_features(self) -> int:
        return math.prod(self.input_shape)

    @property
    def row_bytes(self) -> int:
        """A processed row in memory: float32 features, an int64 label and sample id."""
        return 4 * self.num_features + 16

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def is_regression(self) -> bool:
        return self.task == "regression"

    @property
    def num_outputs(self) -> int:
        """The network's outputs: one per class, or the one number of a regression."""
        return 1 if self.is_regression else self.num_classes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FeatureSpec:
        return cls(**raw)


@dataclass
class Manifest:
    """The completion marker of a preprocessing output: written last, atomically."""

    fingerprint: str
    source: str
    data_dir: str
    split_uris: dict[str, str]
    rows: dict[str, int]
    class_counts: dict[str, dict[str, int]]  # a regression's are empty
    spec: FeatureSpec
    preprocessing: dict[str, Any] = field(default_factory=dict)
    input_files: list[str] = field(default_factory=list)
    task_reason: str = ""  # why preprocessing chose spec.task (printed and logged)
    ignored_columns: dict[str, str] = field(default_factory=dict)  # column -> why not used
    #: Rows left out for having no label (data.missing_label: drop), and where the first was.
    rows_dropped_unlabeled: int = 0
    first_unlabeled: str = ""

    def to_json(self) -> str:
        # Insertion order kept (no sort_keys): a row's split is the hash of its columns in the
        # order of spec.column_roles, so the roles must read back in the order they were hashed.
        return json.dumps(asdict(self), indent=2, default=str)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        raw["spec"] = FeatureSpec.from_dict(raw["spec"])
        return cls(**raw)
