"""What the app shares between requests, created in the lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.engines.base import Engine
from gateway.metrics import Metrics
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.session import Session


@dataclass(eq=False)
class GatewayState:
    settings: Settings
    engine: Engine
    metrics: Metrics
    ready: bool = False
    shutting_down: bool = False
    sessions: int = 0
    live_sessions: set[Session] = field(default_factory=set)
