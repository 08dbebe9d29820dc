"""Data sets made for tests, benchmarks and `trainflow datasets`: the bundled ones scaled up
(digits as wide tables of any size, a mixed table with categories, gaps and dates, topic texts,
image folders), written in chunks locally or to S3. Nothing in a run reads from here: a run
reads files, and ``training.data.builtin`` for the bundled sets themselves.
"""
