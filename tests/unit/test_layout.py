"""The shape of the house: who may import whom, no shadowed names, nothing runs at import time.

Static checks parse the sources with ``ast``; the runtime checks import modules in a fresh
subprocess so that this test session's own imports cannot hide or cause anything.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Imports run one way: a package may import only packages to its right.
LAYERS = ["trainflow", "deployments", "flows", "tasks", "training"]
RANK = {name: rank for rank, name in enumerate(LAYERS)}

# Modules that must exist now; other modules are checked as soon as they exist.
REQUIRED = [
    "training.config",
    "training.config.schema",
    "training.config.capacity",
    "training.config.dotted",
    "training.config.overrides",
    "training.config.search_space",
    "training.errors",
    "training.storage",
    "training.platform",
    "training.platform.cluster",
    "training.platform.signals",
    "training.platform._internal.early_start",
    "training.platform._internal.patches",
    "training.manifest",
    "training.summary",
    "training.report.plots",
    "training.report.sweep_plots",
    "training.report.trials",
    "training.report.html",
    "training.report.markdown",
    "training.gate.policy",
    "training.gate.stats",
    "training.tune.trials",
    "training.data.splits",
    "training.stages.preprocess",
    "training.stages.sweep",
    "training.stages.train",
    "training.stages.evaluate",
    "training.stages.promote",
]
# The modules a Ray worker imports: none of them may pull in prefect.
WORKER_MODULES = [
    "training.config",
    "training.config.capacity",
    "training.data.rows",
    "training.data.read",
    "training.data.summary",
    "training.loop.loop",  # train_loop_per_worker; Tune function trials run it too
    "training.loop.contexts",
    "training.loop.checkpoint",
    "training.loop.trainer",  # a multi-worker trial builds its TorchTrainer on a worker
    "training.model.networks",
    "training.tracking.flavour",  # the model loaded in a scoring actor
    "training.inference.predictor",  # the Ray Data actor that scores batches
    "training.tune.sweep",  # the trial functions
    "training.storage",
]
# The bottom of training/ (modules, or packages with every module in them): they import nothing
# of ours but each other.
TRAINING_BOTTOM = {
    "training.config",  # the package: every module in it
    "training.errors",
    "training.storage",
    "training.storage_s3",
    "training.metrics",
    "training.platform.secrets",
    "training.platform.probe",
    "training.platform.fast_start",
}
# The one package that may import mlflow (any module under it).
MLFLOW_HOME = "training.tracking"
# The gate's policy decides without a server: it imports nothing of ours but the bottom and itself.
GATE = "training.gate"
GATE_MODULES = ["training.gate.policy", "training.gate.stats", "training.gate.drift"]
# The registered model's own code, shipped inside every MLflow model (code_paths): it subclasses
# mlflow.pyfunc.PythonModel, so it imports mlflow too, and it must load where trainflow is not
# installed: nothing but the standard library, these packages and its own modules.
SHIPPED = "training.model.trainflow_pyfunc"
# A text model's network and tokens step (hf.py, tokens.py) need transformers and tokenizers,
# imported where they are used: a table's or an image's model loads without them.
SHIPPED_MAY_IMPORT = {"torch", "numpy", "pandas", "mlflow", "transformers", "tokenizers"}
#: Beyond those, per file: Pillow for the image decode only (image models pin it).
SHIPPED_FILE_MAY_IMPORT = {"images.py": {"PIL"}}

# The stages sit at the top of training/: each uses the rooms below (data, tune, loop, inference,
# model, tracking, report) and none of them uses a stage; only tasks/ calls them.
STAGES = "training.stages"

SUBPROCESS_TIMEOUT_S = 300


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(package: str) -> list[Path]:
    return sorted(p for p in (REPO_ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def all_modules() -> list[str]:
    """Every importable module of the five packages (``__main__`` runs the CLI: left out)."""
    names = []
    for package in LAYERS:
        for path in package_files(package):
            if path.stem != "__main__":
                names.append(module_name(path))
    return names


def imported_modules(path: Path) -> set[str]:
    return imports_of(path.read_text(), module_name(path), path.stem == "__init__")


def imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of every module an import statement in the source refers to.

    Imports inside functions and ``if TYPE_CHECKING:`` count too: they are still dependencies.
    """
    tree = ast.parse(source)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            # `from pkg import sub` may import the submodule pkg.sub.
            names.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return {name for name in names if name}


