"""A real two-node Ray cluster and a real S3 API on loopback, shared by the multi-node tests.

Two `ray start` nodes (a head and a worker, 2 logical CPUs each, separate temp dirs, every port
chosen free) and `moto_server`. Each process runs in a session of its own and is torn down by
killing that process group: never `ray stop`, which kills every Ray process on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
BUCKET = "trainflow-tests"
# One training worker per node: each node offers one `trainslot` and each worker takes one, so
# the final training spreads over both nodes and a lost node leaves room for exactly one.
SLOT = "trainslot"
CREDENTIALS = {
    # moto accepts any credentials; real ones come from the environment the same way.
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "tf-secret-7f3a9c",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    from training.platform.cluster import free_port as _free_port

    return _free_port()


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers (maybe asking for a token): it is up
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    """Kill the process group this fixture started (our own processes only)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(proc):
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 8
        while _group_alive(proc) and time.monotonic() < deadline:
            time.sleep(0.2)
    proc.wait(timeout=10)


def _group_alive(proc: subprocess.Popen) -> bool:
    """Any live (not zombie) process left in the group; reaps our direct child on the way."""
    proc.poll()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == proc.pid and fields[0] != "Z":
            return True
    return False


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]
    proc: subprocess.Popen

    def fs(self):
        from training.storage import filesystem

        return filesystem(f"s3://{BUCKET}", self.endpoint)[0]

    def ls(self, prefix: str) -> list[str]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True, allow_not_found=True)
        return [i.path for i in self.fs().get_file_info(selector)]


@dataclass
class RayNode:
    proc: subprocess.Popen
    temp_dir: str
    log: Path

    def stop(self) -> None:
        _stop(self.proc)


@dataclass
class RayCluster:
    address: str
    dashboard_url: str
    env: dict[str, str]
    workdir: Path
    head: RayNode
    workers: list[RayNode] = field(default_factory=list)

    def start_worker(self, attempts: int = 3) -> RayNode:
        """Join a worker node; a second try with fresh ports if the first never registers.

        The ports are picked free a moment before `ray start` binds them, so on a busy machine
        another process can take one in between and the raylet dies at start-up: that is this
        fixture's race, not the cluster's behaviour under test.
        """
        name = f"worker{len(self.workers)}"
        for attempt in range(1, attempts + 1):
            node = _start_node(self.env, self.workdir, f"{name}-{attempt}", join=self.address)
            try:
                self.wait_for_nodes(2, node=node)
            except TimeoutError as err:
                node.stop()
                shutil.rmtree(node.temp_dir, ignore_errors=True)
                if attempt == attempts:
                    tail = node.log.read_text(errors="replace")[-3000:]
                    raise TimeoutError(f"worker node never joined; its log ends:\n{tail}") from err
                continue
            self.workers.append(node)
            return node
        raise AssertionError("unreachable")

    def alive_nodes(self) -> list:
        from ray.util.state import list_nodes

        # Filter here: a server-side filter that drops dead nodes reads as "truncated output".
        nodes = list_nodes(address=self.dashboard_url, limit=1000)
        return [n for n in nodes if n.state == "ALIVE"]

    def wait_for_nodes(self, count: int, timeout: float = 90, node: RayNode | None = None) -> None:
        """Wait until ``count`` nodes are alive; give up early if ``node``'s `ray start` exited."""
        deadline = time.monotonic() + timeout
        while len(self.alive_nodes()) != count:
            if node is not None and node.proc.poll() is not None:
                raise TimeoutError(f"`ray start` for {node.log.stem} exited {node.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster did not reach {count} alive nodes")
            time.sleep(1)

    def train_workers(self) -> list:
        """Every Ray Train worker actor the cluster ran (alive or dead), with its node id."""
        from ray.util.state import list_actors

        return list_actors(
            address=self.dashboard_url,
            filters=[("class_name", "=", "RayTrainWorker")],
            limit=1000,
            detail=True,
        )


