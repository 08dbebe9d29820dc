"""B12: the user's own training code under trainflow vs the same code under a bare
``TorchTrainer``, per epoch.

Two pairs, alternated in one run over the same Ray Data datasets (the digits, tiled by
``tabular_digits``, preprocessed by trainflow's Ray Data stage and put in the object store as
``build_trainer`` puts them):

- ``train.engine: function``: examples/your_loop's ``train_func`` through trainflow's
  ``build_trainer`` (its TorchTrainer, ingest options, run config and report contract) against
  the same function passed straight to ``ray.train.torch.TorchTrainer`` with the same config dict.
- ``train.engine: lightning``: examples/lightning's module through trainflow's Lightning worker
  against a worker written as the Ray Train Lightning guide writes it (``RayDDPStrategy``,
  ``RayLightningEnvironment``, ``RayTrainReportCallback``, ``prepare_trainer``) with the Trainer
  knobs trainflow sets (no logger, no progress bar, no sanity pass), so the pair differs only in
  the wrapper.

Both arms of a pair are timed alike: a wrapper around the worker stamps each ``ray.train.report``
(one per epoch, after validation); steady state is the train rows of the epochs after the first
over the time from the first report to the last. 2 workers x 1 thread on CPUs, 1 worker on a GPU.
"""

from __future__ import annotations

import functools
import sys
import time
import uuid
from types import SimpleNamespace
from typing import Any

from benchmarks import harness as h
from benchmarks.common import (
    REPO_ROOT,
    Context,
    fresh_preprocess,
    register_by_value,
    source_config,
    start_ray,
    tabular_digits,
)

ID = "B12"
TITLE = "user code per epoch: function and Lightning engines vs a bare TorchTrainer"
TIMEOUT_S = (1800, 420)
EXAMPLES = (REPO_ROOT / "examples" / "your_loop", REPO_ROOT / "examples" / "lightning")
FUNCTION = "my_loop.train:train_func"
ENGINES = ("function", "lightning")
_BARE = {
    "function": "the same function under a bare TorchTrainer (same shards)",
    "lightning": "the same module under a bare Ray-Lightning TorchTrainer (Ray's guide)",
}
FIGURES = [
    *(
        h.FigureSpec(
            ID,
            f"ratio_{engine}",
            f"samples/s per epoch, train.engine {engine} ÷ bare TorchTrainer (steady state)",
            ">= 0.95",
            _BARE[engine],
        )
        for engine in ENGINES
    ),
    *(
        h.FigureSpec(ID, f"sps_{arm}_{engine}", f"{arm} {engine}, steady samples/s", "—", "—")
        for engine in ENGINES
        for arm in ("trainflow", "bare")
    ),
]


# ---------------------------------------------------------------------------------------------
# On the workers


def _stamped_worker(config: dict[str, Any], worker, threads: int) -> dict[str, Any]:
    """``train_loop_per_worker``: ``worker(config)`` with the time of every ``ray.train.report``
    recorded. The user's code (and Ray's Lightning callback) looks ``ray.train.report`` up at
    each call, so replacing the module attribute catches every report of both arms alike."""
    import ray.train
    import torch

    torch.set_num_threads(threads)
    stamps: list[float] = []
    report = ray.train.report

    def stamped_report(*args, **kwargs):
        stamps.append(time.time())  # the epoch's training and validation are done
        return report(*args, **kwargs)

    ray.train.report = stamped_report
    try:
        worker(config)
    finally:
        ray.train.report = report
    return {"reports": stamps, "world_size": ray.train.get_context().get_world_size()}


class _TupleBatches:
    """A shard as the ``(features, label)`` batches the module's steps unpack; one pass per
    epoch (the Ray guide's ``iter_torch_batches``, adapted to the module's batch shape)."""

    def __init__(self, shard, batch_size: int) -> None:
        self.shard, self.batch_size = shard, batch_size

    def __iter__(self):
        for batch in self.shard.iter_torch_batches(batch_size=self.batch_size):
            yield batch["features"], batch["label"]


