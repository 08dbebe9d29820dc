"""The data room: input files in, preprocessed splits and their manifest out.

``inputs`` resolves and fingerprints the input files; ``schema`` checks their footers or CSV
headers on the driver; ``read`` holds the Ray Data readers; ``rows`` turns raw rows into
features, hashes and splits (shared with prediction); ``summary`` and ``validate`` decide from
one pass over the rows whether the data is usable and how to normalise it; ``preprocess`` is
the stage; ``diagnose`` names a file Ray cannot read; ``builtin`` and ``synthetic`` make data.
"""
