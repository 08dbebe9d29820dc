"""B11, causal-LM throughput: training tokens/s of trainflow's loop through the
pipeline's own ``TorchTrainer`` (``training.loop.trainer.build_trainer``) with
``train.strategy`` ddp, fsdp and deepspeed (ZeRO-3, where the ``[deepspeed]`` extra is
installed: on CPUs DeepSpeed's CPU accelerator over gloo), beside a bare Hugging Face loop on
the same model; and each arm's model FLOPs utilisation (``benchmarks.b11_mfu``: the formula and
the peak it is measured against).

Same model (a GPT-2 from a config: ``SIZES``; ``TRAINFLOW_B11_SIZE`` or ``python -m
benchmarks --only B11 --size gpu`` picks one; ``gpu`` on a CUDA machine, else ``toy``), same
data (BBC News articles packed into blocks of the sequence length by trainflow's
preprocessing; the bare loop reads the same train split), same global batch and precision, and
one device per worker against the bare loop on one: GPU, 1 worker on 1 GPU; CPU, 2 workers x 1
thread (so that FSDP really shards and DDP all-reduces) against the bare loop on 1 thread,
compared per worker (tokens/s ÷ workers ÷ bare, the bare loop stepping on one worker's share
of the global batch: 1.0 is the bare loop scaled perfectly). Not
the bare loop on 2 threads: on this shared 2-core machine two OpenMP threads under load ran
~40x slower than one, which measures the load, not the loop. Tokens are the non-pad tokens
trained on; the time is each epoch's training phase (first batch requested to last step done;
validation and checkpoints excluded, in both arms) over the epochs after the first. The bare
loop: ``AutoModelForCausalLM``, AdamW, a seeded shuffle,
``model(input_ids, attention_mask, labels).loss``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import b11_mfu as mfu
from benchmarks import harness as h
from benchmarks.b11_bare_loop import bare_arm, bare_model, steady_tokens_per_s, sync
from benchmarks.common import Context, fresh_preprocess, register_by_value, start_ray

ID = "B11"
TITLE = "causal-LM training throughput and MFU: DDP, FSDP, DeepSpeed ZeRO-3 vs a bare HF loop"
TIMEOUT_S = (3600, 600)
SIZE_ENV = "TRAINFLOW_B11_SIZE"
STRATEGIES = ("ddp", "fsdp")
ONE_WORKER = "one_worker"
DEEPSPEED_SKIPPED = "skipped: needs `pip install -e '.[deepspeed]'`"
_GPT2 = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")
#: ``toy``: seconds per arm on 2 CPU cores (the smoke's); ``gpu``: GPT-2 small's shape (~124M
#: parameters with its 50,257-token vocabulary; the tokenizer fitted on BBC News uses fewer).
SIZES: dict[str, dict[str, Any]] = {
    "toy": {
        "gpt2": dict(zip(_GPT2, (512, 32, 2, 2, 64), strict=True)),
        "seq_len": 64,
        "batch": 16,
        "articles": 120,
        "epochs": 3,
        "precision": "fp32",
    },
    "gpu": {
        "gpt2": dict(zip(_GPT2, (50257, 768, 12, 12, 1024), strict=True)),
        "seq_len": 1024,
        "batch": 8,
        "articles": 2225,
        "epochs": 3,
        "precision": "bf16",
    },
}
_BARE = "bare Hugging Face loop on one device (same GPT-2, blocks, per-device batch, precision)"
FIGURES = [
    *(
        h.FigureSpec(
            ID,
            f"ratio_{s}",
            f"tokens/s per worker, {s.upper()} ÷ bare (training phase)",
            ">= 0.9",
            _BARE,
        )
        for s in STRATEGIES
    ),
    h.FigureSpec(
        ID, "ratio_deepspeed", "tokens/s per worker, DeepSpeed ZeRO-3 ÷ bare", ">= 0.9", _BARE
    ),
    h.FigureSpec(
        ID,
        f"ratio_{ONE_WORKER}",
        "tokens/s, the loop on 1 worker ÷ bare (CPUs: no partner to wait for)",
        "— (reported)",
        _BARE,
    ),
    h.FigureSpec(ID, "tps_bare", "bare loop, tokens/s", "—", "—"),
    *(
        h.FigureSpec(ID, f"mfu_{a}", f"MFU per worker, {a}", "— (reported)", "—")
        for a in (*STRATEGIES, "deepspeed", "bare")
    ),
]


def size_name(gpu: bool) -> str:
    size = os.environ.get(SIZE_ENV) or ("gpu" if gpu else "toy")
    if size not in SIZES:
        raise ValueError(f"{SIZE_ENV}={size!r}: choose from {', '.join(SIZES)}")
    return size


def _timed_lm_worker(settings: dict[str, Any], threads: int) -> dict[str, Any]:
    """``train_loop_per_worker``: trainflow's loop, each epoch's training phase timed."""
    import torch

    from training.loop.contexts import TrainContext
    from training.loop.loop import run_loop
    from training.model.trainflow_pyfunc.tokens import PAD

    torch.set_num_threads(threads)
    marks: dict[str, Any] = {"train_s": [], "tokens": [], "first_batch": None}

    class TimedContext(TrainContext):
        def train_batches(self, epoch, batch_size, start=0):
            tokens, began = 0, time.perf_counter()
            for features, labels in super().train_batches(epoch, batch_size, start):
                marks["first_batch"] = marks["first_batch"] or time.time()
                tokens += int((features != PAD).sum())
                yield features, labels
            sync()  # the last optimizer step has run: the loop asked for the next batch
            marks["train_s"].append(time.perf_counter() - began)
            marks["tokens"].append(tokens)

    ctx = TimedContext.from_settings(settings)
    history = run_loop(settings, ctx)
    return {**marks, "world_size": ctx.world_size, "val_loss": history[-1]["val_loss"]}


def _engine_arm(config, manifest, storage: str, workers: int, threads: int):
    def run(rep: int) -> dict[str, Any]:
        from training.loop.trainer import build_trainer

        started = time.time()
        trainer = build_trainer(
            config,
            manifest,
            name=f"b11-{config.train.strategy}-{rep}-{uuid.uuid4().hex[:6]}",
            storage_path=storage,
            num_workers=workers,
            train_fn=functools.partial(_timed_lm_worker, threads=threads),
        )
        out = trainer.fit().return_value
        return {
            "tokens_per_s": steady_tokens_per_s(out["tokens"], out["train_s"], out["world_size"]),
            "tokens_per_s_per_worker": steady_tokens_per_s(out["tokens"], out["train_s"]),
            "train_s": out["train_s"],
            "tokens_rank0": out["tokens"],
            "world_size": out["world_size"],
            "val_loss": out["val_loss"],
            "startup_s": out["first_batch"] - started,
            "total_s": time.time() - started,
        }

    return run


def corpus(directory: Path, articles: int) -> str:
    """A parquet of ``articles`` BBC News articles (a seeded sample across the topics)."""
    from training.data.builtin import bbc_news_frame

    frame = bbc_news_frame()
    frame = frame.sample(n=min(articles, len(frame)), random_state=0)
    path = directory / f"bbc-{articles}.parquet"
    frame.reset_index(drop=True).to_parquet(path)
    return str(path)


def lm_config(source: str, size: dict[str, Any], gpu: bool, strategy: str = "ddp"):
    from benchmarks.common import source_config

    return source_config(
        source,
        {
            "data.label_column": "category",
            "data.task": "causal_lm",
            "data.max_length": size["seq_len"],
            "data.pack": True,
            "model.kind": "hf",
            "model.hf": {"config": {"model_type": "gpt2", **size["gpt2"]}, "tokenizer": "train"},
            "train.max_epochs": size["epochs"],
            "train.batch_size": size["batch"],
            "train.lr": 1e-3,
            "train.max_failures": 0,
            "train.checkpoint.num_to_keep": 1,
            "train.use_gpu": gpu,
            "train.precision": size["precision"],
            "train.strategy": strategy,
            "train.resources_per_worker": {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1},
        },
    )


DEEPSPEED_SMOKE = "skipped in the smoke: tests/integration/test_deepspeed.py trains it"


def deepspeed_status(smoke: bool = False) -> str | None:
    """Why the DeepSpeed ZeRO-3 arm does not run (None: it can). The arms build their trainers
    directly, below the run's preflight that keeps a user's DeepSpeed run to GPUs. The smoke
    (CI) leaves it out: its start-up costs CI a minute the suite's own test already spends."""
    if importlib.util.find_spec("deepspeed") is None:
        return DEEPSPEED_SKIPPED
    return DEEPSPEED_SMOKE if smoke else None


