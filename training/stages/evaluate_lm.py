"""Stage 4 for a language model (``data.task: causal_lm``): the best checkpoint's test loss
and perplexity over the packed test split (every next-token target, as validation counts them),
and samples: the model continues the first words of a few test texts, logged beside what the
texts really say as an MLflow table (``samples.json``), so two versions read side by side.

The gate compares ``test_perplexity`` (lower wins, ``training.metrics``) with the value stored
on the champion: a language model has no per-row predictions to score on the same rows.
"""

from __future__ import annotations

import math

import torch

from training import progress
from training.config import PipelineConfig
from training.data.read import load_split_arrays
from training.data.splits import raw_rows
from training.inference.evaluate import EvalResult
from training.loop.validation import perplexity
from training.manifest import Manifest
from training.model.hf_model import servable_state
from training.model.trainflow_pyfunc.causal_lm import NextTokenLoss, target_count
from training.model.trainflow_pyfunc.model import TrainflowModel
from training.model.trainflow_pyfunc.prompts import RESPONSE_COLUMN, is_prompt_response
from training.stages.evaluated import Evaluated, open_evaluation
from training.tracking import flavour
from training.tracking.signature import lm_prompts

#: Test texts whose first words become the samples' prompts.
SAMPLE_ROWS = 5
#: Words of a prompt, and of the reference that follows it (and tokens generated).
PROMPT_WORDS, REFERENCE_WORDS, SAMPLE_TOKENS = 8, 24, 32
#: Blocks per forward pass.
EVAL_BATCH = 32


def evaluate_lm(
    config: PipelineConfig, manifest: Manifest, checkpoint_path: str, parent_run: str
) -> Evaluated:
    """Test loss and perplexity, and the samples table, logged to an evaluate run."""
    tracker, eval_run, state = open_evaluation(config, manifest, checkpoint_path, parent_run)
    endpoint = config.storage.endpoint_url
    model = TrainflowModel()
    model.load_state(servable_state(state))  # LoRA merged: the network the registry serves
    metrics = test_metrics(model.network, manifest, endpoint)
    example = raw_rows(manifest, "test", max(SAMPLE_ROWS, flavour.EXAMPLE_ROWS), endpoint)
    samples = sample_table(model, state["spec"], example.head(SAMPLE_ROWS))
    tracker.client.log_table(eval_run, data=samples, artifact_file="samples.json")
    result = EvalResult(metrics, [], [], [], task="causal_lm")
    tracker.log_metrics(eval_run, metrics)
    tracker.log_metrics(parent_run, metrics)
    tracker.end_run(eval_run)
    progress.report("evaluate", result.headline, metrics=metrics)
    return Evaluated(result, state, example, run_id=eval_run)


@torch.no_grad()
def test_metrics(network, manifest: Manifest, endpoint: str | None) -> dict[str, float]:
    """Mean next-token loss over the test blocks, its perplexity, blocks and targets."""
    features, _, _ = load_split_arrays(manifest, "test", endpoint)
    ids = torch.from_numpy(features)
    loss_fn, loss_sum, targets = NextTokenLoss(), 0.0, 0
    network.eval()
    for first in range(0, len(ids), EVAL_BATCH):
        batch = ids[first : first + EVAL_BATCH]
        loss_sum += loss_fn(network(batch), batch).item()
        targets += target_count(batch)
    loss = loss_sum / max(targets, 1)
    return {
        "test_loss": loss,
        "test_perplexity": perplexity(loss) if math.isfinite(loss) else math.inf,
        "test_rows": float(len(ids)),
        "test_tokens": float(targets),
    }


def sample_table(model: TrainflowModel, spec: dict, rows) -> dict[str, list[str]]:
    """prompt / reference / generation for a few test texts (greedy: the same every run): a
    text's first words and the words after them, or a prompt and its response."""
    import pandas as pd

    prompts = lm_prompts(spec, rows, PROMPT_WORDS)
    tokens = spec["tokens"]
    if is_prompt_response(tokens):
        references = [str(text) for text in rows[tokens[RESPONSE_COLUMN]]]
    else:
        references = [
            " ".join(str(text).split()[PROMPT_WORDS : PROMPT_WORDS + REFERENCE_WORDS])
            for text in rows[tokens["column"]]
        ]
    params = {"max_new_tokens": SAMPLE_TOKENS, "temperature": 0.0}
    generated = model.predict(None, pd.DataFrame({"prompt": prompts}), params=params)
    return {
        "prompt": prompts,
        "reference": references,
        "generation": generated["generated_text"].tolist(),
    }