def _bare_lightning_worker(config: dict[str, Any]) -> None:
    """The Ray Train Lightning guide's ``train_func`` for examples/lightning's module."""
    import lightning.pytorch as pl
    import ray.train
    from my_lightning.module import build
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    pl.seed_everything(config["seed"], workers=True, verbose=False)
    module = build(SimpleNamespace(**config["spec"]), **config["params"])
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        # The knobs trainflow sets too: without them the bare arm would pay for a logger.
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer = prepare_trainer(trainer)
    per_worker = max(1, config["batch_size"] // ray.train.get_context().get_world_size())
    train = _TupleBatches(ray.train.get_dataset_shard("train"), per_worker)
    val = _TupleBatches(ray.train.get_dataset_shard("val"), per_worker)
    trainer.fit(module, train_dataloaders=train, val_dataloaders=val)


# ---------------------------------------------------------------------------------------------
# In the driver


def _steady(out: dict[str, Any], train_rows: int) -> dict[str, Any]:
    """Samples/s over the epochs after the first (every arm sees all train rows per epoch)."""
    reports = out["reports"]
    if len(reports) < 2:
        raise RuntimeError(f"steady state needs at least 2 epochs; got {len(reports)} reports")
    seconds = reports[-1] - reports[0]
    return {
        "samples_per_s": train_rows * (len(reports) - 1) / seconds,
        "steady_s": seconds,
        "epoch_s": [b - a for a, b in zip(reports, reports[1:], strict=False)],
        "epochs": len(reports),
        "world_size": out["world_size"],
    }


def _trainflow_arm(config, manifest, storage: str, workers: int):
    """trainflow's path for the engine: ``build_trainer`` with the engine's worker and the
    report contract ``train_final`` adds, the worker wrapped only to stamp the reports."""

    def run(rep: int) -> dict[str, Any]:
        from training.loop.function_engine import function_worker
        from training.loop.lightning_engine import lightning_worker
        from training.loop.trainer import build_trainer, function_callbacks

        engine = config.train.engine
        worker = function_worker if engine == "function" else lightning_worker
        started = time.time()
        trainer = build_trainer(
            config,
            manifest,
            name=f"b12-{engine}-{rep}-{uuid.uuid4().hex[:6]}",
            storage_path=storage,
            num_workers=workers,
            callbacks=function_callbacks(config),
            train_fn=functools.partial(_stamped_worker, worker=worker, threads=1),
        )
        out = trainer.fit().return_value
        return {**_steady(out, manifest.rows["train"]), "total_s": time.time() - started}

    return run


def _bare_arm(manifest, storage: str, workers: int, use_gpu: bool, worker, loop_config):
    """Ray's own ``TorchTrainer`` with defaults, given the same datasets trainflow builds."""

    def run(rep: int) -> dict[str, Any]:
        import ray.train
        from ray.train.torch import TorchTrainer

        from training.loop.ingest import training_datasets

        started = time.time()
        trainer = TorchTrainer(
            train_loop_per_worker=functools.partial(_stamped_worker, worker=worker, threads=1),
            train_loop_config=loop_config,
            scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=use_gpu),
            datasets=training_datasets(manifest),
            run_config=ray.train.RunConfig(
                name=f"b12-bare-{rep}-{uuid.uuid4().hex[:6]}", storage_path=storage
            ),
        )
        out = trainer.fit().return_value
        return {**_steady(out, manifest.rows["train"]), "total_s": time.time() - started}

    return run


def _configs(source: str, epochs: int, use_gpu: bool) -> dict[str, Any]:
    """The pipeline config of each engine, as examples/your_loop and examples/lightning set it."""
    common = {
        "model.kind": "custom",
        "train.max_epochs": epochs,
        "train.max_failures": 0,
        "train.checkpoint.num_to_keep": 1,
        "train.use_gpu": use_gpu,
        # No sweep runs here; the default space sweeps keys a LightningModule does not read.
        "sweep.search_space": {},
    }
    return {
        "function": source_config(
            source,
            {
                **common,
                "model.factory": "my_loop.nets:build",
                "model.params": {"width": 64},
                "train.engine": "function",
                "train.function": FUNCTION,
            },
        ),
        "lightning": source_config(
            source,
            {
                **common,
                "model.factory": "my_lightning.module:build",
                "model.params": {"width": 64, "lr": 3e-3},
                "train.engine": "lightning",
            },
        ),
    }


