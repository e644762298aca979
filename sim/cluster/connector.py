"""Tier loads as vLLM's KV connector makes them (tierd's connector, `tierd/connector`): when
the scheduler admits a waiting request it asks the connector how many tokens after its own
prefix-cache hit the connector holds (`get_num_new_matched_tokens`), allocates blocks for
them and, with `load: sync` (what `bench compare --tiers` runs), loads them before the
forward pass of the step that computes the request's first chunk, holding that step.

So a block counts where it is when the request is *admitted*, not when it arrived: under a
queue, what the gateway's arrival-time prefetch would have put in the engine's KV is evicted
again by the requests ahead of it, while the connector still finds it in host memory or the
array. `ClusterConfig.tier_loads = "admission"` selects this model; "arrival" (the default)
is the prefetch-into-HBM model the simulator had before.
"""

from __future__ import annotations

from collections.abc import Sequence

from contracts.tiers import Tier
from sim.cluster.kvcache import LruStore
from sim.profiles import Profile

_HOST, _ARRAY = Tier.HOST.label, Tier.ARRAY.label


class ConnectorHits:
    """What one instance's connector finds for a request, from its host tier or the array."""

    def __init__(
        self, profile: Profile, block_tokens: int, host: LruStore | None, array: LruStore
    ) -> None:
        self._profile = profile
        self._block_tokens = block_tokens
        self._host = host
        self._array = array
        self._rates = {t.label: bps for t, bps in profile.bandwidths.items()}

    def find(
        self, chain: Sequence[int], start: int, prompt_tokens: int
    ) -> tuple[int, dict[str, int], float]:
        """(blocks found after the first `start`, tokens by tier label, sync load seconds)."""
        bt = self._block_tokens
        tokens = {_HOST: 0, _ARRAY: 0}
        j = start
        while j < len(chain):
            block = chain[j]
            if self._host is not None and block in self._host:
                tier = _HOST
                self._host.touch(block)
            elif block in self._array:
                tier = _ARRAY
                self._array.touch(block)
            else:
                break
            tokens[tier] += min(bt, prompt_tokens - j * bt)
            j += 1
        load_s = sum(self._profile.load_seconds(n, self._rates[t]) for t, n in tokens.items())
        return j - start, {t: n for t, n in tokens.items() if n}, load_s
