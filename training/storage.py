"""The one place that turns config into locations and filesystems (local paths or s3://).

Layout under the storage root::

    data/<fingerprint>/split=train|val|test/*.parquet + manifest.json   (shared by runs; cached)
    runs/<run_id>/sweep/...                                            (Tune state)
    runs/<run_id>/train/...                                            (Ray Train checkpoints)
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from training.errors import ServiceUnreachableError, StorageError
from training.storage_s3 import QUICK_ATTEMPTS, RetryingS3FileSystem

HOME_ENV = "TRAINFLOW_HOME"


def trainflow_home() -> Path:
    """The home for checkpoints, sqlite and processed data: $TRAINFLOW_HOME or ./.trainflow."""
    return Path(os.environ.get(HOME_ENV) or ".trainflow").expanduser().resolve()


def default_tracking_uri() -> str:
    return f"sqlite:///{trainflow_home() / 'mlflow.db'}"


def default_artifact_root() -> str:
    return (trainflow_home() / "mlartifacts").as_uri()


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def filesystem(
    uri: str, endpoint_url: str | None = None, retry_attempts: int = QUICK_ATTEMPTS
) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it for a local path or s3:// URI.

    Credentials come only from the environment or an AWS profile, never from config.
    ``retry_attempts``: tries per S3 request (``training.storage_s3``); a write that must ride
    out a storage blip gets ``storage.retry_attempts`` through ``StorageLayout``.
    """
    if uri.startswith("s3://"):
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        kwargs = {}
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            kwargs = {"endpoint_override": host or scheme, "scheme": scheme if host else "https"}
        fs = RetryingS3FileSystem(retry_attempts=retry_attempts, **kwargs)
        return fs, uri.removeprefix("s3://").rstrip("/")
    if uri.startswith("file://"):
        uri = uri.removeprefix("file://")
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def join(uri: str, *parts: str) -> str:
    if is_remote(uri):
        return posixpath.join(uri, *parts)
    return os.path.join(uri, *parts)


@dataclass(frozen=True)
class StorageLayout:
    """Where one pipeline's outputs go."""

    root: str
    endpoint_url: str | None = None
    #: Tries per S3 request of its writes: checkpoints, Tune state, manifests.
    retry_attempts: int = QUICK_ATTEMPTS

    @classmethod
    def from_config(cls, config) -> StorageLayout:
        """From a PipelineConfig's storage section (default root: <home>/storage)."""
        storage = config.storage
        root = storage.root or str(trainflow_home() / "storage")
        return cls(root.rstrip("/"), storage.endpoint_url, storage.retry_attempts)

    def data_dir(self, fingerprint: str) -> str:
        return join(self.root, "data", fingerprint)

    def runs_dir(self, run_id: str) -> str:
        return join(self.root, "runs", run_id)

    def fs(self) -> tuple[pafs.FileSystem, str]:
        return self.filesystem(self.root)

    def filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """``uri``'s filesystem with this layout's endpoint and retries."""
        return filesystem(uri, self.endpoint_url, self.retry_attempts)

    def uri_of(self, ray_path: str) -> str:
        """A path Ray reports inside ``ray_storage``'s filesystem (``bucket/key``), as a URI."""
        if is_remote(self.root) and not is_remote(ray_path):
            return f"s3://{ray_path}"
        return ray_path

    def ray_storage(self, run_id: str) -> tuple[str, pafs.FileSystem | None]:
        """(storage_path, storage_filesystem) for Ray Train/Tune RunConfig."""
        uri = self.runs_dir(run_id)
        if not is_remote(uri):
            return uri, None
        fs, path = self.filesystem(uri)
        return path, fs


@contextlib.contextmanager
def _reaching(uri: str, endpoint_url: str | None):
    """Turn a filesystem's OSError into our error naming the store and the fix."""
    try:
        yield
    except OSError as exc:
        # A remote store that does not answer may come back: let the task retry it.
        error = ServiceUnreachableError if is_remote(uri) else StorageError
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        where = f" (S3 endpoint {endpoint})" if is_remote(uri) and endpoint else ""
        raise error(
            f"cannot reach {uri}{where}: {exc}; check the path or storage.endpoint_url"
        ) from None


def exists(uri: str, endpoint_url: str | None = None) -> bool:
    fs, path = filesystem(uri, endpoint_url)
    with _reaching(uri, endpoint_url):
        return fs.get_file_info(path).type != pafs.FileType.NotFound


def upload_file(local_path: str, uri: str, endpoint_url: str | None = None) -> str:
    """Copy a local file to ``uri`` unless it is there already; returns ``uri``."""
    fs, path = filesystem(uri, endpoint_url)
    with _reaching(uri, endpoint_url):
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            pafs.copy_files(local_path, path, destination_filesystem=fs)
    return uri


def read_text(uri: str, endpoint_url: str | None = None) -> str:
    fs, path = filesystem(uri, endpoint_url)
    with fs.open_input_stream(path) as stream:
        return stream.read().decode()


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """A temporary path beside local ``target`` to write; renamed onto it when the block ends
    without an error, removed otherwise. Readers see the whole file or none."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(
    uri: str, text: str, endpoint_url: str | None = None, retry_attempts: int = QUICK_ATTEMPTS
) -> None:
    """Write a whole file or nothing: a temporary name first, then a rename.

    On S3 a single PUT is already atomic, so the object is written directly.
    """
    if not is_remote(uri):
        with atomic_path(filesystem(uri)[1]) as tmp:
            tmp.write_text(text)
        return
    fs, path = filesystem(uri, endpoint_url, retry_attempts)
    fs.create_dir(posixpath.dirname(path))
    with fs.open_output_stream(path) as out:
        out.write(text.encode())


def delete_dir(
    uri: str, endpoint_url: str | None = None, retry_attempts: int = QUICK_ATTEMPTS
) -> None:
    fs, path = filesystem(uri, endpoint_url, retry_attempts)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)
