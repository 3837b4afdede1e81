"""Where the webhook gets the namespaces' PodPlacementPolicies from, without an API call per
request.

:class:`WatchingPolicySource` keeps a :class:`kubeclient.Informer` on every
PodPlacementPolicy (tolerated while the CRD is absent) and ranks them again on every event
(:func:`rules.policy.rank`: per namespace, the accepted ones by priority), so that the
cache path places a pod with the policy the controller and the admission policy would apply
(:func:`rules.policy.policy_for`). A policy the params object cannot carry (over a limit,
or no room left: ``NotPublished``, ``CatalogFull``) is not accepted, so the webhook does not
apply it either. :class:`StaticPolicySource` serves a fixed list
(tests, benchmarks, ``--config-file``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from podplacement.kubeclient import Informer, KubeAPI, resource_path
from podplacement.rules.config import GROUP, POLICY_PLURAL, VERSION
from podplacement.rules.policy import EMPTY_RANKING, PlacementPolicy, Ranking, rank

POLICIES_PATH = resource_path(GROUP, VERSION, POLICY_PLURAL)


class PolicySource(Protocol):
    """What the admission handler needs: the accepted policies of a namespace."""

    def of(self, namespace: str) -> tuple[PlacementPolicy, ...]:
        """The accepted policies of ``namespace``, highest priority first."""
        ...

    async def start(self) -> None:
        """Begin keeping the policies up to date (returns at once)."""
        ...

    async def stop(self) -> None:
        """Stop background work started by :meth:`start`."""
        ...


class StaticPolicySource:
    """A fixed set of PodPlacementPolicy dicts (ranked once)."""

    def __init__(self, objects: Iterable[Mapping[str, Any]] = ()) -> None:
        self.ranking: Ranking = rank(objects)

    def of(self, namespace: str) -> tuple[PlacementPolicy, ...]:
        """The accepted policies of ``namespace``, highest priority first."""
        return self.ranking.of(namespace)

    async def start(self) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""


class WatchingPolicySource:
    """Every PodPlacementPolicy of the cluster, list+watch, ranked on each event.

    Args:
        api: the Kubernetes client (the webhook's ServiceAccount may list and watch
            podplacementpolicies).
        watch_timeout: the informer's watch timeout, seconds.
    """

    def __init__(self, api: KubeAPI, *, watch_timeout: int = 300) -> None:
        self.informer = Informer(api, POLICIES_PATH, name="podplacementpolicies",
                                 watch_timeout=watch_timeout, tolerate_absent=True,
                                 max_backoff=10.0)
        self.ranking: Ranking = EMPTY_RANKING
        self.informer.add_handler(self._on_event)

    def _on_event(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.ranking = rank(list(self.informer.cache.values()))

    def of(self, namespace: str) -> tuple[PlacementPolicy, ...]:
        """The accepted policies of ``namespace``, highest priority first."""
        return self.ranking.of(namespace)

    async def start(self) -> None:
        """Start the informer (returns at once)."""
        self.informer.start()

    async def stop(self) -> None:
        """Stop the informer."""
        await self.informer.stop()
