"""The files of trainflow's MLflow model as they ship: an ``MLmodel`` that names no path of the
machine and moment it was built on.

``mlflow.pyfunc`` records where a model-as-code's entry script and each artifact came from
(``model_code_path``, ``artifacts.<name>.uri``): for trainflow those are files in a temporary
directory that is gone once the model is saved. MLflow loads the entry script by its file name
inside the model and an artifact by its ``path``, so both are rewritten to those.
"""

from __future__ import annotations

import os
from typing import Any

PYFUNC = "python_function"
MLMODEL = "MLmodel"
# How mlflow.pyfunc.log_model names a model logged as code (the logged model's flavour).
FLAVOUR_NAME = "pyfunc.ModelFromCode"


def without_build_paths(flavour_config: dict[str, Any]) -> dict[str, Any]:
    """The pyfunc flavour's configuration with paths inside the model instead of build paths."""
    config = dict(flavour_config)
    if config.get("model_code_path"):
        config["model_code_path"] = os.path.basename(config["model_code_path"])
    artifacts = config.get("artifacts")
    if artifacts:
        config["artifacts"] = {
            name: {**entry, "uri": entry["path"]} if "path" in entry else dict(entry)
            for name, entry in artifacts.items()
        }
    return config


def _make_portable(path: str, mlflow_model) -> None:
    mlflow_model.flavors[PYFUNC] = without_build_paths(mlflow_model.flavors[PYFUNC])
    mlflow_model.save(os.path.join(path, MLMODEL))


class PortablePyfunc:
    """``mlflow.pyfunc`` as the flavour ``mlflow.models.Model.log`` saves with: the same
    ``save_model``, followed by :func:`without_build_paths` on the ``MLmodel`` it wrote."""

    __name__ = "mlflow.pyfunc"

    @staticmethod
    def save_model(path: str, mlflow_model=None, **kwargs) -> None:
        import mlflow.pyfunc
        from mlflow.models import Model

        mlflow_model = mlflow_model if mlflow_model is not None else Model()
        mlflow.pyfunc.save_model(path, mlflow_model=mlflow_model, **kwargs)
        _make_portable(path, mlflow_model)


def save_model(path: str, **kwargs) -> str:
    """``mlflow.pyfunc.save_model`` into ``path``, its ``MLmodel`` free of build paths."""
    PortablePyfunc.save_model(path, **kwargs)
    return path


def log_model(name: str, **kwargs):
    """``mlflow.pyfunc.log_model`` (under the active run) as a logged model called ``name``,
    its ``MLmodel`` free of build paths."""
    from mlflow.models import Model

    return Model.log(
        artifact_path=None, name=name, flavor=PortablePyfunc, flavor_name=FLAVOUR_NAME, **kwargs
    )
