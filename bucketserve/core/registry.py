"""The registry: what the server serves, by model name and version, and the state of every model
of the repository. One entry per name, in one of three states: serving (its versions), failed
(it did not load at start, and why) or unloaded (by a client, through model control).

Every edge asks it (readiness, metadata, the repository index); the engine resolves a call's
model through it; model control changes it (`put`, `remove`), with names it has checked
(`check_name`: what a model's name may be). It holds no scheduler and starts
nothing: what runs is the engine's. A call without a model goes to one that serves its task
(`for_task`). A model also answers to its aliases (its config's, and the operator's); a call
whose route stands in for a server that ignores model names may name one it does not know
(`resolve`'s `stand_in`). Imports only the model, the tasks and the errors below it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from bucketserve.core.model import Model
from bucketserve.core.task import Task
from bucketserve.errors import (
    ConfigError,
    MalformedRequest,
    ModelNotFound,
    ModelNotReady,
    TaskNotServed,
    quoted,
)

FAILED_RETRY_AFTER_S = 60  # a model that did not load stays so until the server restarts
MAX_NAME_CHARS = 128
NOT_IN_A_NAME = frozenset("/\\\0")  # separators (and NUL), on any system a repository may be on


def check_name(name: str) -> str:
    """`name` as a model's name: one folder of the repository (no separator, not `.` or `..`,
    no control character, at most MAX_NAME_CHARS), or MalformedRequest. Checked before a
    name reaches the filesystem (model control), whichever protocol brought it."""
    shown = quoted(name)
    if not name or len(name) > MAX_NAME_CHARS:
        raise MalformedRequest(f"model name {shown}: 1 to {MAX_NAME_CHARS} characters")
    if name in (".", "..") or NOT_IN_A_NAME & set(name):
        raise MalformedRequest(
            f"model name {shown}: a model's name is one folder of the repository, not a path"
        )
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise MalformedRequest(f"model name {shown}: no control characters")
    return name


class State(Enum):
    SERVING = "serving"
    FAILED = "failed"  # at start: it stays so until the server restarts
    UNLOADED = "unloaded"
    UNBUILT = "unbuilt"  # an on-demand model (minilm) whose files are not built yet


@dataclass(frozen=True)
class Entry:
    """One model name's state: its versions while serving, or why it is not served."""

    state: State
    versions: Mapping[int, Model] = field(default_factory=dict)  # by number, oldest first
    reason: str = ""  # why it is not served

    @property
    def newest(self) -> Model:
        """The version a request that names none gets."""
        return self.versions[max(self.versions)]


