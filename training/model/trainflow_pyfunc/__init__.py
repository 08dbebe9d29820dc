"""The registered model's own code, shipped inside every MLflow model trainflow logs
(``code_paths``).

Self-contained on purpose: it imports torch, numpy, pandas and mlflow, and nothing of trainflow,
so that ``mlflow.pyfunc.load_model`` works where trainflow is not installed. Inside the model it
is the top-level package ``trainflow_pyfunc``; in trainflow, ``training.model.trainflow_pyfunc``.
"""
