"""Ray's internals as trainflow needs them: patches, environment defaults, the early start.

Nothing here is API: ``training.platform`` is. Every reach into a Ray (or torch) private module
lives in this package, so a library upgrade has one place to look.
"""
