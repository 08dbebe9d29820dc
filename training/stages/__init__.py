"""The stages: preprocess, sweep, train, evaluate, promote.

Each module is one stage as a plain function, from typed inputs to a typed outcome; it does the
stage's work (through ``data``, ``tune``, ``loop``, ``inference``) and its own MLflow
bookkeeping (through ``tracking``). A Prefect task wraps each one with retries and caching
(``tasks/stages.py``); the flow keeps their order.
"""