def _start_node(
    env: dict, workdir: Path, name: str, *, join: str | None = None, head_ports=(0, 0)
) -> RayNode:
    """A `ray start --block` node: the head (``head_ports`` = GCS, dashboard) or one joining
    the cluster at ``join``."""
    # Short temp dirs: Ray's socket paths must stay under the OS limit of ~107 characters.
    temp_dir = tempfile.mkdtemp(prefix=f"tf{name[:1]}", dir="/tmp")
    ports = {
        "--node-manager-port": free_port(),
        "--object-manager-port": free_port(),
        "--metrics-export-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--runtime-env-agent-port": free_port(),
    }
    cmd = [
        str(BIN / "ray"),
        "start",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=2",
        f"--resources={json.dumps({SLOT: 1})}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        *(f"{flag}={port}" for flag, port in ports.items()),
    ]
    if join is None:
        gcs_port, dashboard_port = head_ports
        cmd += [
            "--head",
            f"--port={gcs_port}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--ray-client-server-port={free_port()}",
        ]
    else:
        cmd += [f"--address={join}"]
    log = workdir / f"ray-{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return RayNode(proc=proc, temp_dir=temp_dir, log=log)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    """`moto_server` on a free loopback port, with one bucket."""
    import pyarrow.fs as pafs

    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{port}"
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        _wait_http(f"{endpoint}/moto-api/", timeout=60)
        server = S3Server(endpoint=endpoint, env=env, proc=proc)
        # The bucket is the test's set-up, made by an admin client: trainflow never creates buckets.
        admin = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True
        )
        admin.create_dir(BUCKET)
        assert server.fs().get_file_info(BUCKET).type == pafs.FileType.Directory
        yield server
    finally:
        _stop(proc)
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _ensure_auth_token() -> None:
    """`ray start --head` with token auth refuses to start without a token, which a fresh
    machine lacks until something runs `ray.init` (it makes ~/.ray/auth_token). Make it the
    way `ray get-auth-token --generate` does, unless one is already given or on disk."""
    from ray._private.authentication.authentication_token_setup import (
        _get_default_token_path,
        generate_and_save_token,
    )

    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    if not _get_default_token_path().exists():
        generate_and_save_token()


@pytest.fixture(scope="session")
def ray_cluster(s3_server, tmp_path_factory) -> RayCluster:
    """A head node and one worker node, both `ray start` processes on 127.0.0.1."""
    workdir = tmp_path_factory.mktemp("ray-cluster")
    gcs_port, dashboard_port = free_port(), free_port()
    env = {
        **os.environ,
        **s3_server.env,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    # A user's State API address is for another cluster; these nodes must not inherit it.
    env.pop("RAY_API_SERVER_ADDRESS", None)
    # A local instance started earlier in this process keeps Ray on loopback with this switch,
    # which `ray start` refuses for a worker node; these nodes are on 127.0.0.1 by their flags.
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    # Ray sends every State API call of this process to RAY_API_SERVER_ADDRESS when it is set,
    # whatever address the call names: this fixture's queries must reach its own head.
    previous_api_server = os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    # `ray start` turns token authentication on when ~/.ray/auth_token exists (Ray 2.60); the
    # State API client in this process must then send the token too.
    previous_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    env["RAY_AUTH_MODE"] = os.environ["RAY_AUTH_MODE"]  # a joining node does not infer it
    _ensure_auth_token()
    head = _start_node(env, workdir, "head", head_ports=(gcs_port, dashboard_port))
    address = f"127.0.0.1:{gcs_port}"
    cluster = RayCluster(
        address=address,
        dashboard_url=f"http://127.0.0.1:{dashboard_port}",
        env=env,
        workdir=workdir,
        head=head,
    )
    try:
        _wait_http(f"{cluster.dashboard_url}/api/version", timeout=120)
        cluster.wait_for_nodes(1)
        cluster.start_worker()
        yield cluster
    finally:
        for node in [*cluster.workers, head]:
            node.stop()
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        if previous_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        if previous_api_server is not None:
            os.environ["RAY_API_SERVER_ADDRESS"] = previous_api_server
