"""The engine: every model of a repository, loaded and ready to answer.

The HTTP layer talks to this object only; it owns the models (and, with the server, the
batcher that feeds them).
"""

from __future__ import annotations

from pathlib import Path

from serve.errors import ModelNotFound
from serve.model import Model
from serve.repository import Repository, load_repository


class Engine:
    def __init__(self, repository: Repository, strategy: str | None = None) -> None:
        self.repository = repository
        self.models = {name: Model(spec, strategy) for name, spec in repository.models.items()}

    @classmethod
    def from_path(
        cls, root: Path | str, default_model: str | None = None, strategy: str | None = None
    ) -> Engine:
        return cls(load_repository(Path(root), default_model), strategy)

    def model(self, name: str | None = None) -> Model:
        name = name or self.repository.default_model
        if name is None:
            raise ModelNotFound("no model named and the repository has no default model")
        try:
            return self.models[name]
        except KeyError:
            raise ModelNotFound(f"unknown model '{name}' (have {sorted(self.models)})") from None
