"""The ``model`` and ``train`` sections: the network and how the one loop trains it."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from training.config.schema_base import Section
from training.config.schema_hf import HFConfig

_Width = Annotated[int, Field(gt=0)]
# "package.module:name": how model.factory and train.function name a user's callable.
_FACTORY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
# Keys of trainflow's own loop that another engine's training does not read: set with it,
# they would be silently ignored. (train.eval_every_steps, compile, profile: set when truthy;
# grad_accum_steps: when not its default of 1.)
_LOOP_ONLY = {
    "hf_trainer": ("eval_every_steps", "compile", "profile"),
    "function": ("eval_every_steps", "compile", "profile", "grad_accum_steps"),
    "lightning": ("eval_every_steps", "compile", "profile", "grad_accum_steps"),
}
# What an engine other than the loop does instead, said where a loop-only key is refused.
_ENGINE_OWNS = {
    "hf_trainer": "train.hf_args passes a Trainer its own",
    "function": "your train.function owns its loop",
    "lightning": "Lightning's Trainer runs your LightningModule",
}
# The Ray strategies an engine's training takes (train.strategy); the loop takes every one.
_ENGINE_STRATEGIES = {"hf_trainer": ("ddp",), "function": ("ddp",), "lightning": ("ddp", "fsdp")}


class ModelConfig(Section):
    """The network: mlp (features), cnn or resnet18 (images, data.image_shape), custom, or hf
    (a Hugging Face model over a text column)."""

    kind: Literal["mlp", "cnn", "resnet18", "custom", "hf"] = Field("mlp", description="network")
    factory: str | None = Field(None, description='custom: "package.module:function"')
    params: dict[str, Any] = Field({}, description="custom: the factory's kwargs (sweepable)")
    hidden_sizes: list[_Width] = Field([128, 64], min_length=1, description="MLP widths")
    channels: list[_Width] = Field([16, 32], min_length=1, description="CNN conv channels")
    cnn_hidden: int = Field(64, gt=0, description="width of the CNN's dense layer")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout probability")
    hf: HFConfig | None = Field(None, description="hf: the Hugging Face model and tokenizer")

    @model_validator(mode="after")
    def _factory_for_custom(self) -> ModelConfig:
        if (self.kind == "custom") != (self.factory is not None):
            raise ValueError("model.factory goes with model.kind=custom, and custom needs it")
        if (self.kind == "hf") != (self.hf is not None):
            raise ValueError("model.hf goes with model.kind=hf, and hf needs it")
        if self.factory and not _FACTORY.fullmatch(self.factory):
            raise ValueError(f"model.factory={self.factory!r}: give 'package.module:function'")
        return self


class CheckpointSettings(Section):
    """Ray Train checkpoint retention."""

    num_to_keep: int = Field(2, ge=1, description="checkpoints kept per run (best by score)")
    score_attribute: str = Field("val_accuracy", description="metric that ranks checkpoints")
    score_order: Literal["max", "min"] = Field("max", description="max | min")
    every_n_batches: int = Field(
        0, ge=0, description="final training: also checkpoint every N batches (0 = epoch ends)"
    )


class ProfileSettings(Section):
    """``train.profile``: a torch.profiler trace of the final training's rank 0."""

    steps: int = Field(
        3, ge=1, description="optimizer steps recorded, after one skipped and one warm-up step"
    )


class DeepSpeedSettings(Section):
    """``train.deepspeed``: DeepSpeed's engine (``train.strategy: deepspeed``)."""

    stage: Literal[2, 3] = Field(
        3, description="ZeRO stage: 2 partitions gradients and optimizer state, 3 parameters too"
    )


