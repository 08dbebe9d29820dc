"""The ``data`` section: where the table is, which columns mean what, how rows split."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from training.config.schema_base import BUILTIN_DIGITS, Section


class SplitConfig(Section):
    """Fractions of rows held out, assigned by a seeded hash of each row."""

    val: float = Field(0.15, gt=0, lt=1, description="fraction of rows for validation")
    test: float = Field(0.15, gt=0, lt=1, description="fraction of rows for the final test")
    seed: int = Field(0, ge=0, description="seed of the row hash that assigns splits")

    @model_validator(mode="after")
    def _leave_rows_for_training(self) -> SplitConfig:
        if self.val + self.test >= 0.9:
            raise ValueError(
                f"val + test = {self.val + self.test:.2f} leaves too few rows for training; "
                "keep data.split.val + data.split.test below 0.9"
            )
        return self


class DataConfig(Section):
    """Where the table is and which columns mean what."""

    source: str = Field(
        BUILTIN_DIGITS,
        description="builtin:digits|diabetes|penguins|bbc_news|bbc_headlines, or a parquet, "
        "CSV, TSV, JSON (lines or an array; the text forms also .gz) or Excel .xlsx file or "
        "directory, or a folder of images in class sub-folders (local or s3://)",
    )
    format: Literal["auto", "parquet", "csv", "json", "xlsx", "images"] = Field(
        "auto",
        description="file format (csv: also .tsv; json: JSON lines or an array; xlsx: an Excel "
        "workbook; images: a folder root/<class>/<image> of PNG/JPEG files); auto infers it "
        "from the suffixes",
    )
    sheet: str | int | None = Field(
        None,
        description="an Excel workbook's sheet to read: its name, or its 0-based index; "
        "default: the first sheet (a workbook is read whole, in memory)",
    )
    label_column: str = Field("label", min_length=1, description="the column to predict")
    feature_columns: list[str] | None = Field(
        None, description="feature columns; default: every other column, by its inferred role"
    )
    columns: dict[str, Literal["numeric", "categorical", "datetime", "text", "ignore"]] = Field(
        default_factory=dict,
        description="a column's role where inference should not decide (e.g. an int code as "
        "categorical, a text column as datetime, short strings as free text, a column to leave "
        "out)",
    )
    date_formats: dict[str, str] = Field(
        default_factory=dict,
        description="a text column's date format (strftime, e.g. %d/%m/%Y) where its values "
        "cannot tell day from month; default: inferred from the values (ISO 8601, YYYY/MM/DD, "
        "DD.MM.YYYY, MM/DD/YYYY, DD/MM/YYYY)",
    )
    text_features: int = Field(
        4096,
        ge=16,
        le=2**20,
        description="hashed n-gram buckets per free-text column (model.kind mlp or custom)",
    )
    missing: Literal["impute", "error"] = Field(
        "impute",
        description="impute: a gap is the train median plus a missing flag (a category of its "
        "own); error: refuse rows with gaps",
    )
    missing_label: Literal["error", "drop"] = Field(
        "error",
        description="a row with no value in the label column: error refuses the input (naming "
        "the first such row); drop leaves those rows out before the split, counted on the "
        "preprocess line and the run",
    )
    max_categories: int = Field(
        100, ge=1, description="vocabulary size per categorical column; rarer values share one"
    )
    image_column: str | None = Field(
        None,
        description="a column of fixed-size numeric arrays, used instead of features (an image "
        "folder's: the column the model takes, default image)",
    )
    image_shape: list[int] | None = Field(
        None, description="shape (C, H, W) of one image; needed by model.kind=cnn"
    )
    task: Literal["auto", "classification", "regression", "causal_lm"] = Field(
        "auto",
        description="auto: a float label with many values is a regression, else classes; "
        "causal_lm: a language model learns the text column itself (model.kind=hf)",
    )
    split: SplitConfig = Field(default_factory=SplitConfig)
    max_length: int = Field(
        128,
        ge=2,
        description="model.kind=hf: tokens per text, longer texts are truncated (causal_lm with "
        "pack: tokens per packed block)",
    )
    pack: bool = Field(
        True,
        description="causal_lm: concatenate the texts' tokens and cut them into blocks of "
        "max_length (no padding, no truncation); false: one text per row, truncated",
    )
    prompt_column: str | None = Field(
        None,
        description="causal_lm: the column of prompts, with response_column (both or neither): "
        "each row is its prompt's tokens then its response's, the loss on the response only",
    )
    response_column: str | None = Field(
        None, description="causal_lm: the column of responses (with prompt_column)"
    )
    chat_template: bool = Field(
        False,
        description="causal_lm with prompt/response columns: format each row with the "
        "tokenizer's own chat template (user: the prompt, assistant: the response)",
    )

    @field_validator("image_shape")
    @classmethod
    def _positive_shape(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (len(value) != 3 or any(d <= 0 for d in value)):
            raise ValueError(
                "must be three positive ints [channels, height, width], e.g. [1, 8, 8]"
            )
        return value

    @field_validator("sheet")
    @classmethod
    def _sheet_index(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, int) and value < 0:
            raise ValueError("a sheet index counts from 0 (the first sheet); give 0 or more")
        return value

    @field_validator("date_formats")
    @classmethod
    def _readable_formats(cls, value: dict[str, str]) -> dict[str, str]:
        for column, fmt in value.items():
            why = date_format_error(fmt)
            if why:
                raise ValueError(f"{column}: {fmt!r} is not a date format ({why}); e.g. %d/%m/%Y")
        return value

    @model_validator(mode="after")
    def _features_or_image(self) -> DataConfig:
        if self.feature_columns is not None and self.image_column is not None:
            raise ValueError("set either data.feature_columns or data.image_column, not both")
        if self.feature_columns is not None and len(self.feature_columns) == 0:
            raise ValueError("data.feature_columns is empty; list columns or leave it unset")
        if self.feature_columns is not None and self.label_column in self.feature_columns:
            raise ValueError(f"label column {self.label_column!r} is also in data.feature_columns")
        if self.label_column in self.columns:
            raise ValueError(f"label column {self.label_column!r} cannot have a data.columns role")
        check_prompt_response(self)
        return self


def date_format_error(fmt: str) -> str | None:
    """Why a declared strftime format cannot read dates (None: it can): it must read back a
    date it writes, as pandas reads it (imported here only: the config stays light)."""
    import datetime

    import pandas as pd

    if fmt == "ISO8601":  # pandas' own name for ISO 8601, not a strftime format
        return None
    try:
        written = datetime.datetime(2001, 2, 3, 4, 5, 6).strftime(fmt)
        parsed = pd.to_datetime(pd.Series([written]), format=fmt, errors="coerce")
    except (ValueError, TypeError) as exc:
        return str(exc)
    if "%" not in fmt or parsed.isna().any():
        return "it does not read back the dates it writes"
    return None


def check_prompt_response(data: DataConfig) -> None:
    """Prompt and response columns come as a pair, for a language model, apart from the label;
    a chat template needs them (its user and assistant turns)."""
    pair = (data.prompt_column, data.response_column)
    if (pair[0] is None) != (pair[1] is None):
        raise ValueError(
            "set both data.prompt_column and data.response_column (the loss is on the "
            "response's tokens), or neither (one text column)"
        )
    if pair[0] is None:
        if data.chat_template:
            raise ValueError(
                "data.chat_template formats a prompt and a response: set data.prompt_column "
                "and data.response_column too"
            )
        return
    if data.task != "causal_lm":
        raise ValueError("data.prompt_column and data.response_column need data.task: causal_lm")
    if pair[0] == pair[1] or data.label_column in pair:
        raise ValueError(
            f"data.prompt_column ({pair[0]!r}), data.response_column ({pair[1]!r}) and "
            f"data.label_column ({data.label_column!r}) must be three different columns"
        )
