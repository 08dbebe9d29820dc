"""The sweep's search space: config's search domains as Ray Tune domains."""

from __future__ import annotations

from typing import Any

from training.config import SearchDomain, SweepConfig


def tune_domain(domain: SearchDomain):
    """The Ray Tune domain for one of config's search domains."""
    from ray import tune

    if domain.loguniform is not None:
        return tune.loguniform(*domain.loguniform)
    if domain.uniform is not None:
        return tune.uniform(*domain.uniform)
    if domain.randint is not None:
        return tune.randint(*domain.randint)
    return tune.choice(list(domain.choice))


def param_space(sweep: SweepConfig) -> dict[str, Any]:
    """Flat dict of dotted config paths -> Tune domains (the same keys land in MLflow params)."""
    return {key: tune_domain(domain) for key, domain in sweep.search_space.items()}
