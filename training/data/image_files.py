"""Image files as the input's rows: a folder ``root/<class>/<file>.png`` (the layout every image
tool uses), one row per file, its class folder's name the label; or a table whose image column
holds the files' paths (relative to the table's directory, or absolute; local or s3://).

Ray Data's image reader (``ray.data.read_images``) decodes and resizes the files for the passes
over the whole input; the driver's small reads (a split's raw rows, naming a bad file) decode
them here with ``trainflow_pyfunc.images.decode``, the same PIL calls, which is also what the
registered model applies to encoded bytes; a table's paths are decoded by that same function in a
Ray Data map over the table's rows. Either way a row is {image: uint8 [C*H*W] (channels
first, as ``data.image_shape`` says), label: the class, path: the file}: the rows of an image
table, so every later stage (the row hash and splits, evaluation, the gate) reads them as such.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from training.data.formats import IMAGE_SUFFIXES
from training.errors import DataValidationError
from training.model.trainflow_pyfunc.images import channels_first, decode, mode_of, unreadable
from training.storage import filesystem, is_remote, join

if TYPE_CHECKING:
    import ray.data

    from training.data.schema import Plan

#: The column naming each row's file.
PATH = "path"
#: Files decoded here per table (the driver's reads), and by how many threads.
FILES_PER_TABLE = 256
DECODE_THREADS = 8


def class_of(path: str) -> str:
    """The class of an image file: the name of the folder it lies in."""
    return path.rstrip("/").split("/")[-2]


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def list_images(source: str, endpoint_url: str | None = None, by_class: bool = True) -> list[str]:
    """The image files of a class-folder tree, sorted; one error naming the first file that is
    not an image or not in a class folder, or the class folders that hold no image. Without
    ``by_class`` (new images to predict) the files may lie anywhere in the tree."""
    fs, root = filesystem(source, endpoint_url)
    uri = (lambda p: f"s3://{p}") if source.startswith("s3://") else (lambda p: p)
    layout = f"an image folder holds root/<class>/<image> files ({'/'.join(IMAGE_SUFFIXES)})"
    folders, files = set(), []
    for entry in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        relative = entry.path[len(root) :].lstrip("/")
        depth = len(relative.split("/"))
        if _hidden(relative):
            continue
        if entry.type == pafs.FileType.Directory:
            if depth == 1:
                folders.add(relative)
            continue
        if os.path.splitext(relative)[1].lower() not in IMAGE_SUFFIXES:
            raise DataValidationError(
                f"{uri(entry.path)} is not an image file; {layout}: move it out of {source}"
            )
        if by_class and depth != 2:
            raise DataValidationError(
                f"{uri(entry.path)} is not in a class folder directly under {source}; {layout}"
            )
        files.append(uri(entry.path))
    empty = sorted(folders - {class_of(f) for f in files}) if by_class else []
    if empty:
        raise DataValidationError(
            f"class folder(s) {empty[:10]} under {source} hold no images; add images or remove "
            "the folder"
        )
    if not files:
        raise DataValidationError(f"directory {source!r} holds no data files and no images")
    return sorted(files)


def image_table(pixels: np.ndarray, paths: list[str], plan: Plan) -> pa.Table:
    """Decoded images (uint8 [n, C*H*W]) and their files -> the rows of an image table."""
    width = int(np.prod(plan.image_shape))
    flat = pa.array(np.ascontiguousarray(pixels, dtype=np.uint8).reshape(-1))
    return pa.table(
        {
            plan.image: pa.FixedSizeListArray.from_arrays(flat, width),
            plan.label: pa.array([class_of(p) for p in paths], pa.string()),
            PATH: pa.array(list(paths), pa.string()),
        }
    )


def _reader_rows(batch: dict[str, np.ndarray], plan: Plan) -> pa.Table:
    """A batch of Ray's image reader ([n, H, W(, C)] uint8 and paths) -> image table rows."""
    return image_table(channels_first(batch["image"]), list(batch[PATH]), plan)


