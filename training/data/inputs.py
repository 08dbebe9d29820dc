"""The input files of a run: which files ``data.source`` names, their format, their fingerprint.

Nothing here starts Ray: the driver resolves and fingerprints the inputs before preprocessing.
"""

from __future__ import annotations

import hashlib
import json
import os

import pyarrow.fs as pafs

from training.config import BUILTIN_DIGITS, DataConfig, ModelConfig
from training.data.builtin import (
    BUILTIN_BBC_HEADLINES,
    BUILTIN_BBC_NEWS,
    BUILTIN_DIABETES,
    BUILTIN_PENGUINS,
    DIGITS32,
    ensure_bbc_headlines,
    ensure_bbc_news,
    ensure_diabetes,
    ensure_digits,
    ensure_digits32,
    ensure_penguins,
)
from training.data.formats import IMAGE_SUFFIXES, IMAGES, SUFFIXES, file_suffix
from training.data.image_files import list_images
from training.errors import DataValidationError, ServiceUnreachableError, StorageError
from training.storage import filesystem, is_remote, join, trainflow_home, upload_file

# Bump when the output of preprocessing changes for the same input and config: old caches die.
PREPROCESS_VERSION = "4"
#: The bundled data sets: name -> the function that writes them under the home.
BUILTIN = {
    BUILTIN_DIGITS: ensure_digits,
    DIGITS32: ensure_digits32,
    BUILTIN_DIABETES: ensure_diabetes,
    BUILTIN_PENGUINS: ensure_penguins,
    BUILTIN_BBC_NEWS: ensure_bbc_news,
    BUILTIN_BBC_HEADLINES: ensure_bbc_headlines,
}


def _uri(source: str, path: str) -> str:
    return f"s3://{path}" if source.startswith("s3://") else path


def _hidden(relative: str) -> bool:
    # Spark/Hive markers (_SUCCESS, _temporary) and dot files are not data.
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _builtin_files(source: str, endpoint_url: str | None, storage_root: str | None) -> list[str]:
    """A bundled set written under the home (copied to a remote storage root when there is one)."""
    if source not in BUILTIN:
        raise DataValidationError(
            f"unknown built-in data set {source!r}; use one of {sorted(BUILTIN)} or a parquet, "
            "CSV, TSV or JSON path, or a folder of images"
        )
    local = BUILTIN[source](trainflow_home())
    if storage_root and is_remote(storage_root):
        name = source.removeprefix("builtin:")
        target = join(storage_root, "datasets", name, os.path.basename(local))
        return [upload_file(local, target, endpoint_url)]
    return [local]


def resolve_inputs(
    data: DataConfig,
    endpoint_url: str | None = None,
    storage_root: str | None = None,
    labelled: bool = True,
) -> list[str]:
    """The input files of ``data.source``: a bundled set, one file, or a directory's files.

    With a remote ``storage_root`` a bundled set is copied there first: on a cluster, read
    tasks run on nodes that do not share the driver's disk. Without ``labelled`` (rows to
    predict) image files need no class folders.
    """
    source = data.source
    if source.startswith("builtin:"):
        return _builtin_files(source, endpoint_url, storage_root)
    fs, path = filesystem(source, endpoint_url)
    try:
        info = fs.get_file_info(path)
    except OSError as exc:
        # Remote: maybe a network blip, so retriable; local: a permission problem, so not.
        kind = ServiceUnreachableError if is_remote(source) else StorageError
        raise kind(f"cannot reach {source}: {exc}; check data.source and credentials") from None
    if info.type == pafs.FileType.NotFound:
        raise DataValidationError(
            f"data.source {source!r} does not exist; give an existing file or directory "
            f"(absolute path or s3://bucket/key) or {BUILTIN_DIGITS}"
        )
    if info.type == pafs.FileType.File:
        files = [_uri(source, path)]
        input_format(data, files)  # fail now on an unknown suffix
        return files
    if data.format == IMAGES:
        return list_images(source, endpoint_url, by_class=labelled)
    wanted = {s for s, f in SUFFIXES.items() if data.format in ("auto", f)}
    found = []
    for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        relative = entry.path[len(path) :].lstrip("/")
        suffix = file_suffix(entry.path)
        if entry.type == pafs.FileType.File and suffix in wanted and not _hidden(relative):
            found.append(_uri(source, entry.path))
    if not found and data.format == "auto" and _holds_images(fs, path):
        return list_images(source, endpoint_url, by_class=labelled)
    if not found:
        kinds = "/".join(sorted(wanted))
        raise DataValidationError(
            f"directory {source!r} holds no {kinds} files; put the data files there or point "
            "data.source at a file"
        )
    files = sorted(found)
    input_format(data, files)
    return files


