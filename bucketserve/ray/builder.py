"""`bucketserve.ray:app`: the Serve application, from the builder's arguments
(`bucketserve.ray.options`): one deployment of `Replica`s, each one engine over the whole
model repository, behind Ray's proxy."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from bucketserve.ray.options import read_options
from bucketserve.ray.replica import Replica


def app(args: dict[str, Any]) -> Application:
    """`serve run bucketserve.ray:app models=./models num_replicas=2`, or a config file's
    `import_path: bucketserve.ray:app` with these as its `args`."""
    options = read_options(dict(args))
    deployment = Replica.options(**options.deployment)  # type: ignore[attr-defined]
    application: Application = deployment.bind(options.settings, options.target_requests)
    return application
