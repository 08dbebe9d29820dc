"""The driver's check of a custom model before any Ray worker starts (``model.kind: custom``),
of a user's training function (``train.function``: it imports and takes one config) or
Lightning (installed, the factory returns a LightningModule), and of a
Hugging Face model (``model.kind: hf``: it loads, its tokenizer fits); and the input's
checks that need no cluster, for the CLI before anything starts (:func:`check_data_now`).

The factory needs the data's shape and outputs; preprocessing (Ray Data) has not run yet, so
they come from what the driver can read cheaply: a finished preprocessing output of the same
fingerprint, else the files' footers or headers (the feature columns, or the image shape) and
one read of the label column alone (its distinct values are the classes).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from training.config import PipelineConfig
from training.errors import ConfigError
from training.manifest import Manifest
from training.storage import filesystem, is_remote

# torch: imported by the checks that build a model, not by the CLI's check of the data.
if TYPE_CHECKING:
    from training.model.factory import ModelSpec

#: CSV and JSON files are parsed whole to read one column: their labels are read before
#: anything starts only below this size (parsing it takes well under a second); above, the
#: summary pass finds the rows without a label. A parquet file's label column is read alone.
LABELS_OF_TEXT_FILES_BELOW_BYTES = 64 * 1024**2


def swept_params(config: PipelineConfig) -> dict[str, Any]:
    """One value per swept ``model.params.<name>`` (the first a trial could take)."""
    return {
        key.split(".", 2)[2]: domain.probe_values()[0]
        for key, domain in config.sweep.search_space.items()
        if key.startswith("model.params.") and config.sweep.enabled
    }


def check_hf(config: PipelineConfig) -> None:
    """A Hugging Face model: its architecture and tokenizer load (a hub id only where the
    network or the cache has it), and the tokenizer and data.max_length fit its embeddings.
    ConfigError otherwise. A tokenizer fitted on the data (``train``) is checked once fitted."""
    from training.model import hf_resolve

    hf = config.model.hf
    architecture = hf_resolve.architecture(hf)
    source = hf_resolve.tokenizer_source(hf)
    vocab = 0
    if source is not None:
        tokenizer = hf_resolve.pretrained_tokenizer(source)
        vocab = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True)
        if config.data.chat_template:
            hf_resolve.chat_template(tokenizer, source)
    hf_resolve.check_fits(architecture, vocab, config.data.max_length)


def check_strategy(config: PipelineConfig) -> None:
    """``train.strategy: deepspeed`` trains on GPUs, with the DeepSpeed extra installed.

    Here, not in the config's schema: the workers validate the same config, and the test
    suite drives the loop's DeepSpeed path on CPU workers (DeepSpeed's CPU accelerator) where
    no GPU is; a user's run on CPUs is better served by FSDP."""
    import importlib.util

    if config.train.strategy != "deepspeed":
        return
    if not config.train.use_gpu:
        raise ConfigError(
            "train.strategy=deepspeed needs GPUs (train.use_gpu: true) and the DeepSpeed extra "
            "(pip install -e '.[deepspeed]'); on CPUs use train.strategy: ddp or fsdp"
        )
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            "train.strategy=deepspeed needs the DeepSpeed package: pip install -e "
            "'.[deepspeed]' where the workers run (or use train.strategy: fsdp)"
        )


def check_data_now(config: PipelineConfig) -> None:
    """The input's checks that need no cluster, for the CLI before Prefect, MLflow or Ray start
    (a second, not the half minute their start-up takes); the flow checks again. ``data.source``
    names files in a format trainflow reads, their footers or headers hold the columns, and no
    row lacks a label where the label column is cheap to read. A bundled data set is
    trainflow's own; a remote source is left to the flow, whose retries reach the endpoint."""
    from training.data.diagnose import count_missing_labels
    from training.data.formats import IMAGES
    from training.data.inputs import input_format, resolve_inputs
    from training.data.schema import check_schema

    data = config.data
    if data.source.startswith("builtin:") or is_remote(data.source):
        return
    files = resolve_inputs(data)
    fmt = input_format(data, files)
    plan = check_schema(data, files, fmt, None)
    if fmt == IMAGES:  # an image's label is its class folder
        return
    if fmt != "parquet" and sum(map(os.path.getsize, files)) >= LABELS_OF_TEXT_FILES_BELOW_BYTES:
        return
    if data.missing_label == "drop":  # counted and said by preprocessing
        return
    missing, rows = count_missing_labels(files, plan, None)
    if missing:
        from training.data.validate import missing_labels_error

        raise missing_labels_error(missing, rows, files, plan, None)


