"""The replica pool's state machine: routing, caps, ejection, readiness.

Pure: no I/O, no clock of its own (every call takes ``now``), no asyncio.
``probe.py`` feeds it active health checks, ``relay.py`` passive outcomes;
both are thin layers over this module, which the table tests drive directly.

Routing: least outstanding requests among the *routable* replicas that are
below their concurrency cap (``max_per_replica``; prefetched requests count
like any other), ties broken round-robin so idle replicas share the load.

States of a replica:

* ``starting``: not probed yet (only with active probes on); not routable.
* ``ready``: the last probe passed (or probes are off); routable.
* ``unready``: the last probe failed; not routable until a probe passes.
* ``ejected``: passively ejected after ``failure_threshold`` consecutive
  failures, for ``cooldown_s``; then routable again on probation: one
  success makes it ``ready``, one more failure ejects it again.

Outcomes (``Outcome``), in the spirit of LiteLLM's router:

* ``ok``: audio arrived; the failure count resets.
* ``full``: HTTP 429, or 503 (this gateway answers ``busy`` with 503, as
  servers and load balancers commonly do when full): the replica is full,
  not broken; the request tries another replica and the replica is never
  ejected for it.
* ``client_error``: any other 4xx (a bad voice, a bad key...): the request
  itself is wrong; never ejects, never retried elsewhere.
* ``failure``: connection refused or reset, timeout, 408, 5xx other than 503,
  a body that is not speech: counts towards ejection; retried on another
  replica if no audio was relayed yet.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    UNREADY = "unready"
    EJECTED = "ejected"


class Outcome(enum.StrEnum):
    OK = "ok"
    FULL = "full"
    CLIENT_ERROR = "client_error"
    FAILURE = "failure"


def classify_status(status: int) -> Outcome:
    """The outcome an HTTP status means for a speech request."""
    if 200 <= status < 300:
        return Outcome.OK
    if status in (429, 503):
        return Outcome.FULL
    if status == 408 or status >= 500:
        return Outcome.FAILURE
    if 400 <= status < 500:
        return Outcome.CLIENT_ERROR
    return Outcome.FAILURE  # 1xx/3xx: not a speech response


@dataclass(frozen=True)
class PoolPolicy:
    failure_threshold: int = 3
    cooldown_s: float = 5.0
    max_per_replica: int = 8
    #: active probes are on: replicas start ``starting`` until one passes
    probing: bool = True


@dataclass
class Replica:
    index: int
    #: the replica's URL without credentials (logs and metric labels)
    name: str
    state: ReplicaState = ReplicaState.STARTING
    outstanding: int = 0
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    #: cumulative figures for metrics
    requests: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    ejections: int = 0


class Pool:
    def __init__(self, names: Sequence[str], policy: PoolPolicy) -> None:
        if not names:
            raise ValueError("a pool needs at least one replica")
        self.policy = policy
        first = ReplicaState.STARTING if policy.probing else ReplicaState.READY
        self.replicas = [Replica(i, name, first) for i, name in enumerate(names)]
        self._next = 0  #: round-robin start among equally loaded replicas

    # --- routing -----------------------------------------------------------------------

    def routable(self, replica: Replica, now: float) -> bool:
        if replica.state is ReplicaState.READY:
            return True
        return replica.state is ReplicaState.EJECTED and now >= replica.ejected_until

    def pick(self, now: float, exclude: frozenset[int] = frozenset()) -> int | None:
        """The replica for a new request, or None (none routable below its
        cap; see ``waiting_for_room``)."""
        n = len(self.replicas)
        best: Replica | None = None
        for k in range(n):
            replica = self.replicas[(self._next + k) % n]
            if replica.index in exclude or not self.routable(replica, now):
                continue
            if replica.outstanding >= self.policy.max_per_replica:
                continue
            if best is None or replica.outstanding < best.outstanding:
                best = replica
        if best is None:
            return None
        self._next = (best.index + 1) % n
        return best.index

    def waiting_for_room(self, now: float, exclude: frozenset[int] = frozenset()) -> bool:
        """No replica can take a request now, but a routable one will when a
        request ends (all at their cap): the caller may wait."""
        return (
            any(r.index not in exclude and self.routable(r, now) for r in self.replicas)
            and self.pick(now, exclude) is None
        )

    def acquire(self, index: int) -> None:
        replica = self.replicas[index]
        replica.outstanding += 1
        replica.requests += 1

    def release(self, index: int) -> None:
        replica = self.replicas[index]
        replica.outstanding = max(0, replica.outstanding - 1)

    # --- outcomes ----------------------------------------------------------------------

    def report(self, index: int, outcome: Outcome, now: float, kind: str = "") -> None:
        """A request's outcome on ``index`` (passive health)."""
        replica = self.replicas[index]
        if outcome is Outcome.OK:
            replica.consecutive_failures = 0
            if replica.state is ReplicaState.EJECTED:
                replica.state = ReplicaState.READY
            return
        label = kind or outcome.value
        replica.failures[label] = replica.failures.get(label, 0) + 1
        if outcome is not Outcome.FAILURE:
            return
        replica.consecutive_failures += 1
        if replica.consecutive_failures >= self.policy.failure_threshold:
            if replica.state is not ReplicaState.EJECTED or now >= replica.ejected_until:
                replica.ejections += 1
            replica.state = ReplicaState.EJECTED
            replica.ejected_until = now + self.policy.cooldown_s

    def probed(self, index: int, healthy: bool, now: float) -> None:
        """An active probe's result.  A passing probe does not end an
        ejection's cool-down early; a failing one makes the replica unready."""
        replica = self.replicas[index]
        if not healthy:
            if replica.state is not ReplicaState.EJECTED or now >= replica.ejected_until:
                replica.state = ReplicaState.UNREADY
            return
        if replica.state is ReplicaState.EJECTED and now < replica.ejected_until:
            return
        if replica.state is not ReplicaState.EJECTED:
            replica.consecutive_failures = 0
        replica.state = ReplicaState.READY

    # --- views -------------------------------------------------------------------------

    def ready(self, now: float) -> bool:
        """At least one replica is routable (``/readyz``)."""
        return any(self.routable(r, now) for r in self.replicas)

    def state_of(self, index: int, now: float) -> ReplicaState:
        replica = self.replicas[index]
        if replica.state is ReplicaState.EJECTED and now >= replica.ejected_until:
            return ReplicaState.READY  # on probation: routable
        return replica.state