def _bare_lightning_config(config, spec, epochs: int) -> dict[str, Any]:
    """What the guide's worker needs: the module's keywords, its spec, batch, epochs, seed."""
    return {
        "params": dict(config.model.params),
        "spec": {"input_shape": list(spec.input_shape), "num_outputs": spec.num_outputs},
        "batch_size": config.train.batch_size,
        "max_epochs": epochs,
        "seed": config.train.seed,
    }


def _figures(samples: dict[str, list[dict[str, Any]]]) -> list[h.Figure]:
    figures = []
    for engine in ENGINES:
        ours = h.pluck(samples[f"trainflow_{engine}"], "samples_per_s")
        bare = h.pluck(samples[f"bare_{engine}"], "samples_per_s")
        spec = next(s for s in FIGURES if s.key == f"ratio_{engine}")
        figures.append(
            h.Figure(
                spec.key,
                spec.name,
                "x",
                h.paired_ratios(ours, bare),
                anchor=spec.anchor,
                target=h.Target(">=", 0.95, ">= 0.95"),
            )
        )
        for arm, values in (("trainflow", ours), ("bare", bare)):
            name = f"{arm} {engine}, steady samples/s"
            figures.append(h.Figure(f"sps_{arm}_{engine}", name, "samples/s", values))
    return figures


def run(ctx: Context) -> h.Outcome:
    import torch

    from training.model.factory import ship_paths

    for example in EXAMPLES:  # the driver imports the examples' packages as their users do
        sys.path.insert(0, str(example))
    from my_loop.train import train_func

    register_by_value(__name__)
    scale = ctx.pick(10, 1)
    epochs = ctx.pick(5, 2)
    reps = ctx.reps(3, 1)
    use_gpu = torch.cuda.is_available()
    # Two CPU workers measure DDP; the smoke proves the four arms run, on one worker each.
    workers = 1 if use_gpu else ctx.pick(2, 1)
    source = tabular_digits(ctx.scratch("data"), scale)
    configs = _configs(source, epochs, use_gpu)
    shipped = sorted({p for c in configs.values() for p in ship_paths(c.model, c.train.function)})
    ray = start_ray(4, py_modules=shipped)
    manifest, preprocess_s, _ = fresh_preprocess(configs["function"], ctx.scratch("storage"))
    h.log(f"B12: preprocessed {scale}x digits in {preprocess_s:.1f} s: {manifest.rows}")

    from training.loop.function_engine import function_config

    storage = str(ctx.scratch("runs"))
    function_loop = function_config(configs["function"], manifest.spec, epochs)
    lightning_loop = _bare_lightning_config(configs["lightning"], manifest.spec, epochs)
    arms = {
        "trainflow_function": _trainflow_arm(configs["function"], manifest, storage, workers),
        "bare_function": _bare_arm(manifest, storage, workers, use_gpu, train_func, function_loop),
        "trainflow_lightning": _trainflow_arm(configs["lightning"], manifest, storage, workers),
        "bare_lightning": _bare_arm(
            manifest, storage, workers, use_gpu, _bare_lightning_worker, lightning_loop
        ),
    }
    samples = h.run_alternating(arms, reps, label=ID)
    notes = [
        "steady state = train rows x (epochs - 1) over the time from the first epoch's "
        "ray.train.report to the last one's, stamped on rank 0 in both arms of a pair",
        "trainflow arms: build_trainer (LeanTorchTrainer, DataConfig with preserve_order, "
        "checkpoint retention, the report contract on the controller); bare arms: "
        "ray.train.torch.TorchTrainer with its defaults and the same datasets",
    ]
    return h.Outcome(
        figures=_figures(samples),
        samples=samples,
        params={
            "data": f"digits x{scale} (tabular_digits)",
            "split_rows": manifest.rows,
            "epochs": epochs,
            "steady_epochs": epochs - 1,
            "batch_size": configs["function"].train.batch_size,
            "workers": workers,
            "threads_per_worker": 1,
            "use_gpu": use_gpu,
            "reps": reps,
            "ray_num_cpus": 4,
            "ray_start_s": ray.get("_start_s"),
            "preprocess_s": round(preprocess_s, 2),
        },
        notes=notes,
    )
