"""Rank identity (RANK / LOCAL_RANK / WORLD_SIZE) and the registry of every rank's URL."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Identity:
        def num(name: str, default: int) -> int:
            try:
                return int(environ.get(name, default))
            except ValueError:
                return default

        return cls(
            rank=num("RANK", 0),
            local_rank=num("LOCAL_RANK", 0),
            world_size=num("WORLD_SIZE", 1),
            host=socket.gethostname(),
            pid=os.getpid(),
        )
