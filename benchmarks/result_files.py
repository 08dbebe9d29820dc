"""Result documents: ``benchmarks/results/<ID>.json``, schema ``trainflow-bench/1``.

``make_result`` turns a benchmark's ``Outcome`` into the document (with the machine it ran on),
``validate_result`` checks it, ``write_result`` writes it atomically and ``load_results`` reads a
directory of them back.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness import Outcome

SCHEMA = "trainflow-bench/1"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Where the numbers come from: CPU count and model, memory, versions, load at the start."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "nproc": affinity,
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {m: _version(m) for m in ("torch", "ray", "prefect", "mlflow", "pyarrow")},
        "loadavg_start": load,
    }


def machine_label(machine: Mapping[str, Any] | None) -> str:
    if not machine:
        return ""
    model = re.sub(r"\s+", " ", str(machine.get("cpu_model") or "?"))
    model = re.sub(r"\((R|TM)\)|CPU |Processor", "", model).strip()
    memory = machine.get("memory_gib")
    mem = f", {memory:g} GiB" if isinstance(memory, int | float) else ""
    return f"{machine.get('nproc', '?')} CPU{mem}, {model}"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def make_result(
    bench_id: str,
    title: str,
    outcome: Outcome | None,
    *,
    smoke: bool,
    duration_s: float,
    machine: Mapping[str, Any] | None = None,
    error: str | None = None,
    suite_id: str | None = None,
) -> dict[str, Any]:
    """The JSON document of one benchmark (see ``validate_result`` for the schema)."""
    figures = [f.to_dict() for f in outcome.figures] if outcome else []
    failures = ([error] if error else []) + (list(outcome.errors) if outcome else [])
    error = "; ".join(failures) or None
    checked = [f["pass"] for f in figures if f["target"] is not None]
    verdict = None if not checked or None in checked else all(checked)
    return {
        "schema": SCHEMA,
        "id": bench_id,
        "title": title,
        "status": "error" if error else "ok",
        "error": error,
        "smoke": smoke,
        "suite_id": suite_id,
        "date": now_iso(),
        "machine": dict(machine) if machine is not None else machine_info(),
        "duration_s": round(duration_s, 2),
        "pass": verdict,
        "figures": figures,
        "params": outcome.params if outcome else {},
        "samples": outcome.samples if outcome else {},
        "notes": outcome.notes if outcome else [],
        "extra": outcome.extra if outcome else {},
    }


_REQUIRED = {
    "schema": str,
    "id": str,
    "title": str,
    "status": str,
    "smoke": bool,
    "date": str,
    "machine": dict,
    "duration_s": int | float,
    "figures": list,
    "params": dict,
    "samples": dict,
    "notes": list,
}
_FIGURE_REQUIRED = {"key": str, "name": str, "unit": str, "anchor": str, "stats": dict}


def validate_result(doc: Mapping[str, Any]) -> list[str]:
    """Problems with a result document (empty list: valid)."""
    problems = []
    for key, kind in _REQUIRED.items():
        if key not in doc:
            problems.append(f"missing {key!r}")
        elif not isinstance(doc[key], kind):
            problems.append(f"{key!r} is {type(doc[key]).__name__}, expected {kind}")
    if problems:
        return problems
    if doc["schema"] != SCHEMA:
        problems.append(f"schema {doc['schema']!r} is not {SCHEMA!r}")
    if doc["status"] not in ("ok", "error"):
        problems.append(f"status {doc['status']!r} is not ok/error")
    if doc["status"] == "error" and not doc.get("error"):
        problems.append("status error without an error message")
    if doc["status"] == "ok" and not doc["figures"]:
        problems.append("status ok but no figures")
    for machine_key in ("nproc", "memory_gib", "cpu_model"):
        if machine_key not in doc["machine"]:
            problems.append(f"machine lacks {machine_key!r}")
    for index, fig in enumerate(doc["figures"]):
        for key, kind in _FIGURE_REQUIRED.items():
            if not isinstance(fig.get(key), kind):
                problems.append(f"figures[{index}].{key} missing or not {kind}")
        if "value" not in fig or not (
            fig["value"] is None or isinstance(fig["value"], int | float)
        ):
            problems.append(f"figures[{index}].value is not a number or null")
        target = fig.get("target")
        if target is not None and not {"op", "value", "text"} <= set(target):
            problems.append(f"figures[{index}].target lacks op/value/text")
        if fig.get("pass") not in (True, False, None):
            problems.append(f"figures[{index}].pass is not true/false/null")
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"not strict JSON: {exc}")
    return problems


def _jsonable(value: Any) -> Any:
    """NaN/inf -> None, numpy scalars/arrays -> Python, tuples -> lists, recursively."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def write_result(doc: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<ID>.json`` atomically; refuse an invalid document."""
    clean = _jsonable(dict(doc))
    problems = validate_result(clean)
    if problems:
        raise ValueError(f"invalid result for {doc.get('id')}: {problems}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{clean['id']}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(clean, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def load_results(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every valid ``B*.json`` in a directory, by id (invalid files are skipped)."""
    results = {}
    for path in sorted(Path(out_dir).glob("B*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and not validate_result(doc):
            results[doc["id"]] = doc
    return results
