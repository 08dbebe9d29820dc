"""B10, throughput: training tokens/s of trainflow's two engines for a Hugging
Face model, ``train.engine: loop`` and ``hf_trainer``, beside a bare Hugging Face loop.

Same model (a BERT from a config: ``SIZES``, ``TRAINFLOW_B10_SIZE`` picks one; on a GPU ``base``,
~100M parameters, in bf16), same tokenized data (the bundled BBC News articles through
trainflow's preprocessing: token ids per row, each batch padded to its longest row), same global
batch, same torch threads (one worker x ``THREADS`` vs the bare loop x ``THREADS``). Tokens are
the non-pad tokens of the train split. Steady state: the epochs after the first, each stamped in
the worker after its validation (before its checkpoint); start-up (trainer build, workers, the
first batch) is reported separately. The bare loop: ``AutoModelForSequenceClassification`` from
the same config, AdamW, a seeded shuffle, ``model(input_ids, attention_mask, labels).loss``.

B10's other half, accuracy beside TF-IDF + logistic regression, is ``benchmarks.text_accuracy``
(its own result file).
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from typing import Any

from benchmarks import harness as h
from benchmarks.b1_training_throughput import _timed_worker
from benchmarks.common import Context, fresh_preprocess, register_by_value, start_ray

ID = "B10"
TITLE = "text training throughput: loop and hf_trainer engines vs a bare Hugging Face loop"
TIMEOUT_S = (2400, 600)
SIZE_ENV = "TRAINFLOW_B10_SIZE"
THREADS = 1
_LAYERS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: BERT sizes from a config: ``small`` runs ~1-2 min per arm on 2 CPU cores; ``base`` is a GPU's
#: (~100M parameters with the 8,000-token vocabulary).
SIZES: dict[str, dict[str, int]] = {
    "small": dict(zip(_LAYERS, (128, 2, 2, 512), strict=True)),
    "base": dict(zip(_LAYERS, (768, 12, 12, 3072), strict=True)),
}
_BARE = "bare Hugging Face loop (same model, tokenized batches, batch, threads)"
FIGURES = [
    h.FigureSpec(ID, "ratio_loop", "tokens/s, engine loop ÷ bare (steady state)", ">= 0.9", _BARE),
    h.FigureSpec(
        ID, "ratio_hf_trainer", "tokens/s, engine hf_trainer ÷ bare (steady state)", ">= 0.9", _BARE
    ),
    h.FigureSpec(ID, "tps_bare", "bare loop, steady tokens/s", "—", "—"),
    h.FigureSpec(ID, "startup_loop", "engine loop start-up (build to first batch)", "—", "—"),
    h.FigureSpec(
        ID, "startup_hf_trainer", "engine hf_trainer start-up (build to first batch)", "—", "—"
    ),
]


def _size(gpu: bool) -> str:
    size = os.environ.get(SIZE_ENV) or ("base" if gpu else "small")
    if size not in SIZES:
        raise ValueError(f"{SIZE_ENV}={size!r}: choose from {', '.join(SIZES)}")
    return size


def _timed_hf_worker(settings: dict[str, Any], threads: int) -> dict[str, Any]:
    """``train_loop_per_worker``: the hf_trainer engine with epochs stamped after validation."""
    import torch
    from transformers import TrainerCallback

    from training.loop.hf_trainer import hf_trainer_worker

    entered = time.time()
    torch.set_num_threads(threads)
    marks: dict[str, Any] = {"epoch_end": [], "first_batch": None}

    class Stamps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            marks["first_batch"] = marks["first_batch"] or time.time()

        def on_evaluate(self, args, state, control, **kwargs):
            marks["epoch_end"].append(time.time())

    history = hf_trainer_worker(settings, extra_callbacks=[Stamps()])
    return {**marks, "entered": entered, "epochs": len(history)}


def _tokens_per_s(ends: list[float], tokens_per_epoch: int) -> tuple[float, float]:
    """(tokens/s over the epochs after the first, seconds measured)."""
    if len(ends) < 2:
        raise RuntimeError("steady state needs at least 2 epochs (the first is warm-up)")
    seconds = ends[-1] - ends[0]
    return tokens_per_epoch * (len(ends) - 1) / seconds, seconds


def _engine_arm(config, manifest, storage: str, tokens: int, worker):
    def run(rep: int) -> dict[str, Any]:
        from training.loop.trainer import build_trainer

        started = time.time()
        trainer = build_trainer(
            config,
            manifest,
            name=f"b10-{config.train.engine}-{rep}-{uuid.uuid4().hex[:6]}",
            storage_path=storage,
            num_workers=1,
            train_fn=functools.partial(worker, threads=THREADS),
        )
        result = trainer.fit()
        out = result.return_value
        tps, steady_s = _tokens_per_s(out["epoch_end"], tokens)
        return {
            "tokens_per_s": tps,
            "steady_s": steady_s,
            "startup_s": out["first_batch"] - started,
            "total_s": time.time() - started,
        }

    return run


def _bare_arm(config, arrays, tokens: int):
    def run(rep: int) -> dict[str, Any]:
        import torch

        previous = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            return _bare_loop(config, arrays, tokens)
        finally:
            torch.set_num_threads(previous)

    return run


def _bare_loop(config, arrays, tokens: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification

    from training.model.trainflow_pyfunc.hf import hf_config

    started = time.time()
    (train_x, train_y), (val_x, val_y), spec = arrays
    pad_id, device = int(spec.tokens["pad_id"]), "cuda" if config.train.use_gpu else "cpu"
    torch.manual_seed(config.train.seed)
    hf = hf_config(config.model.hf.config, spec.num_outputs, spec.task, pad_id)
    model = AutoModelForSequenceClassification.from_config(hf).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay
    )
    bf16, batch = config.train.precision == "bf16", config.train.batch_size

    def inputs(features):  # the batch cut to its longest row, PAD turned into the mask
        mask = features >= 0
        width = int(mask.sum(dim=1).max())
        ids = features[:, :width].long().masked_fill(~mask[:, :width], pad_id)
        return ids.to(device), mask[:, :width].long().to(device)

    ends, first_batch = [], None
    for epoch in range(config.train.max_epochs):
        model.train()
        order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, len(order), batch):
            index = order[start : start + batch]
            ids, mask = inputs(train_x[index])
            first_batch = first_batch or time.time()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=ids, attention_mask=mask, labels=train_y[index].to(device))
            loss.loss.backward()
            optimizer.step()
            loss.loss.item()
        model.eval()
        with torch.no_grad():
            for start in range(0, len(val_y), batch):
                ids, mask = inputs(val_x[start : start + batch])
                model(input_ids=ids, attention_mask=mask).logits.argmax(1).cpu()
        ends.append(time.time())
    tps, steady_s = _tokens_per_s(ends, tokens)
    return {
        "tokens_per_s": tps,
        "steady_s": steady_s,
        "startup_s": first_batch - started,
        "total_s": ends[-1] - started,
    }


def _config(gpu: bool, size: str):
    from benchmarks.common import source_config

    model = {"model_type": "bert", "vocab_size": 8000, "max_position_embeddings": 128}
    return source_config(
        "builtin:bbc_news",
        {
            "data.label_column": "category",
            "data.max_length": 128,
            "model.kind": "hf",
            "model.hf": {"config": {**model, **SIZES[size]}, "tokenizer": "train"},
            "train.max_epochs": 3,
            "train.batch_size": 32,
            "train.lr": 0.002,
            "train.max_failures": 0,
            "train.checkpoint.num_to_keep": 1,
            "train.use_gpu": gpu,
            "train.precision": "bf16" if gpu else "fp32",
            "train.resources_per_worker": {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1},
        },
    )


def _train_arrays(manifest):
    import torch

    from training.data.read import load_split_arrays

    train_x, train_y, _ = load_split_arrays(manifest, "train")
    val_x, val_y, _ = load_split_arrays(manifest, "val")
    tokens = int((train_x >= 0).sum())  # non-pad tokens of one epoch
    tensors = (torch.from_numpy(train_x), torch.from_numpy(train_y))
    return (tensors, (torch.from_numpy(val_x), torch.from_numpy(val_y)), manifest.spec), tokens


def run(ctx: Context) -> h.Outcome:
    import torch

    register_by_value(__name__)
    gpu = torch.cuda.is_available()
    size = _size(gpu)
    reps = ctx.reps(3, 1)
    start_ray(4)
    config = _config(gpu, size)
    if ctx.smoke:
        config = config.with_overrides({"train.max_epochs": 2})
    manifest, preprocess_s, _ = fresh_preprocess(config, ctx.scratch("storage"))
    arrays, tokens = _train_arrays(manifest)
    h.log(f"B10: {size} BERT, {manifest.rows} rows, {tokens} train tokens per epoch")
    storage = str(ctx.scratch("runs"))
    hf_config = config.with_overrides({"train.engine": "hf_trainer"})
    arms = {
        "loop": _engine_arm(config, manifest, storage, tokens, _timed_worker),
        "hf_trainer": _engine_arm(hf_config, manifest, storage, tokens, _timed_hf_worker),
        "bare": _bare_arm(config, arrays, tokens),
    }
    samples = h.run_alternating(arms, reps, label=ID)
    return h.Outcome(
        figures=_figures(samples),
        samples=samples,
        params={"size": size, "gpu": gpu, "threads": THREADS, "reps": reps, **SIZES[size]},
        extra={"tokens_per_epoch": tokens, "rows": manifest.rows, "preprocess_s": preprocess_s},
    )


def _figures(samples: dict[str, list[dict[str, Any]]]) -> list[h.Figure]:
    spec = {s.key: s for s in FIGURES}
    bare = h.pluck(samples["bare"], "tokens_per_s")
    figures = []
    for engine in ("loop", "hf_trainer"):
        ratios = h.paired_ratios(h.pluck(samples[engine], "tokens_per_s"), bare)
        key = f"ratio_{engine}"
        figures.append(
            h.Figure(key, spec[key].name, "x", ratios, spec[key].anchor, h.Target(">=", 0.9))
        )
        key = f"startup_{engine}"
        startup = h.pluck(samples[engine], "startup_s")
        figures.append(h.Figure(key, spec[key].name, "s", startup))
    figures.append(h.Figure("tps_bare", spec["tps_bare"].name, "tokens/s", bare))
    return figures
