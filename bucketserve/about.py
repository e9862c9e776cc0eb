"""What this server is: its name and version (pyproject.toml's, read once, here), as the
package, the HTTP and the gRPC edges say them."""

from __future__ import annotations

from importlib.metadata import version

NAME = "bucketserve"
VERSION = version(NAME)
