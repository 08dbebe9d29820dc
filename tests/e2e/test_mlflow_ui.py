"""The MLflow UI in a real browser: a smoke pipeline logs to a real `mlflow server` on loopback,
then headless Chromium (Debian's package, driven by Playwright) checks what a user sees there.
The run and the server are shared with test_pipeline.py (its second run; tests/e2e/conftest.py).

Screenshots go to test-output/mlflow-ui/ (gitignored), or with TRAINFLOW_SCREENSHOTS=docs into
docs/ as docs/mlflow-ui-NN-*.png, the pictures docs/mlflow-ui.md shows:
01-run-tree.png            the runs table: pipeline -> sweep -> trials expanded, trials selected
02-compare-plot.png        compare view of the trials: train.lr vs val_accuracy, run names
03-compare-tables.png      the same page lower down: params, metrics and fate tags side by side
04-compare-cli-url.png     the compare URL printed by `trainflow compare`
05-sweep-curves.png        the sweep run's learning-curves plot in the artifact viewer
06-report.png              the pipeline's HTML report (report.html) on the parent run
07-model-registry.png      the registered model: versions, tags, champion/challenger aliases
08-parent-run.png          the summary's link in a fresh profile: the parent run, training view
09-runs-fresh-profile.png  the experiment's runs link in a fresh profile: the run tree
10-logged-model.png        the logged model's page: its test metrics by dataset, datasets used
11-models-tab.png          the experiment's Models tab: each kept checkpoint, named by its epoch

The browser tests skip only where /usr/bin/chromium is missing and $CI is unset; in CI they run
(.ci/run installs chromium).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from cli_runner import run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
# Each epoch's throughput, logged on the trial runs beside the model's metrics.
THROUGHPUT = ("train_rows_per_s", "data_wait_share")

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")
SCREENSHOTS_ENV = "TRAINFLOW_SCREENSHOTS"


def screenshot_path(name: str) -> Path:
    """Where screenshot ``name`` goes: docs/mlflow-ui-<name> when $TRAINFLOW_SCREENSHOTS is
    ``docs`` (to refresh the documentation's pictures), else test-output/mlflow-ui/<name>."""
    if os.environ.get(SCREENSHOTS_ENV) == "docs":
        return REPO_ROOT / "docs" / f"mlflow-ui-{name}"
    return REPO_ROOT / "test-output" / "mlflow-ui" / name


CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]
UI_TIMEOUT_MS = 60_000  # the UI's first load compiles a large bundle on a busy 2-core machine
MODEL = "digits-smoke"
# What Tune and the loop report beside the model's metrics: none of it is a trial run's metric.
TUNE_BOOKKEEPING = {
    "epoch",
    "training_iteration",
    "time_this_iter_s",
    "time_total_s",
    "workers",
    "timestamp",
    "done",
    "pid",
    "lr",
}


def _trainflow(home: Path, uri: str, *args: str, timeout: int = 600):
    return run_cli(home, *args, timeout=timeout, MLFLOW_TRACKING_URI=uri)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ui-home")


@pytest.fixture(scope="module")
def server(smoke_mlflow_server):
    """`mlflow server` on a free loopback port (sqlite + local artifacts in the smoke home)."""
    return smoke_mlflow_server


@pytest.fixture(scope="module")
def pipeline(smoke_second_run) -> dict:
    """One smoke pipeline run, logged to the server; returns its summary. It is
    test_pipeline.py's second run (tests/e2e/conftest.py): one pipeline run fewer in the suite."""
    summary, _ = smoke_second_run
    return summary


@pytest.fixture(scope="module")
def client(server, pipeline):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server)


