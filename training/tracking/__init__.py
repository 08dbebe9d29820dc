"""Tracking: everything trainflow writes to and reads from MLflow; the only room that imports it.

- ``store``: where the tracking store is, whether it answers, the experiment (:func:`configure`).
- ``runs``: :class:`Tracker`, the run tree of a pipeline run and what is logged to its runs.
- ``sweep_runs``: one run per Tune trial, and a sweep's trials read back (`trainflow compare`).
- ``flavour``: the model, shaped like MLflow's flavours: saved, logged and registered, found
  again by URI, loaded and scored (``signature``: its input example and schema).
- ``registry``: registered versions described and promoted: the aliases move under ``lock`` as
  the gate (``training.gate``, pure) decides.
- ``ui``: where a user looks (the MLflow UI's addresses).

Every call names its run explicitly through an :class:`mlflow.MlflowClient` (Prefect tasks run in
threads, so a process-global "active run" would be shared between them). Run tree of one pipeline
run (``<run_id>`` is the flow's run id)::

    pipeline-<run_id>                 tags trainflow.run_id, trainflow.stage=pipeline; params
      ├── <stage child runs>          tag trainflow.stage (preprocess, sweep, train, evaluate, ...)
      │     └── <one run per trial>   created by the Tune callback under the sweep run, renamed
      │                               "trial 03 · lr=0.0031" after the sweep (rename_run)
      └── ...

A re-run with the same ``run_id`` finds and resumes the same runs instead of creating new ones.
Nothing here runs at import time; mlflow itself is imported inside the functions that need it.
"""