def _train_ids(manifest):
    import torch

    from training.data.read import load_split_arrays

    train_x, _, _ = load_split_arrays(manifest, "train")
    return torch.from_numpy(train_x)


def _layout(gpu: bool, size: dict[str, Any]) -> dict[str, int]:
    """Workers and threads: one GPU, or 2 CPU workers x 1 thread; the bare loop on one."""
    return {"workers": 1 if gpu else 2, "threads": 1, "bare_threads": 1}


def _engine_arms(config, manifest, storage: str, plan, strategies, smoke: bool) -> dict:
    """An arm per strategy; with several workers (CPUs, a full run) also the loop on one worker
    stepping on one worker's share of the batch: the loop's own cost, with no partner."""
    arms = {
        s: _engine_arm(
            config.with_overrides({"train.strategy": s}),
            manifest,
            storage,
            plan["workers"],
            plan["threads"],
        )
        for s in strategies
    }
    if plan["workers"] > 1 and not smoke:
        alone = config.with_overrides(
            {"train.batch_size": config.train.batch_size // plan["workers"]}
        )
        arms[ONE_WORKER] = _engine_arm(alone, manifest, storage, 1, plan["threads"])
    return arms


def run(ctx: Context) -> h.Outcome:
    import torch

    register_by_value(__name__)
    register_by_value(mfu.__name__)
    register_by_value("benchmarks.b11_bare_loop")
    gpu = torch.cuda.is_available()
    name = size_name(gpu)
    size = dict(SIZES[name])
    if ctx.smoke:
        size.update(articles=min(size["articles"], 60), epochs=2)
    plan = _layout(gpu, size)
    start_ray(4)
    source = corpus(ctx.scratch("data"), size["articles"])
    config = lm_config(source, size, gpu)
    manifest, preprocess_s, _ = fresh_preprocess(config, ctx.scratch("storage"))
    train_ids, pad_id = _train_ids(manifest), int(manifest.spec.tokens["pad_id"])
    h.log(f"B11: {name} GPT-2, {manifest.rows} blocks of {size['seq_len']} tokens")
    storage = str(ctx.scratch("runs"))
    deepspeed = deepspeed_status(ctx.smoke)
    strategies = (*STRATEGIES, "deepspeed") if deepspeed is None else STRATEGIES
    arms = _engine_arms(config, manifest, storage, plan, strategies, ctx.smoke)
    # The bare loop steps on one worker's share of the global batch: the per-device work.
    bare_size = {**size, "batch": size["batch"] // plan["workers"]}
    arms["bare"] = bare_arm(bare_size, train_ids, pad_id, plan["bare_threads"], gpu)
    samples = h.run_alternating(arms, ctx.reps(3, 1), label=ID)
    flops = mfu.model_flops(bare_model(size, pad_id), size, gpu, plan["bare_threads"])
    return h.Outcome(
        figures=_figures(samples, flops, deepspeed),
        samples=samples,
        params={
            "size": name,
            "gpu": gpu,
            **plan,
            **{k: v for k, v in size.items() if k != "gpt2"},
            "bare_batch": bare_size["batch"],
        },
        notes=_notes(gpu, plan, deepspeed, flops),
        extra={
            "gpt2": size["gpt2"],
            "rows": manifest.rows,
            "preprocess_s": preprocess_s,
            "deepspeed": deepspeed or "ran",
            **flops,
        },
    )


def _figures(samples, flops: dict[str, Any], deepspeed: str | None) -> list[h.Figure]:
    spec = {s.key: s for s in FIGURES}
    bare = h.pluck(samples["bare"], "tokens_per_s")
    figures = []
    for arm in (*STRATEGIES, "deepspeed"):
        key = f"ratio_{arm}"
        ratios = h.paired_ratios(_per_worker(samples[arm]), bare) if arm in samples else []
        # A row that did not run has no goal to meet (the table would show a verdict of nothing).
        note, target = ("", h.Target(">=", 0.9)) if arm in samples else (deepspeed or "", None)
        figures.append(h.Figure(key, spec[key].name, "x", ratios, _BARE, target, note))
    if ONE_WORKER in samples:
        key = f"ratio_{ONE_WORKER}"
        ratios = h.paired_ratios(_per_worker(samples[ONE_WORKER]), bare)
        figures.append(h.Figure(key, spec[key].name, "x", ratios, _BARE))
    figures.append(h.Figure("tps_bare", spec["tps_bare"].name, "tokens/s", bare))
    for arm in (*STRATEGIES, "deepspeed", "bare"):
        if arm not in samples:  # DeepSpeed not installed: said, not measured
            name = spec[f"mfu_{arm}"].name
            figures.append(h.Figure(f"mfu_{arm}", name, "%", [], note=deepspeed or ""))
            continue
        utilisation = [
            mfu.mfu(tps, flops["flops_per_token"], flops["peak_flops"])
            for tps in _per_worker(samples[arm])
        ]
        values = [100 * u for u in utilisation if u is not None]
        note = flops["peak_basis"] if values else "n/a: no known peak for this device"
        figures.append(h.Figure(f"mfu_{arm}", spec[f"mfu_{arm}"].name, "%", values, note=note))
    return figures


def _per_worker(arm_samples: list[dict[str, Any]]) -> list[float]:
    """Each repetition's tokens/s per worker (the bare loop's: its own)."""
    return [s.get("tokens_per_s_per_worker", s["tokens_per_s"]) for s in arm_samples]


def _notes(gpu: bool, plan: dict[str, int], deepspeed: str | None, flops) -> list[str]:
    notes = [
        f"DeepSpeed ZeRO-3: {deepspeed or 'ran'}",
        f"MFU = tokens/s x ({flops['formula']}) / peak; peak: {flops['peak_basis']}",
    ]
    if plan["workers"] == 1:
        notes.append(
            "fsdp on one worker is not sharded: trainflow wraps FSDP from 2 workers on "
            "(training.loop.sharding.prepare), so its row runs the same model as ddp's"
        )
    else:
        notes.append(
            f"{plan['workers']} workers x {plan['threads']} thread, compared per worker with "
            f"the bare loop on {plan['bare_threads']} thread; MFU per worker against one "
            "thread's peak"
        )
    return notes
