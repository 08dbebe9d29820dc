"""A storage outage during the final training: the real Ray Train fit checkpoints to ``s3://``
(the loopback S3 server) through a proxy that refuses every request for seconds from the first
checkpoint upload on (``s3_outage``). The upload waits it out with back-off; no attempt of the
training fails, and every checkpoint it kept is whole."""

from __future__ import annotations

import functools
import time

import pytest
from loopback_s3 import moto_server
from s3_outage import s3_outage

from training import storage
from training.config.overrides import load_config
from training.loop.trainer import train_final
from training.stages.evaluated import load_checkpoint_state
from training.storage import StorageLayout, filesystem
from training.storage_s3 import RetryingS3FileSystem

pytestmark = pytest.mark.integration

BUCKET = "trainflow-outage"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# Longer than Ray Train's own upload retries ride out on pyarrow's default of 3 attempts per
# request (~5-8 s here, 13 s at most): with the filesystem rebuilt on the worker without
# storage.retry_attempts, this fit fails with WorkerFailedError.
OUTAGE_S = 12.0
EPOCHS = 2


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto"), BUCKET, CREDENTIALS) as endpoint:
        yield endpoint


def _checkpoint_upload(method: str, target: str) -> bool:
    return method in ("PUT", "POST") and "/checkpoint_" in target


@pytest.mark.slow
def test_checkpoint_uploads_ride_out_an_s3_outage_and_stay_whole(
    manifest, s3_endpoint, monkeypatch
):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    # The shared Ray instance's workers started without these keys (a run's inherit them from
    # the driver, a cluster's nodes have their own), and moto stores an unsigned upload's
    # chunk framing as its content: here the filesystem carries them to the workers.
    keyed = functools.partial(
        RetryingS3FileSystem,
        access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    monkeypatch.setattr(storage, "RetryingS3FileSystem", keyed)
    with s3_outage(s3_endpoint, OUTAGE_S, starts_on=_checkpoint_upload) as outage:
        config = load_config(
            None,
            [
                "train.num_workers=1",
                f"train.max_epochs={EPOCHS}",
                f"train.checkpoint.num_to_keep={EPOCHS}",
                # Any failed upload fails the fit: nothing may be restarted to get through.
                "train.max_failures=0",
                f"storage.root=s3://{BUCKET}/outage",
                f"storage.endpoint_url={outage.endpoint}",
            ],
        )
        layout = StorageLayout.from_config(config)
        started = time.monotonic()
        outcome = train_final(config, manifest, "s3-outage", layout)
        took = time.monotonic() - started

        refused = [target for _, _, target, what in outage.requests if what == "refused"]
        assert refused, "the outage never hit a checkpoint upload"
        assert "/checkpoint_" in refused[0] and took > OUTAGE_S
        assert [row["epoch"] for row in outcome.history] == list(range(1, EPOCHS + 1))
        kept = [path for path, _ in outcome.kept_checkpoints]
        assert len(kept) == EPOCHS and all(p.startswith(f"s3://{BUCKET}/") for p in kept)
        epochs = sorted(load_checkpoint_state(config, path)["epoch"] for path in kept)
        assert epochs == list(range(1, EPOCHS + 1))
    # Ray never saw a failed attempt: one checkpoint directory per epoch, none half-written.
    fs, run_path = filesystem(outcome.run_path, s3_endpoint)
    names = {
        info.base_name
        for info in fs.get_file_info(_selector(run_path))
        if info.base_name.startswith("checkpoint_") and "manager" not in info.base_name
    }
    assert len(names) == EPOCHS, names


def _selector(path: str):
    import pyarrow.fs as pafs

    return pafs.FileSelector(path, recursive=False)
