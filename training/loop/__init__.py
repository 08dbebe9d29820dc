"""Training: the one loop, the contexts it runs in, its checkpoints, and the one TorchTrainer."""
