"""The hyperparameter sweep: the search space, the Ray Tune run, and what its trials came to."""
