"""Tenants' shares of a model's token throughput and of its queue, pure: the bucket queues
ask it whose sequence goes first, the scheduler whether a tenant may queue more.

Fair queueing over tokens, the virtual-time form of deficit round robin: each tenant's
account is the tokens it was served divided by its weight, and among sequences of one
priority level the tenant whose account is lowest goes first. A tenant that starts waiting
again is brought up to the lowest account of those waiting, so idle time banks no credit; one
whose account is ahead keeps its debt. A tenant is whatever the edge names (an API key's
name, or the value of a header the operator names); "" when tenancy is off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping


class Shares:
    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        default_weight: float = 1.0,
        reserve: bool = False,
    ) -> None:
        """`weights`: the named tenants' weights; any other weighs `default_weight`.
        `reserve`: whether a tenant not yet waiting may come (more than one tenant exists),
        so that room in the queue is held for it."""
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self.reserve = reserve
        self.accounts: dict[str, float] = {}  # tokens served / weight, of tenants with one
        self.waiting: Counter[str] = Counter()  # sequences queued, by tenant

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.default_weight)

    def account(self, tenant: str) -> float:
        return self.accounts.get(tenant, 0.0)

    def arrive(self, tenant: str, count: int = 1) -> None:
        """`count` sequences of `tenant` start waiting."""
        if not self.waiting[tenant]:  # it starts waiting: no credit for the time it was idle
            floor = self._floor(tenant)
            if floor is not None and self.account(tenant) < floor:
                self.accounts[tenant] = floor
        self.waiting[tenant] += count

    def leave(self, tenant: str, count: int = 1) -> None:
        """`count` sequences of `tenant` stop waiting (taken into a batch, or dropped)."""
        self.waiting[tenant] -= count
        if self.waiting[tenant] > 0:
            return
        del self.waiting[tenant]
        # An idle account at or below the lowest of those waiting would be raised to it on
        # return: forgotten (all of them, when nobody waits), so accounts stay few.
        floor = self._floor(tenant)
        for name in [n for n, a in self.accounts.items() if n not in self.waiting]:
            if floor is None or self.accounts[name] <= floor:
                del self.accounts[name]

    def charge(self, tenant: str, tokens: int) -> None:
        """`tenant` was served `tokens` (its sequences' real tokens, not their padding)."""
        self.accounts[tenant] = self.account(tenant) + tokens / self.weight(tenant)

    def room(self, tenant: str, capacity: int) -> int:
        """The most sequences `tenant` may hold in a queue of `capacity`: its weight's part of
        the weights of the tenants waiting, and of one more when another may come."""
        others = sum(self.weight(t) for t in self.waiting if t != tenant)
        held_back = self.default_weight if self.reserve else 0.0
        mine = self.weight(tenant)
        return int(capacity * mine / (mine + others + held_back))

    def over_share(self, tenant: str, count: int, capacity: int) -> bool:
        """Whether `count` more sequences would put `tenant` over its room. A tenant with
        nothing waiting is never over it: a request of any size may start; nor is one whose
        room is the whole queue (only a full queue refuses it)."""
        held, room = self.waiting[tenant], self.room(tenant, capacity)
        return held > 0 and held + count > room and room < capacity

    def _floor(self, tenant: str) -> float | None:
        """The lowest account among the other tenants waiting (None when none waits)."""
        accounts = [self.account(t) for t in self.waiting if t != tenant and self.waiting[t]]
        return min(accounts) if accounts else None
