"""The registered model's shipped code (training/model/trainflow_pyfunc, the model's
``code_paths``): it imports only the standard library, torch, numpy, pandas and mlflow, and it
imports alone outside the repository (see test_layout for the rest of the house)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_layout import (
    LAYERS,
    REPO_ROOT,
    SHIPPED,
    SHIPPED_FILE_MAY_IMPORT,
    SHIPPED_MAY_IMPORT,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    package_files,
    top,
)


@pytest.mark.parametrize("path", package_files(SHIPPED.replace(".", "/")), ids=lambda p: p.name)
def test_shipped_model_code_imports_only_what_the_model_requires(path):
    """Every import of the shipped package: stdlib, torch/numpy/pandas/mlflow (Pillow in the
    image decode), or a relative import of a sibling (it is the top-level package
    ``trainflow_pyfunc`` inside the model)."""
    tree = ast.parse(path.read_text())
    allowed = SHIPPED_MAY_IMPORT | SHIPPED_FILE_MAY_IMPORT.get(path.name, set())
    outside = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            continue  # a sibling in the shipped package
        names = (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            root = top(name)
            if root not in allowed and root not in sys.stdlib_module_names:
                outside.append(name)
    assert not outside, f"{path.name} imports {outside}: the model must load without trainflow"


def test_shipped_model_code_imports_alone(tmp_path):
    """The package copied out of the repo imports as ``trainflow_pyfunc`` with ``training``
    unimportable (what mlflow.pyfunc.load_model does with the model's code directory)."""
    import shutil
    import site

    shutil.copytree(
        REPO_ROOT / SHIPPED.replace(".", "/"),
        tmp_path / "trainflow_pyfunc",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)] + [str(tmp_path)]
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            textwrap.dedent(
                f"""
            import importlib.util, json, sys
            sys.path[:0] = {dirs!r}
            assert importlib.util.find_spec("training") is None
            import trainflow_pyfunc.model
            print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {set(LAYERS)!r})))
            """
            ),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