def _holds_images(fs, path: str) -> bool:
    """Whether a directory without tables holds image files (then it is an image folder)."""
    listing = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    return any(os.path.splitext(e.path)[1].lower() in IMAGE_SUFFIXES for e in listing)


def input_format(data: DataConfig, files: list[str]) -> str:
    """``parquet``, ``csv`` (and TSV), ``json`` (lines or an array), ``xlsx`` or ``images``:
    ``data.format``, else every file's suffix (which must agree)."""
    if data.format != "auto":
        return data.format
    formats = set()
    known = {**SUFFIXES, **IMAGE_SUFFIXES}
    for file in files:
        suffix = file_suffix(file)
        if suffix in IMAGE_SUFFIXES and len(files) == 1:
            raise DataValidationError(
                f"{file!r} is one image; point data.source at the folder of class sub-folders "
                "(root/<class>/<image>) that holds it"
            )
        if suffix == ".xls":
            raise DataValidationError(
                f"{file!r} is an old binary Excel workbook (.xls), which is not read; save it "
                "as .xlsx (Excel workbook) or CSV"
            )
        if suffix not in known:
            raise unknown_suffix(file, suffix)
        formats.add(known[suffix])
    if len(formats) > 1:
        raise DataValidationError(
            f"{data.source!r} mixes {sorted(formats)} files; keep one format there, or set "
            "data.format to read only one of them"
        )
    return formats.pop()


def unknown_suffix(file: str, suffix: str) -> DataValidationError:
    """The error for a file whose suffix names no format: the suffixes that would be read."""
    names = ", ".join(sorted(SUFFIXES))
    return DataValidationError(
        f"cannot tell the format of {file!r} from its suffix {suffix!r}; name the file with one "
        f"of {names}, or set data.format to parquet, csv, json or xlsx"
    )


def fingerprint(
    data: DataConfig,
    files: list[str],
    endpoint_url: str | None = None,
    model: ModelConfig | None = None,
) -> str:
    """16 hex chars of sha256 over every input file's bytes, the data config and the version
    (a text model's: and where its tokenizer comes from, which makes the stored token ids)."""
    digest = hashlib.sha256(f"trainflow-preprocess:{PREPROCESS_VERSION}\n".encode())
    digest.update(json.dumps(data.model_dump(mode="json"), sort_keys=True).encode())
    if model is not None and model.hf is not None:
        hf = model.hf
        vocab = (hf.config or {}).get("vocab_size")
        tokens = {"tokenizer": hf.tokenizer, "name_or_path": hf.name_or_path, "vocab": vocab}
        digest.update(json.dumps(tokens, sort_keys=True).encode())
    for file in files:
        fs, path = filesystem(file, endpoint_url)
        per_file = hashlib.sha256()
        try:
            with fs.open_input_stream(path) as stream:
                while chunk := stream.read(1 << 20):
                    per_file.update(chunk)
        except (FileNotFoundError, PermissionError) as exc:
            raise DataValidationError(f"cannot read input file {file}: {exc}; check it") from None
        # A digest per file keeps file boundaries: moving bytes between files changes the result.
        digest.update(per_file.digest())
    return digest.hexdigest()[:16]
