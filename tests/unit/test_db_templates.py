"""Fresh homes start from a copy of an empty, migrated database (fixed costs)."""

from __future__ import annotations

import sqlite3

import pytest

from training.platform import db_templates, fast_start


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(fast_start.SWITCH_ENV, raising=False)
    return tmp_path / "cache"


def _database(path, rows=("a",)):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (v TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [(r,) for r in rows])
    conn.close()
    return path


def _rows(path):
    with sqlite3.connect(path) as conn:
        rows = [r for (r,) in conn.execute("SELECT v FROM t ORDER BY v")]
    conn.close()
    return rows


def test_a_saved_template_seeds_a_fresh_database_with_its_fix_up(tmp_path):
    db_templates.save(_database(tmp_path / "first.db"), "lib", "1.0")
    assert db_templates.template_path("lib", "1.0").is_file()

    target = tmp_path / "home" / "second.db"
    seeded = db_templates.seed(
        target, "lib", "1.0", lambda conn: conn.execute("INSERT INTO t VALUES ('fixed')")
    )
    assert seeded
    assert _rows(target) == ["a", "fixed"]
    assert [p.name for p in target.parent.iterdir()] == ["second.db"]  # no temporary left


def test_an_existing_database_is_never_replaced(tmp_path):
    db_templates.save(_database(tmp_path / "first.db"), "lib", "1.0")
    existing = _database(tmp_path / "mine.db", rows=("mine",))
    assert not db_templates.seed(existing, "lib", "1.0", None)
    assert _rows(existing) == ["mine"]


def test_no_template_of_that_version_means_no_copy(tmp_path):
    db_templates.save(_database(tmp_path / "first.db"), "lib", "1.0")
    target = tmp_path / "new.db"
    assert not db_templates.seed(target, "lib", "2.0", None)
    assert not target.exists()


def test_the_first_template_stays(tmp_path):
    db_templates.save(_database(tmp_path / "one.db", rows=("one",)), "lib", "1.0")
    db_templates.save(_database(tmp_path / "two.db", rows=("two",)), "lib", "1.0")
    assert _rows(db_templates.template_path("lib", "1.0")) == ["one"]


def test_switched_off_it_neither_saves_nor_seeds(tmp_path, monkeypatch):
    monkeypatch.setenv(fast_start.SWITCH_ENV, "0")
    db_templates.save(_database(tmp_path / "first.db"), "lib", "1.0")
    assert not db_templates.template_path("lib", "1.0").exists()


def test_a_broken_template_only_means_migrating_in_place(tmp_path):
    template = db_templates.template_path("lib", "1.0")
    template.parent.mkdir(parents=True)
    template.write_bytes(b"not a database")
    target = tmp_path / "new.db"
    assert not db_templates.seed(target, "lib", "1.0", None)
    assert not target.exists()
    assert list(tmp_path.glob(".new.db.*")) == []


def test_a_second_mlflow_home_starts_from_the_first_ones_tables(tmp_path, monkeypatch):
    """The real store: the second home is a copy (no MLflow migration), its experiment is
    created as usual, and its Default experiment keeps artifacts in its own home."""
    from training.config.overrides import load_config
    from training.tracking import store

    config = load_config(None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name in ("first", "second"):
        monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / name))
        tracker = store.configure(config)
        assert tracker.client.get_experiment(tracker.experiment_id).name == config.mlflow.experiment
    import mlflow

    assert db_templates.template_path("mlflow", mlflow.__version__).is_file()
    second = tmp_path / "second"
    default = tracker.client.get_experiment("0")
    assert default.artifact_location == (second / "mlartifacts" / "0").as_uri()
    # The first home's experiment is not in the second's copy.
    assert len(tracker.client.search_experiments()) == 2
