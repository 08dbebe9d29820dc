"""Scoring with a trained model: the Ray Data batch predictor, evaluation and predictions."""
