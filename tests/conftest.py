"""Shared fixtures: an isolated trainflow home per test session and one local Ray instance."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """One Ray authentication mode for every client and instance of the session, set before any
    test module imports Ray: Ray reads the mode once per process, so a test that joins a
    `ray start` cluster (token auth) after the mode was read as unset would be refused."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    # Nothing is downloaded in tests: a Hugging Face hub id must fail as it would offline.
    os.environ["HF_HUB_OFFLINE"] = "1"


# The modules that take most of the suite, longest first (worker-seconds on 2 cores from a
# fresh clone's --durations: from ~580 for the first down to ~40 for the last, a module counted
# with its RUNS_WITH partner).
# `make test` gives whole modules to two pytest workers in collection order
# (--no-loadscope-reorder); a long module that starts last runs alone while the other worker
# idles, which xdist's own reorder (most tests first) does to exactly these few-test modules.
# A module that shares another's session fixtures (RUNS_WITH) sits beside it: before it where it
# wants the fixture fresh (a cheap check on the two-node cluster before a test kills a node, the
# stack's operations before test_local_stack takes the stack down).
LONGEST_FIRST = (
    "tests/e2e/test_flow_kill_resume.py",
    "tests/integration/test_benchmarks_smoke.py",
    "tests/e2e/test_operations.py",
    "tests/e2e/test_local_stack.py",
    "tests/e2e/test_pipeline.py",
    "tests/e2e/test_mlflow_ui.py",
    "tests/multinode/test_custom_model_shipped.py",
    "tests/multinode/test_cluster.py",
    "tests/e2e/test_lightning_pipeline.py",
    "tests/e2e/test_tracking_outage_resume.py",
    "tests/e2e/test_prefect_blip.py",
    "tests/integration/test_deepspeed.py",
    "tests/integration/test_faults.py",
    "tests/e2e/test_function_engine_pipeline.py",
    "tests/e2e/test_custom_model_pipeline.py",
    "tests/e2e/test_table_pipeline.py",
    "tests/e2e/test_hf_text.py",
    "tests/e2e/test_hf_trainer.py",
    "tests/e2e/test_lm.py",
    "tests/e2e/test_image_folder_pipeline.py",
    "tests/e2e/test_text_pipeline.py",
    "tests/e2e/test_regression_pipeline.py",
    "tests/integration/test_training.py",
    "tests/integration/test_fsdp.py",
    "tests/integration/test_lm_parallel.py",
    "tests/integration/test_tracking_blip.py",
    "tests/integration/test_storage_outage.py",
    "tests/e2e/test_exposed_stack.py",
)


# Modules that use another module's session fixtures (its pipeline run, its servers, the
# two-node Ray cluster and S3 server): under `make test` they go to the worker that runs that
# module, in LONGEST_FIRST's order, so the fixture is made once (and two clusters never run at
# once beside each other).
RUNS_WITH = {
    "tests/e2e/test_mlflow_ui.py": "tests/e2e/test_pipeline.py",
    "tests/e2e/test_local_stack.py": "tests/e2e/test_operations.py",
    "tests/multinode/test_custom_model_shipped.py": "tests/multinode/test_cluster.py",
}


class RunsWithPartners(LoadFileScheduling):
    """`--dist loadfile`, with the modules of RUNS_WITH in their partner's work unit. (xdist's
    `--dist loadgroup` would do it with marks, but with pytest 9 its renaming of node ids has no
    effect any more: every test became a unit of its own.)"""

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return RUNS_WITH.get(module, module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return RunsWithPartners(config, log) if config.getvalue("dist") == "loadfile" else None


def _module_rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """Longest modules first (a stable sort: the rest keep their order); `scale` tests (10M
    rows, an hour on 2 cores) run only when `-m` names them (make bench)."""
    items.sort(key=_module_rank)
    if "scale" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="real-size data: select it with -m scale (make bench)")
    for item in items:
        if item.get_closest_marker("scale") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def trainflow_home(tmp_path_factory) -> Path:
    """Every test session writes under its own home, never the user's ./.trainflow."""
    home = tmp_path_factory.mktemp("trainflow-home")
    old = os.environ.get("TRAINFLOW_HOME")
    os.environ["TRAINFLOW_HOME"] = str(home)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    yield home
    if old is None:
        os.environ.pop("TRAINFLOW_HOME", None)
    else:
        os.environ["TRAINFLOW_HOME"] = old


@pytest.fixture(autouse=True)
def isolated_environment():
    """Whatever a test exports stays in that test.

    MLflow's set_tracking_uri/set_registry_uri and our S3 endpoint default write os.environ; left
    behind, they reach the servers and pipelines a later test starts in the same process (with
    two pytest workers, any test may come later).
    """
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(scope="module", autouse=True)
def isolated_module_environment():
    """The same for a module's own fixtures (a module-scoped champion loaded by a models:/ URI
    sets MLflow's URIs before the first test's copy of the environment is taken): restored when
    the module ends, MLflow's process-wide URIs too."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)
    if "mlflow" in sys.modules:
        from mlflow.tracking._model_registry import utils as registry_utils
        from mlflow.tracking._tracking_service import utils as tracking_utils

        tracking_utils._tracking_uri = None
        registry_utils._registry_uri = None


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance shared by the integration tests (4 logical CPUs on 2 cores)."""
    from training.config import RayConfig
    from training.platform.cluster import connect, shutdown

    resources = connect(RayConfig(num_cpus=4))
    yield resources
    shutdown()


# The preprocessed digits, once per module: shared by the integration and gpu tests.
@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """A storage root of the test module's own (runs of one module never meet another's)."""
    from training.storage import StorageLayout

    return StorageLayout(root=str(tmp_path_factory.mktemp("storage")))


@pytest.fixture(scope="module")
def manifest(ray_local, layout):
    """The default data, preprocessed once per module into ``layout``."""
    from training.config.overrides import load_config
    from training.data.inputs import fingerprint, resolve_inputs
    from training.data.preprocess import preprocess

    config = load_config(None)
    files = resolve_inputs(config.data)
    return preprocess(config, layout, fingerprint(config.data, files), files)
