"""``train.engine: lightning``: the user's LightningModule (``model.factory`` returns it), trained
by a ``lightning.pytorch.Trainer`` that trainflow builds inside Ray Train's
``train_loop_per_worker`` as the Ray Train guides build it: ``RayDDPStrategy`` (or
``RayFSDPStrategy``), ``RayLightningEnvironment``, ``RayTrainReportCallback`` and
``prepare_trainer``. The same worker runs the final training and every sweep trial.

The module sees ``(features, label)`` batches of this worker's Ray Data shards "train" and
"val"; what it logs with ``self.log`` is what the report callback hands Ray Train (and Tune,
and ASHA) after each epoch, with a checkpoint holding Lightning's ``checkpoint.ckpt``.
Lightning is imported on the workers only (the ``[lightning]`` extra); docs/your-training-code.md
is the contract.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from training.config import PipelineConfig
from training.loop.function_reports import CONTRACT, ReportContract
from training.manifest import FeatureSpec

ENGINE = "lightning"
#: The file Ray's RayTrainReportCallback writes in every checkpoint it reports.
CHECKPOINT_FILE = "checkpoint.ckpt"
#: train.precision -> Lightning's: bf16 autocasts the forward passes, as trainflow's loop does.
_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed"}


def lightning_precision(precision: str) -> str:
    """Lightning's ``Trainer(precision=...)`` for ``train.precision``."""
    return _PRECISION[precision]


def lightning_settings(config: PipelineConfig, spec: FeatureSpec, max_epochs: int) -> dict:
    """The TorchTrainer's ``train_loop_config``: what each worker builds its module and Trainer
    from (plain data; a trial's sampled values already applied)."""
    train = config.train
    return {
        "model": config.model.model_dump(mode="json"),
        "spec": spec.to_dict(),
        "batch_size": train.batch_size,
        "max_epochs": int(max_epochs),
        "seed": train.seed,
        "precision": lightning_precision(train.precision),
        "strategy": train.strategy,
        "use_gpu": train.use_gpu,
    }


class ShardBatches:
    """A Ray Data shard as the ``(features, label)`` batches a LightningModule's steps unpack;
    each iteration is one epoch's pass. Features are shaped ``(batch, *spec.input_shape)``,
    as the served model feeds the module (a view of the flat rows, no copy)."""

    def __init__(self, shard, batch_size: int, input_shape: list[int]) -> None:
        self.shard, self.batch_size, self.input_shape = shard, batch_size, tuple(input_shape)

    def __iter__(self):
        for batch in self.shard.iter_torch_batches(batch_size=self.batch_size):
            yield batch["features"].reshape(-1, *self.input_shape), batch["label"]


def lightning_worker(settings: dict[str, Any]) -> None:
    """``train_loop_per_worker``: the user's module trained by a Ray-prepared Lightning Trainer,
    resumed from Ray Train's latest checkpoint after a worker-group restart."""
    import ray.train
    from ray.train.lightning import (
        RayDDPStrategy,
        RayFSDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    from training.model.lightning_module import check_lightning_module, lightning_pytorch
    from training.model.trainflow_pyfunc.custom import ModelSpec, build_custom

    pl = lightning_pytorch()
    # Lightning's banners (devices, precision) would repeat on every worker of every trial.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    pl.seed_everything(settings["seed"], workers=True, verbose=False)
    spec = FeatureSpec.from_dict(settings["spec"])
    model_spec = ModelSpec.of(spec.input_shape, spec.num_outputs, spec.task, spec.cardinalities)
    module = build_custom(settings["model"], model_spec).net
    check_lightning_module(settings["model"]["factory"], module)
    strategy = RayFSDPStrategy() if settings["strategy"] == "fsdp" else RayDDPStrategy()
    trainer = pl.Trainer(
        max_epochs=settings["max_epochs"],
        accelerator="gpu" if settings["use_gpu"] else "cpu",
        devices="auto",
        strategy=strategy,
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        precision=settings["precision"],
        # Ray Train keeps the checkpoints and trainflow logs the metrics to MLflow.
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        # The first epoch's validation checks the same steps; a sanity pass costs start-up.
        num_sanity_val_steps=0,
    )
    trainer = prepare_trainer(trainer)
    per_worker = max(1, settings["batch_size"] // ray.train.get_context().get_world_size())
    train = ShardBatches(ray.train.get_dataset_shard("train"), per_worker, spec.input_shape)
    val = ShardBatches(ray.train.get_dataset_shard("val"), per_worker, spec.input_shape)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
        return
    with checkpoint.as_directory() as directory:
        resume = os.path.join(directory, CHECKPOINT_FILE)
        trainer.fit(module, train_dataloaders=train, val_dataloaders=val, ckpt_path=resume)


class LoggedMetricsContract(ReportContract):
    """On the controller: every epoch's report carries the metrics trainflow ranks by, logged
    by the module with ``self.log``. The checkpoint is the report callback's own."""

    model_file = None

    def missing_metrics(self, reported: list[str], missing: list[str]) -> str:
        return (
            f"the LightningModule of model.factory {self.function!r} logged {reported} "
            f"without {', '.join(missing)}: log {' and '.join(self.required)} "
            "(sweep.metric and train.checkpoint.score_attribute) with self.log(name, value, "
            f"sync_dist=True) in validation_step, every epoch; see {CONTRACT}"
        )
