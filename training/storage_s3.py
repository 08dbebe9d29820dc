"""The S3 filesystem of every trainflow path: pyarrow's, with a retry budget that reaches the
Ray workers it is shipped to.

pyarrow retries a failed S3 request itself (the AWS SDK's standard strategy: a 503 SlowDown,
a dropped connection or a timeout is tried again after a random wait of up to 1 s, 2 s, 4 s,
... at most 20 s each). But ``S3FileSystem.__reduce__`` leaves its ``retry_strategy`` out, so
the filesystem Ray Train and Tune pickle to their workers (``storage_filesystem``) and Ray Data
to its write tasks was rebuilt with pyarrow's default of 3 attempts (at most 3 s of waiting):
with Ray Train's own 3 tries of an upload, an outage longer than ~5-13 s failed the checkpoint
upload, and the worker group restarted (or the fit failed). This class
pickles the number of attempts with the rest; the credentials stay where pyarrow keeps them
(never pickled unless given explicitly, which trainflow never does).
"""

from __future__ import annotations

import pyarrow.fs as pafs

#: pyarrow's own default: what a quick check (does the manifest exist?) gets, so that a store
#: that is not there at all fails the run within seconds, as it always has.
QUICK_ATTEMPTS = 3


class RetryingS3FileSystem(pafs.S3FileSystem):
    """``pyarrow.fs.S3FileSystem`` with ``retry_attempts`` tries per request (the AWS standard
    strategy's exponential back-off), on this process and on every process it is pickled to."""

    def __init__(self, retry_attempts: int = QUICK_ATTEMPTS, **options) -> None:
        strategy = pafs.AwsStandardS3RetryStrategy(max_attempts=retry_attempts)
        super().__init__(retry_strategy=strategy, **options)
        self.retry_attempts = retry_attempts

    def __reduce__(self):
        _, (options,) = super().__reduce__()
        return _rebuilt, (self.retry_attempts, options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(retry_attempts={self.retry_attempts})"


def _rebuilt(retry_attempts: int, options: dict) -> RetryingS3FileSystem:
    return RetryingS3FileSystem(retry_attempts=retry_attempts, **options)
