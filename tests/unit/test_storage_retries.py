"""storage.retry_attempts reaches every filesystem a checkpoint or split write goes through, on
the driver and, pickled, on the Ray workers; quick checks keep pyarrow's 3 attempts."""

from __future__ import annotations

import pickle

import pytest
import ray.cloudpickle as cloudpickle

from training.config.overrides import load_config
from training.errors import ConfigError
from training.storage import StorageLayout, filesystem
from training.storage_s3 import QUICK_ATTEMPTS, RetryingS3FileSystem

S3 = ["storage.root=s3://bucket/prefix", "storage.endpoint_url=http://127.0.0.1:9"]


def test_checkpoints_get_the_configured_attempts_and_quick_checks_three():
    default = StorageLayout.from_config(load_config(None, S3))
    assert default.retry_attempts == 10
    path, fs = default.ray_storage("r1")
    assert path == "bucket/prefix/runs/r1" and isinstance(fs, RetryingS3FileSystem)
    assert fs.retry_attempts == 10
    assert default.filesystem("s3://bucket/prefix/data/x")[0].retry_attempts == 10

    tuned = StorageLayout.from_config(load_config(None, [*S3, "storage.retry_attempts=25"]))
    assert tuned.ray_storage("r1")[1].retry_attempts == 25
    # A first look at a store (does the manifest exist?) fails fast when it is not there.
    assert filesystem("s3://bucket/x", "http://127.0.0.1:9")[0].retry_attempts == QUICK_ATTEMPTS


def test_a_local_root_has_no_filesystem_of_ours():
    layout = StorageLayout.from_config(load_config(None, ["storage.root=/tmp/tf"]))
    assert layout.ray_storage("r1") == ("/tmp/tf/runs/r1", None)


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_the_attempts_survive_the_trip_to_a_worker_and_no_credential_travels(dumps, monkeypatch):
    """Ray pickles storage_filesystem to its workers; pyarrow's own pickle drops the retry
    strategy (the worker got 3 attempts). The environment's keys stay out of the pickle."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIARETRYCANARY9Z")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "retry-canary-secret-5e1")
    layout = StorageLayout.from_config(load_config(None, [*S3, "storage.retry_attempts=17"]))
    _, fs = layout.ray_storage("r1")
    blob = dumps(fs)
    assert b"AKIARETRYCANARY9Z" not in blob and b"retry-canary-secret-5e1" not in blob

    shipped = pickle.loads(blob)
    assert type(shipped) is RetryingS3FileSystem and shipped.retry_attempts == 17
    assert shipped.equals(fs) and "retry_attempts=17" in repr(shipped)


@pytest.mark.parametrize("value", ["0", "51"])
def test_retry_attempts_out_of_range_is_refused(value):
    with pytest.raises(ConfigError, match="retry_attempts"):
        load_config(None, [f"storage.retry_attempts={value}"])


def test_the_layouts_requests_ride_out_an_outage_that_fails_a_quick_check(tmp_path, monkeypatch):
    """The real S3 server behind a proxy that refuses every request for 3.5 s: longer than one
    request's 3 quick attempts wait (at most 1 + 2 s), well within the layout's attempts."""
    from loopback_s3 import moto_server
    from s3_outage import s3_outage

    from training.errors import ServiceUnreachableError
    from training.storage import exists

    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    for key, value in {**keys, "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    uri = "s3://outage/data/f1/manifest.json"
    with moto_server(tmp_path, "outage", keys) as endpoint:
        with s3_outage(endpoint, 3.5) as outage, pytest.raises(ServiceUnreachableError):
            exists(uri, outage.endpoint)
        assert outage.refused == QUICK_ATTEMPTS

        with s3_outage(endpoint, 3.5) as outage:
            config = load_config(None, [f"storage.endpoint_url={outage.endpoint}"])
            fs, path = StorageLayout.from_config(config).filesystem(uri)
            with pickle.loads(pickle.dumps(fs)).open_output_stream(path) as out:  # as a worker
                out.write(b'{"whole": true}')
            assert fs.open_input_stream(path).read() == b'{"whole": true}'
        assert outage.refused >= QUICK_ATTEMPTS and outage.forwarded > 0
