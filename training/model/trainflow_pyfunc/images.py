"""Image files as the network's pixels: decoded and resized exactly as Ray Data's image reader
(``ray.data.read_images(size=, mode=)``, Ray 2.60) does it, so a model served encoded PNG/JPEG
bytes sees the numbers it was trained on.

Ray's reader opens the file with PIL, resizes it with ``Image.BILINEAR`` when its size differs
(before any mode change), then converts the mode (``L`` for one channel, ``RGB`` for three) and
takes ``np.asarray``: [H, W] or [H, W, C] uint8. Here the same calls, in the same order, then the
channels moved first: a row is the image's [C, H, W] values, row-major, as ``input_shape`` says.

Pillow is imported only when an image is decoded: a model of arrays never needs it.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import numpy as np

#: The PIL mode an image is converted to, by its channel count.
MODES = {1: "L", 3: "RGB"}
#: What a value of an image column must be to be decoded here: a file's bytes, or their base64
#: text (how JSON, and so ``mlflow models serve``, carries bytes).
ENCODED = (bytes, bytearray, memoryview, str)


def mode_of(shape: Sequence[int]) -> str:
    """The PIL mode of images of ``shape`` [C, H, W]: L (C=1) or RGB (C=3)."""
    channels = int(shape[0])
    if channels not in MODES:
        raise ValueError(f"images need 1 (grey) or 3 (RGB) channels, got image shape {list(shape)}")
    return MODES[channels]


def decode(data: bytes | str, shape: Sequence[int]) -> np.ndarray:
    """One encoded image (PNG, JPEG, ...; or its base64 text) -> uint8 [C * H * W], channels
    first, resized to ``shape``. A file PIL cannot read raises ``OSError`` (or ``ValueError``)."""
    from PIL import Image

    if isinstance(data, str):
        data = base64.b64decode(data, validate=True)

    _, height, width = (int(d) for d in shape)
    mode = mode_of(shape)
    image = Image.open(io.BytesIO(bytes(data)))
    # Ray's reader: resize first (only when the size differs), then convert the mode.
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.BILINEAR)
    if image.mode != mode:
        image = image.convert(mode)
    return channels_first(np.asarray(image)[np.newaxis])[0]


def unreadable(exc: BaseException) -> str:
    """Why PIL could not decode a file, without PIL's in-memory buffer's address."""
    if type(exc).__name__ == "UnidentifiedImageError":
        return "not an image file PIL can read (corrupt, or not PNG/JPEG)"
    return f"a broken image ({exc})"


def channels_first(images: np.ndarray) -> np.ndarray:
    """A batch of images as Ray's reader yields them ([n, H, W] or [n, H, W, C]) -> [n, C*H*W],
    each row the image's [C, H, W] values."""
    if images.ndim == 3:
        return images.reshape(len(images), -1)
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), -1)
