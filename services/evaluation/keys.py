"""Typed identities of an evaluation's work: work-item keys and proxy session ids.

Both are strings in the store and on the wire; this module is the one place that formats and
parses them, so no other code splits a key apart. Domain code, no gRPC.

    WorkItemKey   "<stage>/<setting>/<level>/<chunk>"   e.g. "corr/gaussian_noise/3/00002"
    SessionId     "<evaluation>/<stage>[/<setting>[/<chunk>/a<attempt>]]"
                  e.g. "ev-1/clean", "ev-1/attack/square/00000/a1"

A query attack's chunk has one proxy session, opened by its first attempt (``a1``) and
continued by every resumed one, so the per-image budget Q_m holds across attempts (CAN-9:
the proxy replays a killed attempt's answered queries to the resumed one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from fortis.services.common.errors import InvalidArgument

__all__ = ["SessionId", "StageName", "WorkItemKey"]

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,100}$")


class StageName(StrEnum):
    """The stages of an evaluation, in IEEE-P2 order (the store's key prefixes)."""

    CLEAN = "clean"
    CORRUPTIONS = "corr"
    DEGRADATION = "deg"
    ATTACKS = "attack"


@dataclass(frozen=True, order=True)
class WorkItemKey:
    """One work item: a chunk of images under one test setting at one level."""

    stage: StageName
    setting: str = ""       # corruption/operator id or attack name ("" for clean)
    level: int = 0          # severity or degradation level (0 when not graded)
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.setting and not _NAME.match(self.setting):
            raise InvalidArgument("setting", f"not a valid setting name: {self.setting[:100]!r}")
        if not 0 <= self.chunk < 100_000 or not 0 <= self.level <= 1000:
            raise InvalidArgument("chunk", "chunk or level out of range")

    def format(self) -> str:
        if self.stage is StageName.CLEAN:
            return f"clean/{self.chunk:05d}"
        if self.stage is StageName.ATTACKS:
            return f"attack/{self.setting}/{self.chunk:05d}"
        return f"{self.stage.value}/{self.setting}/{self.level}/{self.chunk:05d}"

    def __str__(self) -> str:
        return self.format()

    @classmethod
    def parse(cls, text: str) -> WorkItemKey:
        parts = text.split("/")
        try:
            stage = StageName(parts[0])
            if stage is StageName.CLEAN and len(parts) == 2:
                return cls(stage, chunk=int(parts[1]))
            if stage is StageName.ATTACKS and len(parts) == 3:
                return cls(stage, parts[1], chunk=int(parts[2]))
            if len(parts) == 4:
                return cls(stage, parts[1], int(parts[2]), int(parts[3]))
        except ValueError:
            pass
        raise InvalidArgument("item_key", f"not a work-item key: {text[:200]!r}")


@dataclass(frozen=True)
class SessionId:
    """A proxy session of an evaluation."""

    evaluation_id: str
    stage: str                  # "clean" | "corruptions" | "degradation" | "attack"
    setting: str = ""           # attack name (attack sessions)
    chunk: int | None = None    # query attacks: the chunk ...
    attempt: int = 0            # ... and the attempt (1 = first)

    def format(self) -> str:
        s = f"{self.evaluation_id}/{self.stage}"
        if self.setting:
            s += f"/{self.setting}"
        if self.chunk is not None:
            s += f"/{self.chunk:05d}/a{self.attempt}"
        return s

    def __str__(self) -> str:
        return self.format()

    @classmethod
    def clean(cls, evaluation_id: str) -> SessionId:
        return cls(evaluation_id, "clean")

    @classmethod
    def corruptions(cls, evaluation_id: str) -> SessionId:
        return cls(evaluation_id, "corruptions")

    @classmethod
    def degradation(cls, evaluation_id: str) -> SessionId:
        return cls(evaluation_id, "degradation")

    @classmethod
    def transfer(cls, evaluation_id: str, attack: str) -> SessionId:
        return cls(evaluation_id, "attack", attack)

    @classmethod
    def query(cls, evaluation_id: str, attack: str, chunk: int, attempt: int) -> SessionId:
        return cls(evaluation_id, "attack", attack, chunk, attempt)

    @classmethod
    def parse(cls, text: str, evaluation_id: str) -> SessionId:
        """Parse a session id of ``evaluation_id`` (whose own id may contain no '/')."""
        prefix = evaluation_id + "/"
        if not text.startswith(prefix):
            raise InvalidArgument("session_id", f"not a session of {evaluation_id!r}")
        parts = text[len(prefix):].split("/")
        try:
            if len(parts) == 1:
                return cls(evaluation_id, parts[0])
            if len(parts) == 2:
                return cls(evaluation_id, parts[0], parts[1])
            if len(parts) == 4 and parts[3].startswith("a"):
                return cls(evaluation_id, parts[0], parts[1], int(parts[2]), int(parts[3][1:]))
        except ValueError:
            pass
        raise InvalidArgument("session_id", f"not a session id: {text[:200]!r}")