class TrainConfig(Section):
    """Final distributed training (Ray Train TorchTrainer) and the loop's hyperparameters."""

    num_workers: int | tuple[int, int] = Field(
        2, description="DDP workers: an int, or [min, max] for elastic training"
    )
    use_gpu: bool = Field(False, description="one GPU per worker (backend auto -> nccl)")
    resources_per_worker: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1.0}, description="Ray resources of each worker"
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    strategy: Literal["ddp", "fsdp", "deepspeed"] = Field(
        "ddp", description="ddp | fsdp (sharded params) | deepspeed (ZeRO; GPUs, the extra)"
    )
    deepspeed: DeepSpeedSettings = Field(default_factory=DeepSpeedSettings)
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl with GPUs, else gloo"
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16: forward passes under torch.autocast(bfloat16)"
    )
    elastic_resize_interval_s: float = Field(
        60.0, gt=0, description="elastic [min, max]: how often a running group looks for nodes"
    )
    timeout_s: int = Field(1800, gt=0, description="torch.distributed init/collective timeout")
    shard_cache_mb: int = Field(
        512,
        ge=0,
        description="a worker keeps its data shard in memory (on its GPU with use_gpu) when it "
        "fits in this many MiB, read once through Ray Data; 0 = stream every epoch",
    )
    max_epochs: int = Field(20, ge=1, description="epochs of the final training")
    batch_size: int = Field(64, ge=1, description="global batch size (split across workers)")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(1e-4, ge=0, description="AdamW weight decay")
    lr_schedule: Literal["constant", "cosine"] = Field("cosine", description="constant | cosine")
    warmup_ratio: float = Field(
        0.0, ge=0, lt=1, description="fraction of the optimizer steps the LR ramps up over"
    )
    grad_accum_steps: int = Field(
        1, ge=1, description="micro-batches per optimizer step on each worker (same global batch)"
    )
    gradient_checkpointing: bool = Field(
        False, description="model.kind=hf: recompute activations in backward (less memory)"
    )
    eval_every_steps: int | None = Field(
        None,
        ge=1,
        description="final training: also validate every N optimizer steps (MLflow step/val_*); "
        "unset = at epoch ends only",
    )
    compile: bool = Field(
        False, description="torch.compile the training steps (eager, with a warning, if it fails)"
    )
    profile: ProfileSettings | None = Field(
        None, description="final training: record {steps: N} optimizer steps with torch.profiler"
    )
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    max_failures: int = Field(1, ge=-1, description="worker-group restarts allowed; -1 = forever")
    seed: int = Field(0, ge=0, description="seed of init, shuffling and dropout")
    engine: Literal["loop", "hf_trainer", "function", "lightning"] = Field(
        "loop",
        description="loop | hf_trainer (a transformers.Trainer per worker; model.kind hf) | "
        "function (your own train_loop_per_worker: train.function) | lightning (model.factory "
        "returns a LightningModule; the [lightning] extra)",
    )
    function: str | None = Field(
        None,
        description='engine function: "package.module:train_func", run as Ray Train\'s '
        "train_loop_per_worker(config) (docs/your-training-code.md)",
    )
    hf_args: dict[str, Any] = Field(
        {}, description="hf_trainer: extra transformers.TrainingArguments (not trainflow's own)"
    )

    @field_validator("num_workers")
    @classmethod
    def _valid_workers(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        if isinstance(value, int):
            if value < 1:
                raise ValueError("must be >= 1")
            return value
        low, high = value
        if low < 1 or high < low:
            raise ValueError("elastic [min, max] needs 1 <= min <= max")
        return (low, high) if low != high else low

    @field_validator("hf_args")
    @classmethod
    def _usable_hf_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        from training.config.hf_args import hf_args_problems

        problems = hf_args_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("resources_per_worker")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        if any(v < 0 for v in value.values()):
            raise ValueError("resource amounts must be >= 0")
        return value

    @model_validator(mode="after")
    def _gpu_backend(self) -> TrainConfig:
        if self.backend == "nccl" and not self.use_gpu:
            raise ValueError("train.backend=nccl needs train.use_gpu=true; use gloo on CPUs")
        if self.engine != "loop":
            self._check_engine_keys()
        if self.hf_args and self.engine != "hf_trainer":
            raise ValueError("train.hf_args goes with train.engine=hf_trainer")
        if (self.function is not None) != (self.engine == "function"):
            raise ValueError(
                "train.function goes with train.engine=function, and engine function needs it "
                '(train.function: "package.module:train_func")'
            )
        if self.function and not _FACTORY.fullmatch(self.function):
            raise ValueError(f"train.function={self.function!r}: give 'package.module:function'")
        if self.strategy == "deepspeed" and self.compile:
            raise ValueError(
                "train.compile compiles the loop's DDP/FSDP steps; with train.strategy=deepspeed "
                "set train.compile: false"
            )
        return self

    def _check_engine_keys(self) -> None:
        """An engine other than trainflow's loop trains with DDP (Lightning's also with FSDP),
        checkpoints at epoch ends and refuses the loop's own keys, naming them."""
        engine = self.engine
        if self.strategy not in _ENGINE_STRATEGIES[engine]:
            taken = " or ".join(name.upper() for name in _ENGINE_STRATEGIES[engine])
            raise ValueError(
                f"train.engine={engine} trains with {taken}: train.strategy={self.strategy} is "
                "the loop's"
            )
        if engine == "lightning" and self.strategy == "fsdp" and not self.use_gpu:
            # Lightning refuses its FSDPStrategy on a CPU accelerator; Ray's subclass slips
            # past that check only to fail in the workers.
            raise ValueError(
                "train.engine=lightning with train.strategy=fsdp trains on GPUs (Lightning's "
                "FSDP needs CUDA): set train.use_gpu: true, or train.strategy: ddp on CPUs"
            )
        if self.checkpoint.every_n_batches:
            raise ValueError(
                f"train.engine={engine} checkpoints at epoch ends: "
                "train.checkpoint.every_n_batches is the loop's"
            )
        loop_only = [
            f"train.{key}"
            for key in _LOOP_ONLY[engine]
            if (getattr(self, key) != 1 if key == "grad_accum_steps" else getattr(self, key))
        ]
        if loop_only:
            raise ValueError(
                f"{', '.join(loop_only)}: trainflow's loop only (train.engine=loop); "
                f"{_ENGINE_OWNS[engine]}"
            )

    @property
    def epochs_from_reports(self) -> bool:
        """Whether the user's code makes the Ray Train reports (a function, or Lightning's
        report callback after each epoch of the user's module): one report is one epoch, and
        the history is built from them rather than carried in trainflow's checkpoints."""
        return self.engine in ("function", "lightning")

    @property
    def torch_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.use_gpu else "gloo"

    @property
    def max_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]

    @property
    def min_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]
