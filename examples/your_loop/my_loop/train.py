"""The loop of ``plain.py`` as trainflow runs it: Ray Train's ``train_loop_per_worker(config)``,
on every worker of the final training and in every sweep trial.

What changes (marked "Ray Train" below), as the Ray Train guides write it:
- the hyperparameters come in ``config`` (trainflow's, after the sweep's sample);
- the model goes through ``prepare_model`` (DDP across the workers);
- the rows come from the ``"train"`` and ``"val"`` shards trainflow prepared (``features``,
  ``label``; the fitted transform already applied), read with ``iter_torch_batches``;
- each epoch ends with one ``ray.train.report`` carrying ``val_accuracy`` (``sweep.metric``) and,
  from rank 0, a checkpoint directory holding ``model.pt``;
- ``ray.train.get_checkpoint()`` resumes after a worker restart.
"""

from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from my_loop.nets import build


def _unwrapped(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DDP's wrapper holds your module as .module


def train_func(config: dict) -> None:
    torch.manual_seed(config["seed"])
    spec = SimpleNamespace(**config["spec"])  # Ray Train: trainflow's spec as plain data
    model = ray.train.torch.prepare_model(build(spec, **config["params"]))  # Ray Train
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"]
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    start = 0
    checkpoint = ray.train.get_checkpoint()  # Ray Train: resume after a restart
    if checkpoint:
        with checkpoint.as_directory() as directory:
            weights = torch.load(os.path.join(directory, "model.pt"), weights_only=True)
            _unwrapped(model).load_state_dict(weights)
            extra = torch.load(os.path.join(directory, "extra.pt"), weights_only=True)
        optimizer.load_state_dict(extra["optimizer"])
        start = int(extra["epoch"]) + 1
    context = ray.train.get_context()
    per_worker = max(1, config["batch_size"] // context.get_world_size())
    train_rows = ray.train.get_dataset_shard("train")  # Ray Train: this worker's rows
    val_rows = ray.train.get_dataset_shard("val")
    for epoch in range(start, config["max_epochs"]):
        model.train()
        for batch in train_rows.iter_torch_batches(batch_size=per_worker):
            optimizer.zero_grad()
            loss = loss_fn(model(batch["features"]), batch["label"])
            loss.backward()
            optimizer.step()
        model.eval()
        sums = torch.zeros(2)  # correct, rows
        with torch.no_grad():
            for batch in val_rows.iter_torch_batches(batch_size=256):
                predicted = model(batch["features"]).argmax(1)
                sums += torch.tensor([(predicted == batch["label"]).sum().item(), len(predicted)])
        if dist.is_initialized():  # every worker validated its own shard: sum them
            dist.all_reduce(sums)
        metrics = {"train_loss": loss.item(), "val_accuracy": (sums[0] / sums[1]).item()}
        with tempfile.TemporaryDirectory() as directory:  # Ray Train: report once per epoch
            saved = None
            if context.get_world_rank() == 0:
                torch.save(_unwrapped(model).state_dict(), os.path.join(directory, "model.pt"))
                extra = {"optimizer": optimizer.state_dict(), "epoch": epoch}
                torch.save(extra, os.path.join(directory, "extra.pt"))
                saved = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=saved)
