"""A folder of real image files to train on, written here (nothing downloaded):
scikit-learn's handwritten digits as PNG files, ``root/<digit>/<n>.png``, the layout of an image
folder (``data.format: images``).

Each digit's 8x8 grey levels (0..16) become 0..255 and are upscaled with PIL to ``side`` x
``side``; past the 1,797 digits the images repeat with a seeded shift of a pixel or two, so
every file differs. Files alternate PNG sizes (``side`` and ``side + 4``): the reader resizes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: Side (pixels) of the written images.
SIDE = 16


def _digit_images(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [rows, 8, 8] grey levels, int labels [rows])."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.arange(rows) % len(digits.target)
    images = (digits.images[order] * (255 / 16)).round().astype(np.uint8)
    rng = np.random.default_rng(seed)
    repeated = np.arange(rows) >= len(digits.target)
    for i in np.flatnonzero(repeated):
        images[i] = np.roll(images[i], rng.integers(-1, 2, 2), axis=(0, 1))
    return images, digits.target[order]


def write_image_files(
    output: str, rows: int, seed: int = 0, num_files: int | None = None, endpoint_url=None
) -> list[str]:
    """``trainflow make-data --kind image-files``: the PNG folder on a local disk (one file per
    image: ``num_files`` does not apply); the files written."""
    from training.errors import ConfigError
    from training.storage import is_remote

    if is_remote(output):
        raise ConfigError(
            f"--kind image-files writes to a local directory, not {output}; write it locally "
            "and copy the folder (e.g. aws s3 sync)"
        )
    root = Path(write_digit_images(output, rows, seed))
    return sorted(str(p) for p in root.glob("*/*.png"))


def write_digit_images(root: str | Path, rows: int, seed: int = 0, side: int = SIDE) -> str:
    """Write ``rows`` PNG files under ``root/<digit>/``; the folder written."""
    from PIL import Image

    images, labels = _digit_images(rows, seed)
    root = Path(root)
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        size = side if index % 2 == 0 else side + 4
        picture = Image.fromarray(image).resize((size, size), Image.BILINEAR)
        picture.save(folder / f"{index:06d}.png")
    return os.fspath(root)
