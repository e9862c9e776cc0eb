"""bucketserve on a Ray cluster (`pip install 'bucketserve[ray]'`): `app` builds the Serve
application (`serve run bucketserve.ray:app models=./models`); `Embed` embeds a corpus with
Ray Data's `map_batches`, one engine an actor. Above the process's wiring, beside the
`bucketserve` command: a replica is a server without its own sockets."""

from bucketserve.ray.builder import app
from bucketserve.ray.data import Embed

__all__ = ["Embed", "app"]