@pytest.fixture(scope="module")
def runs(client, pipeline) -> dict:
    """The run tree of the pipeline: parent, stage runs by stage, trial runs."""
    experiment_id = pipeline["mlflow"]["experiment_id"]
    parent = client.get_run(pipeline["mlflow"]["parent_run_id"])

    def children(run_id):
        return client.search_runs(
            [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
        )

    stages = {r.data.tags["trainflow.stage"]: r for r in children(parent.info.run_id)}
    trials = children(stages["sweep"].info.run_id)
    return {"experiment_id": experiment_id, "parent": parent, "stages": stages, "trials": trials}


@pytest.fixture(scope="module")
def compare_output(home, server, pipeline) -> str:
    proc = _trainflow(home, server, "compare", "--config", SMOKE, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


# ------------------------------------------------------------------------- MLflow, read directly


def test_trial_runs_are_named_tagged_and_comparable(pipeline, runs):
    trials = runs["trials"]
    assert len(trials) == len(pipeline["sweep"]["trials"]) == 4
    by_id = {t["trial_id"]: t for t in pipeline["sweep"]["trials"]}
    for run in trials:
        tags = run.data.tags
        trial = by_id[tags["trainflow.trial_id"]]
        number = int(trial["trial_id"].rsplit("_", 1)[1])
        assert re.fullmatch(rf"trial {number:02d} · lr=\S+", run.info.run_name), run.info.run_name
        assert set(run.data.params) == {"train.lr"}
        assert {"train_loss", "val_loss", "val_accuracy"} <= set(run.data.metrics)
        assert not {"pid", "timestamp", "done"} & set(run.data.metrics)  # no Tune bookkeeping
        # The model's metrics only, per epoch; no Ray trial_name tag.
        assert set(run.data.metrics) == {"train_loss", "val_loss", "val_accuracy", *THROUGHPUT}
        assert "trial_name" not in tags
        assert len(trial["history"]) == trial["epochs"]
        if trial["status"] == "stopped-early":
            assert re.fullmatch(
                rf"stopped by ASHA at rung \d \(iteration {trial['epochs']} of 3\)",
                tags["trainflow.fate_detail"],
            )
        else:
            assert tags["trainflow.fate_detail"] == "completed all 3 iterations"


def test_sweep_run_summary_plots_and_report(pipeline, client, runs):
    sweep = runs["stages"]["sweep"]
    best = pipeline["sweep"]["best_trial_id"]
    assert sweep.data.tags["best_trial_id"] == best
    assert sweep.data.tags["best_trial_name"].startswith(f"trial {int(best[-5:]):02d} · lr=")
    assert sweep.data.tags["best.train.lr"] == str(pipeline["sweep"]["best_params"]["train.lr"])
    metrics = sweep.data.metrics
    assert metrics["epochs_budget"] == 12 and metrics["trials_run"] == 4
    assert metrics["epochs_saved_fraction"] == round(1 - metrics["epochs_spent"] / 12, 4)
    assert "ASHA sweep" in sweep.data.tags["mlflow.note.content"]
    assert metrics["epochs_saved_fraction"] == round(metrics["epochs_saved_fraction"], 4)
    assert json.loads(sweep.data.params["search_space.train.lr"]) == {"loguniform": [1e-4, 3e-2]}
    assert not [value for value in sweep.data.params.values() if "None" in value]

    def artifacts(run, path=None):
        return {a.path for a in client.list_artifacts(run.info.run_id, path)}

    assert artifacts(sweep, "plots") == {
        "plots/sweep_curves.png",
        "plots/asha_rungs.png",
        "plots/param_train_lr.png",
    }
    assert artifacts(runs["stages"]["train"], "plots") == {"plots/curves.png"}
    assert artifacts(runs["stages"]["evaluate"], "plots") == {
        "plots/confusion_matrix.png",
        "plots/per_class.png",
    }
    assert "report.html" in artifacts(runs["parent"])
    space = client.download_artifacts(sweep.info.run_id, "search_space.json")
    assert "train.lr" in json.loads(Path(space).read_text())
    page = client.download_artifacts(runs["parent"].info.run_id, "report.html")
    text = Path(page).read_text()
    assert text.count("data:image/png;base64,") == 6  # 3 sweep, 1 train, 2 evaluation
    assert pipeline["report"].endswith(
        f"/runs/{runs['parent'].info.run_id}/artifactPath/report.html"
    )


def test_registry_version_describes_itself(pipeline, client):
    version = client.get_model_version(MODEL, pipeline["model"]["version"])
    assert version.tags["pipeline_run"] == pipeline["mlflow"]["parent_run_id"]
    assert version.tags["gate.decision"] == pipeline["model"]["decision"]
    # How it was chosen: the sweep's best trial, then the gate's decision on its test metric.
    assert "chosen as the best of 4 ASHA trials" in version.description
    assert f"gate on test_accuracy: {pipeline['model']['decision']}" in version.description
    assert "champion" in client.get_registered_model(MODEL).description


def test_compare_command_lists_trials_best_first(compare_output, client, runs):
    best = {
        run.info.run_name: max(
            m.value for m in client.get_metric_history(run.info.run_id, "val_accuracy")
        )
        for run in runs["trials"]
    }
    positions = {name: compare_output.index(name) for name in best}
    assert sorted(positions, key=positions.get) == sorted(best, key=lambda n: -best[n])
    assert "compare view in the MLflow UI: http://127.0.0.1:" in compare_output


# ---------------------------------------------------------------------------- the real browser


@pytest.fixture(scope="module")
def browser_context():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run must install Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); runs in CI")
    from playwright.sync_api import sync_playwright

    screenshot_path("x").parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser.new_context(viewport={"width": 1600, "height": 1000})
        finally:
            browser.close()


@pytest.fixture(scope="module")
def ui(browser_context, server, runs):
    """The browser as a user leaves it after a first visit: the "Model training" side of the
    UI chosen (runs, models, registry in the menu) and the Assistant panel closed. Both are
    kept in the browser's local storage, so every later page opens the same way."""
    page = browser_context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(f"{server}/#/experiments/{runs['experiment_id']}/runs")
    page.get_by_text(runs["parent"].info.run_name, exact=True).wait_for()
    page.get_by_text("Model training", exact=True).first.click()
    page.get_by_text("Model registry", exact=True).first.wait_for()
    close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
    if close.count() and close.first.is_visible():
        close.first.click()
    page.close()
    return browser_context


@pytest.fixture
def page(ui):
    tab = ui.new_page()
    tab.set_default_timeout(UI_TIMEOUT_MS)
    yield tab
    tab.close()


def _shot(page, name: str) -> None:
    page.wait_for_timeout(800)  # let charts finish their transitions
    page.screenshot(path=str(screenshot_path(name)))


def _expand(page, run_name: str) -> None:
    cell = page.locator(
        '[col-id="attributes.`Run Name`"]', has=page.get_by_text(run_name, exact=True)
    ).first
    cell.locator("button").first.click()


def test_run_tree_shows_the_trials_and_opens_their_compare_view(page, server, pipeline, runs):
    names = sorted(run.info.run_name for run in runs["trials"])
    page.goto(f"{server}/#/experiments/{runs['experiment_id']}/runs")
    parent = runs["parent"].info.run_name
    page.get_by_text(parent, exact=True).wait_for()
    _expand(page, parent)
    for stage in ("sweep", "train", "evaluate"):
        page.get_by_text(stage, exact=True).first.wait_for()
    _expand(page, "sweep")
    for name in names:
        page.get_by_text(name, exact=True).first.wait_for()
        row = page.locator(".ag-row", has=page.get_by_text(name, exact=True)).first
        index = row.get_attribute("row-index")
        page.locator(f'.ag-row[row-index="{index}"] input[type="checkbox"]').first.check()
    _shot(page, "01-run-tree.png")

    page.get_by_role("button", name="Compare").first.click()
    page.wait_for_url("**/compare-runs**")
    page.get_by_text("train.lr", exact=True).first.wait_for()
    # plot the trials' learning rate against val_accuracy. The plot opens on the first metric:
    # one of the model's (Tune's `epoch` & co. sorted ahead of them before).
    metrics = page.locator(
        ".du-bois-light-select",
        has=page.locator(
            ".du-bois-light-select-selection-item-content",
            has_text=re.compile(r"^(train_loss|val_loss|val_accuracy)$"),
        ),
    ).first
    selected = metrics.locator(".du-bois-light-select-selection-item-content").all_inner_texts()
    # The plot opens on the sweep's metric (the trials log it first).
    assert selected == ["val_accuracy"], selected
    metrics.locator(".du-bois-light-select-selector").click()
    options = page.locator(".du-bois-light-select-item-option")
    options.first.wait_for()
    offered = [options.nth(i).get_attribute("title") for i in range(options.count())]
    assert offered[0] == "val_accuracy", offered
    assert {"train_loss", "val_loss", "val_accuracy"} <= set(offered), offered
    assert not TUNE_BOOKKEEPING & set(offered), offered
    page.keyboard.press("Escape")
    text = page.inner_text("body")
    assert f"Comparing {len(names)} Runs" in text
    for name in names:
        assert name in text
    _shot(page, "02-compare-plot.png")

    page.get_by_text("Parameters", exact=True).first.evaluate(
        "e => e.scrollIntoView({block: 'start'})"
    )
    text = page.inner_text("body")
    for run in runs["trials"]:
        assert run.data.params["train.lr"] in text  # each trial's sampled value, verbatim
        assert run.data.tags["trainflow.fate_detail"] in text.replace("\n", " ")
    assert re.search(r"^val_accuracy\s", text, re.MULTILINE), "no val_accuracy row"
    assert f"{max(r.data.metrics['val_accuracy'] for r in runs['trials']):.3f}" in text
    _shot(page, "03-compare-tables.png")


def test_the_summary_link_opens_the_training_view_in_a_fresh_profile(
    browser_context, server, pipeline, runs
):
    """A browser that never chose "Model training" follows the link the
    summary prints (the parent run) and the experiment's runs link into the training view."""
    context = browser_context.browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(UI_TIMEOUT_MS)
        run_url = pipeline["mlflow"]["run_url"]
        assert run_url.startswith(server) and run_url.endswith("workflowType=machine_learning")
        page.goto(run_url)
        page.get_by_text(runs["parent"].info.run_name, exact=True).first.wait_for()
        page.get_by_text("Model registry", exact=True).first.wait_for()  # the training menu
        page.get_by_text("trainflow pipeline run", exact=False).first.wait_for()  # description
        _shot(page, "08-parent-run.png")
        page.goto(run_url.replace(f"/runs/{runs['parent'].info.run_id}?", "/runs?"))
        parent = runs["parent"].info.run_name
        page.get_by_text(parent, exact=True).wait_for()
        _expand(page, parent)
        for stage in ("sweep", "train", "evaluate"):
            page.get_by_text(stage, exact=True).first.wait_for()
        _shot(page, "09-runs-fresh-profile.png")
    finally:
        context.close()


def test_the_parent_run_holds_the_champions_params(client, runs, pipeline):
    """Not the config defaults: the values the champion was trained with."""
    parent, train = runs["parent"], runs["stages"]["train"]
    # the training config (the logged model adds its own model_config, e.g. `device`)
    shared = {k: v for k, v in train.data.params.items() if k.startswith(("train.", "model."))}
    assert "train.lr" in shared and "model.dropout" in shared
    assert {k: parent.data.params.get(k) for k in shared} == shared
    assert parent.data.params["train.lr"] == str(pipeline["sweep"]["best_params"]["train.lr"])
    assert parent.data.tags["mlflow.source.name"] == "trainflow run"
    assert "search_space.json" in {a.path for a in client.list_artifacts(parent.info.run_id)}


def test_compare_url_from_the_cli_opens_the_same_view(page, compare_output, runs):
    url = re.search(r"compare view in the MLflow UI: (\S+)", compare_output).group(1)
    page.goto(url)
    page.get_by_text("train.lr", exact=True).first.wait_for()
    text = page.inner_text("body")
    assert f"Comparing {len(runs['trials'])} Runs" in text
    for run in runs["trials"]:
        assert run.info.run_name in text and run.data.params["train.lr"] in text
    assert "val_accuracy" in text
    _shot(page, "04-compare-cli-url.png")


def test_sweep_plots_and_report_open_in_the_artifact_viewer(page, server, pipeline, runs):
    sweep = runs["stages"]["sweep"].info.run_id
    page.goto(
        f"{server}/#/experiments/{runs['experiment_id']}/runs/{sweep}"
        "/artifactPath/plots/sweep_curves.png"
    )
    page.get_by_text("asha_rungs.png", exact=True).first.wait_for()
    # the plot itself (1500 px wide), loaded: not just the viewer around it
    page.wait_for_function(
        "() => [...document.images].some(i => i.complete && i.naturalWidth > 600)"
    )
    _shot(page, "05-sweep-curves.png")

    page.goto(pipeline["report"])
    report = page.frame_locator("iframe").first
    report.get_by_text("Sweep (Ray Tune + ASHA)").wait_for()
    best = runs["stages"]["sweep"].data.tags["best_trial_name"]
    report.get_by_text(best, exact=True).first.wait_for()
    report.get_by_text(f"gate decision: {pipeline['model']['decision']}").wait_for()
    _shot(page, "06-report.png")


def test_model_page_shows_versions_tags_and_aliases(page, server, pipeline):
    page.goto(f"{server}/#/models/{MODEL}")
    page.get_by_text("@ champion").first.wait_for()
    text = page.inner_text("body")
    assert "challenger" in text and "gate.decision" in text and "pipeline_run" in text
    assert "the version in use" in text  # the registered model's description
    _shot(page, "07-model-registry.png")


def test_the_logged_model_carries_its_evidence(client, server, runs, pipeline):
    """In MLflow: the logged model is the best kept checkpoint's, named after the registered
    model and its epoch, holds
    the test metrics of the evaluate run on the test split's dataset and the train run's on
    the train and val splits, evaluate takes it as input, and its MLmodel names no build path;
    the version's description links its runs."""
    model_id = pipeline["model"]["logged_model_uri"].removeprefix("models:/")
    model = client.get_logged_model(model_id)
    assert model.name == f"{MODEL}-epoch-{model.tags['trainflow.epoch']}"
    evaluate, train = runs["stages"]["evaluate"].info.run_id, runs["stages"]["train"].info.run_id
    by_key = {m.key: m for m in model.metrics}
    assert by_key["test_accuracy"].value == pytest.approx(pipeline["test_metrics"]["test_accuracy"])
    assert by_key["test_accuracy"].dataset_name.endswith(" [test]")
    assert by_key["test_accuracy"].run_id == evaluate
    assert by_key["val_accuracy"].dataset_name.endswith(" [val]")
    assert by_key["train_loss"].dataset_name.endswith(" [train]")
    assert by_key["val_accuracy"].run_id == by_key["train_loss"].run_id == train
    inputs = client.get_run(evaluate).inputs.model_inputs
    assert model_id in {m.model_id for m in inputs}
    import mlflow.artifacts

    local = mlflow.artifacts.download_artifacts(
        artifact_uri=f"{model.artifact_location}/MLmodel", tracking_uri=server
    )
    text = Path(local).read_text()
    assert "model_code_path: trainflow_model.py" in text
    assert "/tmp" not in text.replace(model.artifact_location, "")
    version = client.get_model_version(MODEL, pipeline["model"]["version"])
    assert model.tags["mlflow.note.content"] == version.description  # the model page's too
    for label in ("train run", "evaluate run", "pipeline run"):
        assert re.search(
            rf"\[{label}\]\(http://127\.0\.0\.1:\d+/#/experiments/", version.description
        )


def test_the_logged_model_page_shows_metrics_and_datasets(page, server, pipeline, runs, client):
    """The model page shows "Metrics" with the test metrics and
    "Datasets used" filled."""
    model_id = pipeline["model"]["logged_model_uri"].removeprefix("models:/")
    model = client.get_logged_model(model_id)
    page.goto(f"{server}/#/experiments/{runs['experiment_id']}/models/{model_id}")
    page.get_by_text(model.name, exact=True).first.wait_for()
    page.get_by_text(re.compile(r"^Metrics \(\d+\)$")).first.wait_for()
    page.get_by_text("test_accuracy", exact=True).first.wait_for()
    text = page.inner_text("body")
    count = int(re.search(r"Metrics \((\d+)\)", text).group(1))
    assert count == len(model.metrics) > 0
    assert "Datasets used" in text
    datasets = text.split("Datasets used", 1)[1].split("Model versions", 1)[0]
    # the sidebar names the first datasets and folds the rest into "+N"
    shown = re.findall(r"\[(train|val|test)\] \(#[0-9a-f]+\)", datasets)
    folded = re.search(r"^\+(\d+)$", datasets, re.MULTILINE)
    assert shown and len(shown) + (int(folded.group(1)) if folded else 0) == 3, datasets
    assert "evaluate" in text  # among the model's runs
    assert "gate on test_accuracy" in text  # its description, with links to its runs
    page.get_by_role("link", name="evaluate run").first.wait_for()
    _shot(page, "10-logged-model.png")


def test_the_models_tab_lists_every_kept_checkpoint(page, server, pipeline, runs, client):
    """The experiment's Models tab lists the train run's kept checkpoints by name and epoch,
    the best one's row naming the registered version made from it."""
    train = pipeline["mlflow"]["train_run_id"]
    kept = client.search_logged_models(
        experiment_ids=[runs["experiment_id"]], filter_string=f"source_run_id = '{train}'"
    )
    names = sorted(model.name for model in kept)
    assert len(names) == 2 and names == sorted(set(names)), names  # num_to_keep: 2, by epoch
    page.goto(f"{server}/#/experiments/{runs['experiment_id']}/models")
    for name in names:
        page.get_by_text(name, exact=True).first.wait_for()
    text = page.inner_text("body")
    assert f"{MODEL}\nv{pipeline['model']['version']}" in text, text
    _shot(page, "11-models-tab.png")
