"""A real S3 API server for tests: ``moto_server`` on a free loopback port, with one bucket."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def moto_server(log_dir: Path, bucket: str, credentials: dict[str, str]) -> Iterator[str]:
    """The server's endpoint URL, with ``bucket`` made by an admin client (trainflow never
    creates buckets); the server's process group is killed on exit."""
    import pyarrow.fs as pafs

    from training.platform.cluster import free_port

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log_dir / "moto.log", "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.3)
        pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            allow_bucket_creation=True,
            access_key=credentials["AWS_ACCESS_KEY_ID"],
            secret_key=credentials["AWS_SECRET_ACCESS_KEY"],
        ).create_dir(bucket)
        yield endpoint
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # our own moto_server's group only
        proc.wait()
