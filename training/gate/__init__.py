"""The promotion gate's policy: whether a candidate beats the champion on the same rows.

Pure decisions over metrics, paired resamples and drift figures; no MLflow and no I/O, so that
the rule can be read and tested alone. ``training.tracking`` reads and writes what it decides.
"""