def ray_read_images(paths: list[str], fs, plan: Plan) -> ray.data.Dataset:
    """The image files as a lazy Ray Dataset of image table rows, read by Ray's image reader."""
    import ray.data

    _, height, width = plan.image_shape
    images = ray.data.read_images(
        paths,
        filesystem=fs,
        size=(height, width),
        mode=mode_of(plan.image_shape),
        include_paths=True,
        file_extensions=None,  # the files are chosen already
        partitioning=None,
    )
    return images.map_batches(
        _reader_rows,
        fn_kwargs={"plan": plan},
        batch_format="numpy",
        batch_size=FILES_PER_TABLE,  # bounded memory for large images
    )


def read_image_bytes(paths: list[str], fs) -> ray.data.Dataset:
    """Image files as rows {image: the encoded file, path}: what a model of images scores."""
    import ray.data

    files = ray.data.read_binary_files(
        paths, filesystem=fs, include_paths=True, file_extensions=None, partitioning=None
    )
    return files.rename_columns({"bytes": "image"})


def _decoded_here(file: str, plan: Plan, endpoint_url: str | None) -> tuple[np.ndarray, str]:
    """(one file's pixels, its path as Ray's reader names it)."""
    fs, path = filesystem(file, endpoint_url)
    with fs.open_input_stream(path) as stream:
        data = stream.read()
    try:
        return decode(data, plan.image_shape), path
    except (OSError, ValueError) as exc:
        raise ValueError(unreadable(exc)) from None


def read_images_here(
    files: list[str], plan: Plan, endpoint_url: str | None = None
) -> Iterator[pa.Table]:
    """The image files decoded here, ``FILES_PER_TABLE`` at a time, as image table rows (the
    same rows Ray's reader gives). A file PIL cannot read: ``ValueError`` saying why."""
    from concurrent.futures import ThreadPoolExecutor

    # Threads: reading (S3 above all) and PIL's decoding wait outside the GIL.
    with ThreadPoolExecutor(max_workers=DECODE_THREADS) as pool:
        for start in range(0, len(files), FILES_PER_TABLE):
            chunk = files[start : start + FILES_PER_TABLE]
            done = list(pool.map(lambda f: _decoded_here(f, plan, endpoint_url), chunk))
            yield image_table(np.stack([d[0] for d in done]), [d[1] for d in done], plan)


def image_root(source: str, is_file: bool) -> str:
    """The directory a table's relative image paths start from: the table's own."""
    if not is_file:
        return source
    return source.rsplit("/", 1)[0] if is_remote(source) else os.path.dirname(source)


def _resolved(path: str, root: str) -> str:
    if is_remote(path) or os.path.isabs(path):
        return path
    return join(root, path)


def _decoded_file(path: str, plan: Plan, endpoint_url: str | None) -> np.ndarray:
    file = _resolved(path, plan.image_root)
    try:
        fs, local = filesystem(file, endpoint_url)
        with fs.open_input_stream(local) as stream:
            data = stream.read()
        return decode(data, plan.image_shape)
    except (OSError, ValueError) as exc:
        reason = "no such file" if isinstance(exc, FileNotFoundError) else unreadable(exc)
        raise ValueError(f"image {file} (column {plan.image!r}): {reason}") from None


def with_decoded_paths(
    batch: pa.Table | pa.RecordBatch, plan: Plan, endpoint_url: str | None = None
) -> pa.Table:
    """A table's rows with its image column of paths replaced by the files' decoded pixels
    (uint8 [C*H*W] per row, as an image folder's rows hold them)."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    if plan.image not in table.column_names:
        return table
    paths = table.column(plan.image).to_pylist()
    missing = sum(p is None for p in paths)
    if missing:
        raise ValueError(f"column {plan.image!r} has {missing} rows without an image path")
    width = int(np.prod(plan.image_shape))
    rows = [_decoded_file(p, plan, endpoint_url) for p in paths]
    pixels = np.stack(rows) if rows else np.zeros((0, width), np.uint8)
    column = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), width)
    return table.set_column(table.column_names.index(plan.image), plan.image, column)
