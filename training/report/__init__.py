"""The report room: plots of a run (PNG files), sweep trials in words, the self-contained HTML
report (a jinja2 template) and the Prefect markdown artifacts. Renderers take the typed
``training.summary.RunSummary``; nothing here talks to MLflow or Prefect."""