def check_engine(config: PipelineConfig) -> None:
    """``train.engine: function``: ConfigError naming ``train.function`` unless it imports,
    is callable and takes one ``config`` dict. ``train.engine: lightning``: ConfigError naming
    the extra unless Lightning is installed."""
    if config.train.engine == "lightning":
        from training.model.lightning_module import lightning_pytorch

        lightning_pytorch()
    if config.train.engine != "function":
        return
    from training.loop.function_engine import check_function as check_train_function

    check_train_function(str(config.train.function))


def check_model_now(config: PipelineConfig) -> None:
    """The same check from the config alone, for the CLI before Prefect, MLflow or Ray start
    (seconds, not the half minute their start-up takes); the flow checks again."""
    check_strategy(config)
    check_engine(config)
    if config.model.kind == "hf":
        check_hf(config)
        return
    if config.model.kind != "custom":
        return
    from training.data.inputs import resolve_inputs
    from training.model.factory import check_factory
    from training.storage import StorageLayout

    endpoint = config.storage.endpoint_url
    files = resolve_inputs(config.data, endpoint, StorageLayout.from_config(config).root)
    check_factory(
        config.model,
        preview_spec(config, files, None),
        swept_params(config),
        lightning=config.train.engine == "lightning",
    )


def check_model(config: PipelineConfig, files: list[str], fingerprint: str) -> None:
    """ConfigError naming ``model.factory`` unless the factory builds a fitting network (a
    Hugging Face model: unless it and its tokenizer load and fit), or naming the strategy
    where the workers cannot run it, or ``train.function`` when it cannot be called."""
    check_strategy(config)
    check_engine(config)
    if config.model.kind == "hf":
        check_hf(config)
        return
    if config.model.kind != "custom":
        return
    from training.data.preprocess import load_manifest
    from training.model.factory import check_factory
    from training.storage import StorageLayout

    layout = StorageLayout.from_config(config)
    manifest = load_manifest(layout.data_dir(fingerprint), layout.endpoint_url)
    spec = preview_spec(config, files, manifest)
    check_factory(
        config.model, spec, swept_params(config), lightning=config.train.engine == "lightning"
    )


def preview_spec(config: PipelineConfig, files: list[str], manifest: Manifest | None) -> ModelSpec:
    """The spec the model will be built with, read on the driver."""
    from training.model.factory import ModelSpec

    if manifest is not None:
        spec = manifest.spec
        return ModelSpec.of(spec.input_shape, spec.num_outputs, spec.task)
    from training.data.formats import IMAGES
    from training.data.image_files import class_of
    from training.data.inputs import input_format
    from training.data.schema import check_schema

    data, endpoint = config.data, config.storage.endpoint_url
    fmt = input_format(data, files)
    plan = check_schema(data, files, fmt, endpoint)
    if data.image_shape:
        shape = list(data.image_shape)
    elif plan.features:
        shape = [len(plan.features)]
    else:
        shape = [_first_array_width(files[0], fmt, plan.image, endpoint, plan.sheet)]
    if data.task == "regression":
        return ModelSpec.of(shape, 1, "regression")
    # Under data.task=auto a float label may still become a regression once preprocessing
    # looks at it; the factory is then built again with one output.
    if fmt == IMAGES:  # an image folder's classes are its class folders
        return ModelSpec.of(shape, len({class_of(f) for f in files}))
    return ModelSpec.of(shape, _distinct_labels(files, fmt, plan.label, endpoint, plan.sheet))


def _read_column(
    file: str, fmt: str, column: str, endpoint: str | None, sheet: str | int | None = None
):
    from training.data.formats import read_table

    fs, path = filesystem(file, endpoint)
    return read_table(fs, path, fmt, [column], sheet=sheet).column(column)


def _distinct_labels(
    files: list[str], fmt: str, label: str, endpoint: str | None, sheet: str | int | None = None
) -> int:
    import pyarrow.compute as pc

    values: set = set()
    for file in files:
        column = _read_column(file, fmt, label, endpoint, sheet)
        values.update(v for v in pc.unique(column).to_pylist())
    values.discard(None)
    return len(values)


def _first_array_width(
    file: str, fmt: str, column: str | None, endpoint: str | None, sheet: str | int | None = None
) -> int:
    import numpy as np

    cells = _read_column(file, fmt, column or "", endpoint, sheet).slice(0, 1).to_pylist()
    return int(np.asarray(cells[0]).size) if cells else 0
