"""``python -m benchmarks``: run B1-B7, write results/*.json, regenerate docs/benchmark-figures.md.

Each benchmark runs in a child process of its own (a fresh local Ray instance, a private
trainflow home in a temporary directory, a time limit); a failure is recorded in that
benchmark's JSON and the suite goes on.

    python -m benchmarks                      # the full suite (~30 min on 2 cores)
    python -m benchmarks --only B1,B3         # a selection
    python -m benchmarks --smoke              # every size shrunk; results/smoke/, docs untouched
    python -m benchmarks --render             # only regenerate the docs table from the JSON
    python -m benchmarks --only B11 --size gpu  # B11's GPT-2 size: toy (CPU) or gpu (~124M)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

from benchmarks import BENCHMARKS, figure_specs, load
from benchmarks import harness as h
from benchmarks.common import REPO_ROOT, Context, configure_process, remove, stop_ray
from benchmarks.doc_tables import format_value, update_docs
from benchmarks.result_files import load_results, machine_info, make_result, write_result

B11_SIZE_ENV = "TRAINFLOW_B11_SIZE"  # read by benchmarks.b11_lm_throughput (not imported here)
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
DOCS = REPO_ROOT / "docs" / "benchmark-figures.md"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--smoke", action="store_true", help="shrink every size (seconds scale)")
    parser.add_argument("--only", default="", help="comma-separated ids, e.g. B1,B3")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results directory (default benchmarks/results, or benchmarks/results/smoke)",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        default=None,
        help="markdown file whose tables to regenerate (default docs/benchmark-figures.md for a "
        "full run; a smoke run touches no docs unless given)",
    )
    parser.add_argument("--no-docs", action="store_true", help="leave the docs alone")
    parser.add_argument("--render", action="store_true", help="only regenerate the docs table")
    parser.add_argument("--reps", type=int, default=None, help="override repetitions (>= 1)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per benchmark")
    parser.add_argument("--keep-work", action="store_true", help="keep scratch directories")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--size",
        choices=("toy", "gpu"),
        default=None,
        help="B11's model size (default: gpu where CUDA is, else toy)",
    )
    # Internal: run one benchmark in this process (the parent starts one child per benchmark).
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--suite-id", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shared", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--selection", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be >= 1")
    return args


def _selection(only: str) -> list[str]:
    if not only.strip():
        return list(BENCHMARKS)
    wanted = [part.strip().upper() for part in only.split(",") if part.strip()]
    for bench_id in wanted:
        load(bench_id)  # raises on an unknown id
    return [b for b in BENCHMARKS if b in wanted]


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        return args.out.resolve()
    return RESULTS_DIR / "smoke" if args.smoke else RESULTS_DIR


# ---------------------------------------------------------------------------------------------
# Child: one benchmark in this process


def run_child(args: argparse.Namespace) -> int:
    bench_id = args.child.upper()
    module = load(bench_id)
    out_dir = _out_dir(args)
    workdir = Path(tempfile.mkdtemp(prefix=f"trainflow-bench-{bench_id}-"))
    ctx = Context(
        smoke=args.smoke,
        workdir=workdir,
        out_dir=out_dir,
        selection=[s for s in args.selection.split(",") if s] or [bench_id],
        suite_id=args.suite_id or uuid.uuid4().hex[:12],
        shared_dir=args.shared,
        reps_override=args.reps,
    )
    machine = machine_info()
    started = time.perf_counter()
    outcome, error = None, None
    try:
        configure_process(workdir / "home")
        outcome = module.run(ctx)
    except BaseException as exc:  # recorded in the JSON; an interrupt still stops the suite
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        with contextlib.suppress(Exception):
            stop_ray()
        doc = make_result(
            bench_id,
            module.TITLE,
            outcome,
            smoke=args.smoke,
            duration_s=time.perf_counter() - started,
            machine=machine,
            error=error,
            suite_id=ctx.suite_id,
        )
        path = write_result(doc, out_dir)
        h.log(f"{bench_id}: wrote {path}")
        if not args.keep_work:
            remove(workdir)
    return 0 if error is None else 1


# ---------------------------------------------------------------------------------------------
# Parent: one child per benchmark, then the docs


def _child_command(args: argparse.Namespace, bench_id: str, suite_id: str, shared: Path, selection):
    cmd = [sys.executable, "-m", "benchmarks", "--child", bench_id, "--out", str(_out_dir(args))]
    cmd += ["--suite-id", suite_id, "--shared", str(shared), "--selection", ",".join(selection)]
    if args.smoke:
        cmd.append("--smoke")
    if args.reps is not None:
        cmd += ["--reps", str(args.reps)]
    if args.keep_work:
        cmd.append("--keep-work")
    return cmd


def _run_one(args, bench_id: str, suite_id: str, shared: Path, selection: list[str]) -> dict:
    module = load(bench_id)
    limit = args.timeout or module.TIMEOUT_S[1 if args.smoke else 0]
    cmd = _child_command(args, bench_id, suite_id, shared, selection)
    h.log(f"{bench_id}: {module.TITLE} (limit {limit:.0f} s)")
    started = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    if args.size:
        env[B11_SIZE_ENV] = args.size

    def failed(error: str) -> dict:
        """Record a benchmark that produced no result of its own, so the suite goes on."""
        doc = make_result(
            bench_id,
            module.TITLE,
            None,
            smoke=args.smoke,
            duration_s=time.perf_counter() - started,
            error=error,
            suite_id=suite_id,
        )
        write_result(doc, _out_dir(args))
        return doc

    # A session of its own: on a timeout the child and everything it started can be stopped.
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, start_new_session=True)
    try:
        proc.wait(timeout=limit)
    except KeyboardInterrupt:
        _stop_group(proc)
        raise
    except subprocess.TimeoutExpired:
        h.log(f"{bench_id}: over its {limit:.0f} s limit; stopping it")
        _stop_group(proc)
        failed(f"timed out after {limit:.0f} s")
    path = _out_dir(args) / f"{bench_id}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = failed(f"the child exited with {proc.returncode} and wrote no result")
    if doc.get("suite_id") != suite_id:
        doc = failed(f"the child exited with {proc.returncode} before writing its result")
    return doc


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def _summary_line(doc: dict) -> str:
    if doc["status"] == "error":
        return f"{doc['id']}: ERROR {doc['error']}"
    parts = []
    for fig in doc["figures"]:
        if fig.get("target") is None:
            continue
        verdict = {True: "pass", False: "FAIL", None: "?"}[fig["pass"]]
        value = format_value(fig["value"], fig["unit"])
        parts.append(f"{fig['key']}={value} (target {fig['target']['text']}: {verdict})")
    return f"{doc['id']} ({doc['duration_s']:.0f} s): " + ("; ".join(parts) or "no targets")


def render_docs(args: argparse.Namespace) -> Path | None:
    if args.no_docs:
        return None
    docs = args.docs or (None if args.smoke else DOCS)
    if docs is None:
        return None
    results = load_results(_out_dir(args))
    update_docs(docs, figure_specs(), results, include_smoke=args.smoke)
    return docs


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for bench_id in BENCHMARKS:
            print(f"{bench_id}  {load(bench_id).TITLE}")
        return 0
    if args.child:
        return run_child(args)
    if args.render:
        docs = render_docs(args)
        h.log(f"regenerated {docs}")
        return 0
    selection = _selection(args.only)
    suite_id = uuid.uuid4().hex[:12]
    shared = Path(tempfile.mkdtemp(prefix="trainflow-bench-shared-"))
    started = time.perf_counter()
    docs_written = None
    docs_for_run = args.docs or (None if args.smoke else DOCS)
    h.log(
        f"suite {suite_id}: {','.join(selection)}{' (smoke)' if args.smoke else ''}; results in "
        f"{_out_dir(args)}"
    )
    failed = []
    try:
        for bench_id in selection:
            doc = _run_one(args, bench_id, suite_id, shared, selection)
            if doc["status"] != "ok":
                failed.append(bench_id)
            print(_summary_line(doc), flush=True)
            # Regenerate after each benchmark: an interrupted suite still leaves a current table.
            if not args.no_docs and docs_for_run is not None:
                docs_written = render_docs(args)
    finally:
        remove(shared)
    total = time.perf_counter() - started
    print(f"suite finished in {total:.0f} s ({total / 60:.1f} min)", flush=True)
    if docs_written:
        print(f"regenerated {docs_written}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
