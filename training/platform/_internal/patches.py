"""Changes to Ray's module state that Ray offers no option for."""

from __future__ import annotations

import os

# Ray's switch for a machine that is its own whole cluster (Ray's default on macOS and Windows):
# the node's IP is 127.0.0.1, so every gRPC server, agent and metrics exporter binds loopback.
# Off (Ray's Linux default) the node takes the host's IP and those ports listen on all interfaces.
LOOPBACK_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def keep_local_instance_on_loopback(local: bool) -> None:
    """Every port of a local instance on 127.0.0.1 (docs/reliability.md, "Ports").

    The processes Ray starts read the switch from the environment they inherit; this process
    imported Ray already, so its copy of the constant is set too (Ray reads it at each call).
    A driver joining a cluster (``local`` False) gets Ray's default back: other nodes must
    reach it, and `ray start` refuses to join a cluster with the switch on.
    """
    from ray._private import ray_constants

    if local:
        os.environ.update(LOOPBACK_ONLY_ENV)
    else:
        for key, value in LOOPBACK_ONLY_ENV.items():
            if os.environ.get(key) == value:
                del os.environ[key]
    ray_constants.ENABLE_RAY_CLUSTER = not local and ray_constants.env_bool(
        ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX
    )


# Names of credentials that must never travel in a runtime_env: Ray's runtime-env agent logs
# every runtime_env it creates, and the GCS keeps them. Workers of a local instance inherit
# them from the driver's environment; nodes of a cluster have their own (or an instance role).
CREDENTIAL_ENV_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
)


def keep_credentials_out_of_runtime_envs() -> None:
    """Stop Ray Tune copying the driver's AWS credentials into every trial's runtime_env.

    Tune's actor-class cache (``ray.tune.execution.class_cache``) adds each of these, when set
    in the driver's environment, to the ``env_vars`` of the trial actors' runtime_env — which
    the runtime-env agent then writes to its log in plain text. Tune has no option for it, so
    the names are taken out of its module-level set; nothing else in that set is touched.
    """
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE.difference_update(CREDENTIAL_ENV_VARS)
