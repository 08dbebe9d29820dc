"""A LightningModule as a Lightning user writes it, and the factory trainflow calls.

``DigitsClassifier`` is plain Lightning: nothing in it knows Ray or trainflow. Its batches are
``(features, label)`` tuples; what it logs with ``self.log`` reaches Ray Train, Tune's ASHA and
MLflow after each epoch. ``build`` is the one addition: trainflow calls it as
``build(spec, **model.params)`` to get the module to train, and again to rebuild it from the
checkpoint when it evaluates, registers and serves the model.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import nn


class DigitsClassifier(pl.LightningModule):
    def __init__(self, num_features: int, num_classes: int, width: int = 64, lr: float = 3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(num_features, width),
            nn.ReLU(),
            nn.Linear(width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        features, label = batch
        loss = nn.functional.cross_entropy(self(features), label)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        features, label = batch
        logits = self(features)
        self.log("val_loss", nn.functional.cross_entropy(logits, label), sync_dist=True)
        accuracy = (logits.argmax(1) == label).float().mean()
        self.log("val_accuracy", accuracy, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def build(spec, width: int = 64, lr: float = 3e-3) -> DigitsClassifier:
    """``model.factory``: the module for trainflow's data (``spec.input_shape`` features in,
    ``spec.num_outputs`` classes out) with ``model.params`` as its keywords."""
    return DigitsClassifier(math.prod(spec.input_shape), spec.num_outputs, width=width, lr=lr)