class Registry:
    def __init__(
        self,
        models: Mapping[str, Model | Mapping[int, Model]],
        default_model: str | None = None,
        failed: Mapping[str, str] | None = None,
        unbuilt: Mapping[str, str] | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        """`models`: each name's model, or its versions by number. `failed`: models of the
        repository that did not load, and why (reported, never served). `unbuilt`: on-demand
        models not built yet, and the recipe that builds each. `default_model`: the model of a
        request that names none. `aliases`: the operator's other names of models (alias ->
        name), beside those each model's config gives it; ConfigError where two claim one."""
        self.default_model = default_model
        self._operators = dict(aliases or {})
        self._aliases: dict[str, str] = {}  # every alias served, -> its model's name
        self._entries: dict[str, Entry] = {
            name: Entry(State.UNBUILT, reason=f"not built: `bucketserve models build {recipe}`")
            for name, recipe in (unbuilt or {}).items()
        }
        self._entries |= {
            name: Entry(State.FAILED, reason=why) for name, why in (failed or {}).items()
        }
        for name, given in models.items():
            versions = given if isinstance(given, Mapping) else {given.info.version: given}
            self.put(name, versions)
        unknown = sorted(set(self._operators.values()) - set(self._entries))
        if unknown:
            raise ConfigError(
                f"served_model_name: no model {', '.join(map(quoted, unknown))} in the "
                "repository to answer to it"
            )
        self._aliases = self._aliases_of(self._entries)

    # -- asked by the edges and the engine ----------------------------------------------------

    def resolve(
        self,
        name: str | None = None,
        version: str | None = None,
        task: Task = Task.PREDICT,
        stand_in: bool = False,
    ) -> Model:
        """The model served under `name` or an alias of it (when None: `for_task`), at
        `version` if one is named (a version is a path segment or a field as sent: digits, or
        refused). With `stand_in`, a name it does not know goes to the one model that serves
        `task` (`stand_in_for`)."""
        name = name or self.for_task(task)
        if name is not None and name not in self._entries:
            name = self._aliases.get(name, name)
            if stand_in and not self.knows(name):
                name = self.stand_in_for(name, task)
        if name is None:
            raise ModelNotFound("no model named, and the repository has no default model")
        entry = self._entries.get(name)
        if entry is None:  # (never a list of the others: readiness routes answer anyone)
            raise ModelNotFound(
                f"unknown model {quoted(name)} (the repository index lists those served)",
                param="model",
            )
        if entry.state is State.UNLOADED:
            raise ModelNotFound(f"model {name} is not loaded (it was unloaded)", param="model")
        if entry.state is State.UNBUILT:
            raise ModelNotFound(
                f"model {name} is {entry.reason} builds it, then restart (or load it, with "
                "--model-control)",
                param="model",
            )
        if entry.state is State.FAILED:
            raise ModelNotReady(
                f"model {name} did not load: {entry.reason}",
                retry_after_s=FAILED_RETRY_AFTER_S,
                param="model",
            )
        if not version:
            return entry.newest
        chosen = (
            entry.versions.get(int(version)) if version.isascii() and version.isdigit() else None
        )
        if chosen is None:
            raise ModelNotFound(
                f"model {name} has no version {quoted(version, 32)} "
                f"(serving {list(entry.versions)})",
                param="model",
            )
        return chosen

    def knows(self, name: str) -> bool:
        """Whether `name` is a model's name (whatever its state) or an alias of one."""
        return name in self._entries or name in self._aliases

    def stand_in_for(self, unknown: str, task: Task) -> str:
        """The model that answers a call naming a model it does not know, on a route whose
        server ignores names: the one model that serves `task`; else ModelNotFound naming
        those that do (TaskNotServed when none does)."""
        able = sorted(n for n, m in self.models.items() if task.value in m.info.tasks)
        if len(able) == 1:
            return able[0]
        if not able:
            raise TaskNotServed(
                f"unknown model {quoted(unknown)}, and none of this server's models serves "
                f"{task.value}",
                param="model",
            )
        raise ModelNotFound(
            f"unknown model {quoted(unknown)}, and {len(able)} serve {task.value}: name one of "
            f"{', '.join(able[:8])}",
            param="model",
        )

    def for_task(self, task: Task) -> str | None:
        """The model a call without one goes to: the default, when it serves `task`, else the
        one model that does; else TaskNotServed (400) naming the models that do, or saying
        none does. (A call of the model's own outputs goes to the default, if there is one.)"""
        models = self.models
        default = self.default_model
        if task is Task.PREDICT or (default in models and task.value in models[default].info.tasks):
            return default
        able = sorted(n for n, m in models.items() if task.value in m.info.tasks)
        if len(able) == 1:
            return able[0]
        if able:
            raise TaskNotServed(
                f"no model named, and {len(able)} serve {task.value}: name one of "
                f"{', '.join(able[:8])}",
                param="model",
            )
        raise TaskNotServed(
            f"no model named, and none of this server's models serves {task.value}",
            param="model",
        )

    def versions(self, name: str) -> Mapping[int, Model]:
        """The versions of `name` served now (none when it is not served)."""
        entry = self._entries.get(name)
        return entry.versions if entry is not None else {}

    @property
    def models(self) -> dict[str, Model]:
        """Each model served, at the version a request that names none gets."""
        return {
            name: entry.newest
            for name, entry in self._entries.items()
            if entry.state is State.SERVING
        }

    @property
    def aliases(self) -> dict[str, str]:
        """Every other name a served model answers to -> its name."""
        return dict(self._aliases)

    @property
    def failed(self) -> dict[str, str]:
        """The models that did not load at start, and why."""
        return {n: e.reason for n, e in self._entries.items() if e.state is State.FAILED}

    def served(self) -> list[Model]:
        """Every version of every model served."""
        return [m for e in self._entries.values() for m in e.versions.values()]

    def index(self) -> list[dict[str, str]]:
        """Every model of the repository and its state (Triton's repository index): each
        version served READY, those that did not load or were unloaded UNAVAILABLE with why."""
        entries: list[dict[str, str]] = []
        for name, entry in self._entries.items():
            if entry.state is State.SERVING:
                entries += [
                    {"name": name, "version": str(v), "state": "READY"} for v in entry.versions
                ]
            else:
                entries.append({"name": name, "state": "UNAVAILABLE", "reason": entry.reason})
        return sorted(entries, key=lambda e: (e["name"], e.get("version", "")))

    # -- changed by model control ---------------------------------------------------------

    def put(self, name: str, versions: Mapping[int, Model]) -> list[Model]:
        """Serve `versions` as `name` from now on; the versions it replaces are returned.
        ConfigError (and nothing changed) where one of its aliases is another model's."""
        entries = self._entries | {name: Entry(State.SERVING, dict(sorted(versions.items())))}
        aliases = self._aliases_of(entries)
        replaced = list(self.versions(name).values())
        self._entries, self._aliases = entries, aliases
        return replaced

    def _aliases_of(self, entries: Mapping[str, Entry]) -> dict[str, str]:
        """Every alias -> its model's name: the operator's, and each served model's config's;
        ConfigError where an alias is a model's name, or two models claim it."""
        claims = [(alias, name) for alias, name in self._operators.items()]
        for name, entry in sorted(entries.items()):
            if entry.state is State.SERVING:
                claims += [(alias, name) for alias in entry.newest.info.aliases]
        found: dict[str, str] = {}
        for alias, name in claims:
            if alias in entries:
                raise ConfigError(f"model {name}: alias {quoted(alias)} is a model's name")
            if found.setdefault(alias, name) != name:
                raise ConfigError(
                    f"alias {quoted(alias)} is claimed by models {found[alias]} and {name}"
                )
        return found

    def remove(self, name: str) -> list[Model]:
        """Serve `name` no more (unloaded); the versions it served are returned. A name the
        registry does not hold is ModelNotFound (and never enters the index)."""
        if name not in self._entries:
            raise ModelNotFound(f"unknown model {quoted(name)}: nothing to unload", param="model")
        removed = list(self.versions(name).values())
        self._entries[name] = Entry(State.UNLOADED, reason="unloaded")
        self._aliases = self._aliases_of(self._entries)
        return removed
