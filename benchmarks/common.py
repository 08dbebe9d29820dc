"""Pipeline-specific helpers shared by the benchmarks: context, Ray, data at scale, configs.

Everything heavy (ray, torch, training.data) is imported inside functions: importing the
``benchmarks`` package stays cheap, so the CLI can list benchmarks and render the docs table
without starting anything.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DIGITS_ROWS = 1797


@dataclass
class Context:
    """What a benchmark's ``run(ctx)`` gets: size mode, repetitions, scratch and shared dirs."""

    smoke: bool
    workdir: Path
    out_dir: Path
    selection: list[str] = field(default_factory=list)
    suite_id: str = ""
    shared_dir: Path | None = None
    reps_override: int | None = None

    def pick(self, full: Any, smoke: Any) -> Any:
        """The full-run value or the smoke value of a size."""
        return smoke if self.smoke else full

    def reps(self, full: int = 3, smoke: int = 1) -> int:
        if self.reps_override is not None:
            return self.reps_override
        return self.pick(full, smoke)

    def scratch(self, name: str) -> Path:
        """A fresh directory under the work dir (never reused: a preprocess cache must miss)."""
        path = self.workdir / f"{name}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path


def configure_process(home: Path) -> None:
    """Point trainflow at a private home and keep every service quiet and offline."""
    home.mkdir(parents=True, exist_ok=True)
    os.environ["TRAINFLOW_HOME"] = str(home)
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS"):
        os.environ.pop(key, None)
    os.environ["PREFECT_HOME"] = str(home / "prefect")
    from trainflow.env import prepare_environment

    prepare_environment()
    from training.platform.cluster import ray_env

    for key, value in ray_env().items():
        os.environ.setdefault(key, value)


def start_ray(num_cpus: int = 4, py_modules: list[str] | None = None) -> dict[str, float]:
    """The local Ray instance the pipeline would start (``training.platform.cluster.connect``),
    with ``py_modules`` (a user's packages, as the pipeline ships them) on every worker."""
    from training.config import RayConfig
    from training.platform.cluster import connect

    started = time.perf_counter()
    resources = connect(RayConfig(num_cpus=num_cpus), py_modules=py_modules)
    resources = dict(resources)
    resources["_start_s"] = round(time.perf_counter() - started, 2)
    return resources


def stop_ray() -> None:
    from training.platform.cluster import shutdown

    shutdown()


def register_by_value(module_name: str) -> None:
    """Ship a benchmark module's functions to Ray workers by value (workers may not import it)."""
    import ray.cloudpickle as cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module_name])


# ---------------------------------------------------------------------------------------------
# Data


def digits_file() -> str:
    """The default data: scikit-learn's 1,797 digits as parquet under the trainflow home."""
    from training.data.builtin import ensure_digits
    from training.storage import trainflow_home

    return ensure_digits(trainflow_home())


def tabular_digits(directory: Path, scale: int, seed: int = 0) -> str:
    """``scale`` x the default data: digits-like 8x8 rows (tiled, jittered, noisy), same columns.

    1x is the real digits file; larger scales are generated (``training.datasets.synthetic``),
    two files from 10x on so that a parallel reader has one file per core.
    """
    if scale == 1:
        return digits_file()
    from training.datasets.synthetic import write_synthetic

    target = directory / f"digits-x{scale}"
    if not target.exists():
        write_synthetic(
            target,
            DIGITS_ROWS * scale,
            seed,
            side=8,
            tabular=True,
            num_files=2 if scale >= 10 else 1,
        )
    return str(target)


def image_data(directory: Path, rows: int, side: int = 28, seed: int = 0, files: int = 4) -> str:
    """``rows`` generated ``side`` x ``side`` images (column ``image``), in ``files`` files."""
    from training.datasets.synthetic import write_synthetic

    target = directory / f"images-{rows}x{side}"
    if not target.exists():
        write_synthetic(target, rows, seed, side=side, num_files=files)
    return str(target)


def table_data(directory: Path, rows: int, seed: int = 0, files: int = 16) -> str:
    """``rows`` x 64 float32 features with a learnable label (``trainflow make-data``'s table)."""
    from training.datasets.synthetic import write_table

    target = directory / f"table-{rows}-s{seed}-f{files}"
    if not target.exists():
        write_table(target, rows, seed, num_files=files)
    return str(target)


def make_config(overrides: dict[str, Any] | None = None):
    """The schema defaults plus dotted overrides, validated like ``--set``."""
    from training.config import PipelineConfig

    return PipelineConfig().with_overrides(overrides or {})


def source_config(source: str, overrides: dict[str, Any] | None = None):
    return make_config({"data.source": source, **(overrides or {})})


def fresh_preprocess(config, root: Path):
    """Run the preprocessing stage into an empty storage root: (manifest, seconds, layout)."""
    from training.data.inputs import fingerprint, resolve_inputs
    from training.data.preprocess import preprocess
    from training.storage import StorageLayout

    layout = StorageLayout(root=str(root))
    files = resolve_inputs(config.data)
    digest = fingerprint(config.data, files)
    started = time.perf_counter()
    manifest = preprocess(config, layout, digest, files)
    return manifest, time.perf_counter() - started, layout


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def object_store_gauge():
    """A function returning the bytes in Ray's object store now (None if it cannot tell)."""
    import ray
    from ray._private import internal_api

    try:
        state = internal_api.get_state_from_address(ray.get_runtime_context().gcs_address)
    except Exception:
        return lambda: None

    def used() -> float | None:
        reply = internal_api.get_memory_info_reply(state, timeout_seconds=5)
        return float(reply.store_stats.object_store_bytes_used)

    return used