def top(name: str) -> str:
    return name.split(".")[0]


def in_bottom(name: str) -> bool:
    """``name`` is a bottom module, or a module inside a bottom package."""
    parts = name.split(".")
    return any(".".join(parts[:n]) in TRAINING_BOTTOM for n in range(2, len(parts) + 1))


def run_python(code: str, cwd: Path, env: dict[str, str] | None = None) -> dict:
    """Run code in a fresh interpreter of this venv; it prints one JSON object as its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINFLOW_", "MLFLOW_", "RAY_ADDRESS", "PREFECT_"))
    }
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.update(extra)
    return env


def exists(module: str) -> bool:
    base = REPO_ROOT / Path(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


_IMPORT_SCRIPT = """
import importlib, json, sys, traceback
failed = {}
for name in MODULES:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = {
            "missing": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
            "message": str(exc),
            "traceback": traceback.format_exc(limit=4),
        }
ray_initialized = None
if "ray" in sys.modules:
    import ray
    ray_initialized = ray.is_initialized()
tracking_uri_set = None
if "mlflow" in sys.modules:
    from mlflow.tracking._tracking_service import utils
    if hasattr(utils, "is_tracking_uri_set"):
        tracking_uri_set = utils.is_tracking_uri_set()
print(json.dumps({
    "failed": failed,
    "prefect": sorted(m for m in sys.modules if m.split(".")[0] == "prefect"),
    "ray_initialized": ray_initialized,
    "tracking_uri_set": tracking_uri_set,
}))
"""


def import_in_subprocess(modules: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """Import each module in a fresh interpreter; report failures and what got loaded."""
    return run_python(f"MODULES = {modules!r}\n{_IMPORT_SCRIPT}", cwd=cwd, env=env)


def _unwritten_dependency(failure: dict) -> str | None:
    """The module of ours, not on disk yet, whose absence made an import fail (else None)."""
    candidates = []
    if failure["missing"]:
        candidates.append(failure["missing"])
    match = re.search(r"cannot import name '(\w+)' from '([\w.]+)'", failure["message"])
    if match:
        candidates.append(f"{match.group(2)}.{match.group(1)}")
    for candidate in candidates:
        if top(candidate) in RANK and not exists(candidate):
            return candidate
    return None


def check_imports(result: dict, required: list[str]) -> list[str]:
    """Fail on broken imports; tolerate (with a warning) modules that need an unwritten module.

    Other engineers write the modules one by one: `tasks/stages.py` may import `training/data.py`
    before it exists. A required module must import in any case.
    """
    broken, pending = [], []
    for name, failure in result["failed"].items():
        dependency = _unwritten_dependency(failure)
        if dependency and name not in required:
            pending.append(f"{name} (needs {dependency}, not written yet)")
        else:
            broken.append(f"{name}:\n{failure['traceback']}")
    assert not broken, "modules failed to import:\n" + "\n".join(broken)
    if pending:
        warnings.warn(f"not checked, waiting for other modules: {pending}", stacklevel=2)
    return pending


# --- the required modules -----------------------------------------------------------------------


@pytest.mark.parametrize("module", REQUIRED)
def test_required_module_exists(module):
    assert exists(module), f"{module} is required: {module.replace('.', '/')}.py is missing"


# --- (a) training never imports prefect; only training/tracking/ imports mlflow ------------


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def may_import_mlflow(module: str) -> bool:
    if in_package(module, SHIPPED):
        return True
    return in_package(module, MLFLOW_HOME)


@pytest.mark.parametrize(
    "path", package_files("training"), ids=lambda p: str(p.relative_to(REPO_ROOT / "training"))
)
def test_training_imports_neither_prefect_nor_mlflow(path):
    tops = {top(name) for name in imported_modules(path)}
    assert "prefect" not in tops, f"{path.name} imports prefect; training/ must run on any worker"
    if not may_import_mlflow(module_name(path)):
        assert "mlflow" not in tops, (
            f"{path.name} imports mlflow; only training/tracking/ may (keep MLflow in one place)"
        )


def test_the_mlflow_home_is_drawn_tight():
    assert may_import_mlflow("training.tracking.registry")
    assert not may_import_mlflow("training.gate.policy")
    assert not may_import_mlflow("training.gate.stats")
    assert not may_import_mlflow("training.trackingx")
    assert not may_import_mlflow("training.data")
    assert may_import_mlflow("training.model.trainflow_pyfunc.model")
    assert not may_import_mlflow("training.model.networks")
    assert not may_import_mlflow("training.model.trainflow_pyfunc_extra")


@pytest.mark.parametrize("module", GATE_MODULES)
def test_the_gate_imports_only_the_bottom(module):
    """The gate is pure: nothing of ours but the bottom and the gate's own modules (tracking,
    which imports mlflow, uses the gate, never the other way)."""
    assert exists(module), f"{module} moved? update GATE_MODULES"
    path = REPO_ROOT / Path(*module.split(".")).with_suffix(".py")
    ours = {name for name in imported_modules(path) if top(name) in RANK}
    outside = sorted(n for n in ours if not in_bottom(n) and not in_package(n, GATE))
    assert not outside, f"{module} must decide without a server, yet imports {outside}"


def test_worker_modules_do_not_pull_in_prefect(tmp_path):
    # A renamed or moved worker module must fail here, not drop out of the check.
    missing = [m for m in WORKER_MODULES if not exists(m)]
    assert not missing, f"worker modules missing (moved? update WORKER_MODULES): {missing}"
    # Every training module, not only the worker ones: none may pull prefect in, even indirectly.
    modules = sorted(set(WORKER_MODULES) | {m for m in all_modules() if top(m) == "training"})
    result = import_in_subprocess(
        modules,
        cwd=tmp_path,
        env=clean_env(TRAINFLOW_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "ph")),
    )
    check_imports(result, [*REQUIRED, *WORKER_MODULES])
    assert result["prefect"] == [], f"importing {modules} loaded {result['prefect'][:5]}"


# --- (b) generic package names resolve inside this repo -----------------------------------------


def _origins_in(cwd: Path) -> dict[str, str | None]:
    return run_python(
        f"""
        import importlib.util, json
        out = {{}}
        for name in {LAYERS!r}:
            spec = importlib.util.find_spec(name)
            out[name] = spec.origin if spec else None
        print(json.dumps(out))
        """,
        cwd=cwd,
        env=clean_env(),
    )


def _assert_inside_repo(origins: dict[str, str | None], where: str) -> None:
    for name, origin in origins.items():
        assert origin is not None, f"{name} cannot be found {where}; run `make setup`"
        resolved = Path(origin).resolve()
        assert resolved.is_relative_to(REPO_ROOT), (
            f"`import {name}` {where} resolves to {resolved}, outside {REPO_ROOT}: another "
            "package shadows it"
        )
        assert resolved == (REPO_ROOT / name / "__init__.py").resolve()


def test_packages_resolve_inside_the_repo_in_this_session():
    import importlib.util

    origins = {}
    for name in LAYERS:
        spec = importlib.util.find_spec(name)
        origins[name] = spec.origin if spec else None
    _assert_inside_repo(origins, "in the test session")


def test_packages_resolve_inside_the_repo_from_elsewhere(tmp_path):
    """What a user gets running .venv/bin/trainflow from any directory (the editable install)."""
    _assert_inside_repo(_origins_in(tmp_path), f"from {tmp_path}")


# --- (c) imports run one way: trainflow -> deployments -> flows -> tasks -> training ----------


def _layer_violations() -> list[str]:
    violations = []
    for package in LAYERS:
        for path in package_files(package):
            for name in sorted(imported_modules(path)):
                target = top(name)
                if target in RANK and RANK[target] < RANK[package]:
                    where = path.relative_to(REPO_ROOT)
                    violations.append(f"{where} imports {name} ({package} is below {target})")
    return violations


def test_imports_run_one_way():
    violations = _layer_violations()
    assert not violations, (
        "imports must run trainflow -> deployments -> flows -> tasks -> training:\n"
        + "\n".join(violations)
    )


def test_bottom_of_training_imports_only_the_bottom():
    violations = []
    for path in package_files("training"):
        module = module_name(path)
        if not in_bottom(module):
            continue
        for name in imported_modules(path):
            if top(name) != "training" or name == "training":
                continue
            if not in_bottom(name):
                violations.append(f"{module} imports {name}")
    assert not violations, (
        f"{sorted(TRAINING_BOTTOM)} sit at the bottom of training/ and import only each other: "
        + "; ".join(violations)
    )


def test_stages_sit_at_the_top_of_training():
    violations = []
    for path in package_files("training"):
        module = module_name(path)
        if in_package(module, STAGES):
            continue
        violations += [
            f"{module} imports {name}"
            for name in imported_modules(path)
            if in_package(name, STAGES)
        ]
    assert not violations, f"{STAGES} is the top of training/; nothing below imports it: " + (
        "; ".join(violations)
    )


def test_tasks_call_training_through_the_stages():
    """A task is a decorator and one call: what it calls is a stage, not the rooms below."""
    allowed = {
        STAGES,
        "training.config",
        "training.manifest",
        "training.storage",
        "training.summary",
        "training.tune.outcome",
        "training.errors",
    }
    found = []
    for path in package_files("tasks"):
        for name in imported_modules(path):
            if top(name) == "training" and not any(in_package(name, a) for a in allowed):
                found.append(f"{module_name(path)} imports {name}")
    assert not found, "tasks/ reaches past training.stages: " + "; ".join(found)


def test_the_import_checker_resolves_every_form():
    """The ast check itself: relative, absolute and function-local imports all count."""
    source = textwrap.dedent(
        """
        from . import sibling
        from .helpers import retry
        import training.loop as loop
        def later():
            from flows.pipeline import pipeline
        """
    )
    names = imports_of(source, "tasks.stage", is_package=False)
    assert {"tasks.sibling", "tasks.helpers", "training.loop", "flows.pipeline"} <= names
    assert "tasks" in imports_of("from . import stage\n", "tasks", is_package=True)


# --- (d) nothing runs at import time ------------------------------------------------------------


def test_importing_every_module_has_no_side_effects(tmp_path):
    home = tmp_path / "home"  # must not be created
    cwd = tmp_path / "cwd"  # must stay empty (no ./.trainflow, ./mlruns, ./mlflow.db)
    cwd.mkdir()
    modules = all_modules()
    missing = [m for m in REQUIRED if m not in modules]
    assert not missing, f"required modules missing: {missing}"
    result = import_in_subprocess(
        modules,
        cwd=cwd,
        # Prefect creates its home when imported: keep that out of the user's ~/.prefect and out of
        # the directories checked here.
        env=clean_env(TRAINFLOW_HOME=str(home), PREFECT_HOME=str(tmp_path / "prefect-home")),
    )
    check_imports(result, REQUIRED)
    assert not home.exists(), f"importing created the trainflow home: {sorted(home.rglob('*'))}"
    assert sorted(p.name for p in cwd.iterdir()) == [], "importing wrote into the working directory"
    assert result["ray_initialized"] in (None, False), "a module calls ray.init at import time"
    assert result["tracking_uri_set"] in (None, False), (
        "a module calls mlflow.set_tracking_uri at import time"
    )
