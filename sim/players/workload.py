"""The game workload generator: players in zones talking to NPCs, as chat requests with real
text, in arrival order.

Every request's prompt is laid out stable -> volatile, as a game server would send it:

    system: world state of the NPC's zone   (static lore, then the current version's status)
    system: the NPC's persona
    system: the player's state sheet
    [system: summary of older memories]     (once a memory outgrew max_history_tokens)
    user/assistant: what this NPC remembers of this player (earlier dialogues, this one)
    user: the player's new line

so the zone's lore and world state are shared by everyone in the zone, the persona by every
player talking to that NPC, and the rest by one player's dialogue with one NPC across turns
(session key `player-P:npc-Z-N`). How it moves through time (an event heap):

- players log in over the first `start_spread_s`, then alternate dialogues with idle time;
  a dialogue goes to one of the player's favourite NPCs of the zone (they remember the
  player: `prior_history_tokens` from earlier play sessions) or, now and then, another;
- each turn: the request arrives, its reply takes `reply_s_per_token` per token, then the
  player thinks (log-normal) before the next line; replies join the NPC's memory;
- between dialogues a player may change zone or have a new state sheet (a new prefix
  below the persona: everything after it is recomputed, as it would be in a real game);
- each zone's world state gets a new version now and then (its dynamic tail changes);
- raids: a share of all players joins one zone at once and opens a session with each of
  the zone's first `raid_npcs` NPCs within `raid_window_s` (hundreds of sessions within
  seconds), with short combat think times.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Any

from sim.players.params import GameParams
from sim.players.text import CHARS_PER_TOKEN, TextSource

Message = dict[str, str]


@dataclass(frozen=True, slots=True)
class GameRequest:
    """One chat request of the game workload."""

    at_s: float  # arrival, seconds from the start
    messages: tuple[Message, ...]
    output_tokens: int  # the NPC's reply length (max_tokens for a replay)
    session: str  # `user` / prompt_cache_key: one player's dialogue with one NPC
    tag: str  # zone/npc/player and "raid" when it is a raid session
    warm_lead_s: float | None = None  # warm the context (all but the last line) this early
    priority: str | None = None  # a priority class (interactive, background)


@dataclass(slots=True)
class _Zone:
    idx: int
    lore: str
    dynamic: str = ""
    version: int = 0
    world: str = ""  # lore + status of the current version (one shared string)


@dataclass(slots=True)
class _Npc:
    key: str
    zone: int
    persona: str


@dataclass(slots=True)
class _Player:
    idx: int
    zone: int
    state: str
    favourites: dict[int, list[int]] = field(default_factory=dict)  # zone -> npc indexes
    raid_sessions: int = 0  # open raid sessions: ordinary dialogues wait until they end


@dataclass(slots=True)
class _Memory:
    messages: list[Message] = field(default_factory=list)
    tokens: int = 0


@dataclass(slots=True)
class _Session:
    player: int
    npc: int  # global npc index
    turns_left: int
    raid: bool
    first: bool = True  # its next turn is the dialogue's first line


def _tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


class GameWorkload:
    """Generates the workload of `GameParams`; `generate()` returns requests by arrival."""

    def __init__(self, params: GameParams) -> None:
        self.p = params
        self.rng = random.Random(params.seed)
        self.text = TextSource(params.seed * 7919 + 1)
        self.horizon_s = params.minutes * 60.0
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.zones: list[_Zone] = []
        self.npcs: list[_Npc] = []
        self.players: list[_Player] = []
        self.memories: dict[tuple[int, int], _Memory] = {}
        self.requests: list[GameRequest] = []
        # barks draw from their own generators: the dialogues are the same with or without
        self._bark_rng = random.Random(params.seed * 104_729 + 3)
        self._bark_text = TextSource(params.seed * 7919 + 2)

    # -- setup --------------------------------------------------------------------------

    def _range(self, bounds: tuple[int, int]) -> int:
        return self.rng.randint(bounds[0], bounds[1])

    def _push(self, at: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))

    def _new_version(self, zone: _Zone) -> None:
        p = self.p
        total = self._range(p.world_tokens)
        dyn = max(1, int(total * p.world_dynamic_share))
        if not zone.lore:
            zone.lore = self.text.prose(total - dyn, prefix=f"World of zone {zone.idx}.")
        zone.version += 1
        zone.dynamic = self.text.prose(dyn, prefix=f"Status, version {zone.version}:")
        zone.world = zone.lore + "\n" + zone.dynamic

    def _build(self) -> None:
        p, rng = self.p, self.rng
        for z in range(p.zones):
            zone = _Zone(z, lore="")
            self._new_version(zone)
            self.zones.append(zone)
            for n in range(p.npcs_per_zone):
                self.npcs.append(
                    _Npc(
                        key=f"npc-{z}-{n}",
                        zone=z,
                        persona=self.text.prose(
                            self._range(p.persona_tokens), prefix=f"You are npc {z}-{n}."
                        ),
                    )
                )
            self._push(rng.expovariate(1.0 / p.world_version_mean_s), "version", z)
        for i in range(p.players):
            player = _Player(i, zone=rng.randrange(p.zones), state=self._player_state(i))
            self.players.append(player)
            self._push(rng.uniform(0.0, p.start_spread_s), "idle_end", i)
        self._push(rng.uniform(*p.raid_first_s), "raid", None)
        for at in p.bump_at_s:
            self._push(at, "bump", None)
        if p.bark_rate_per_s > 0:
            self._push(self._bark_rng.expovariate(p.bark_rate_per_s), "bark", None)

    def _player_state(self, i: int) -> str:
        return self.text.prose(
            self._range(self.p.player_state_tokens), prefix=f"Player {i} character sheet."
        )

    def _npc_index(self, zone: int, n: int) -> int:
        return zone * self.p.npcs_per_zone + n

    # -- memories -----------------------------------------------------------------------

    def _memory(self, player: int, npc: int, favourite: bool) -> _Memory:
        key = (player, npc)
        mem = self.memories.get(key)
        if mem is None:
            mem = _Memory()
            if favourite:
                target = self._range(self.p.prior_history_tokens)
                while mem.tokens < target:
                    self._remember(
                        mem,
                        self.text.prose(self._range(self.p.line_tokens)),
                        self.text.prose(self._range(self.p.reply_tokens)),
                    )
            self.memories[key] = mem
        return mem

    @staticmethod
    def _remember(mem: _Memory, line: str, reply: str) -> None:
        mem.messages.append({"role": "user", "content": line})
        mem.messages.append({"role": "assistant", "content": reply})
        mem.tokens += _tokens(line) + _tokens(reply)

    def _maybe_summarise(self, mem: _Memory) -> None:
        if mem.tokens <= self.p.max_history_tokens:
            return
        cut = len(mem.messages) // 2
        cut -= cut % 2  # whole turns
        keep = mem.messages[cut:]
        summary = self.text.prose(self.p.summary_tokens, prefix="Memory summary:")
        mem.messages = [{"role": "system", "content": summary}, *keep]
        mem.tokens = sum(_tokens(m["content"]) for m in mem.messages)

    # -- events -------------------------------------------------------------------------

    def _start_dialogue(self, t: float, player: _Player) -> None:
        p, rng = self.p, self.rng
        if rng.random() < p.move_zone_chance:
            player.zone = rng.randrange(p.zones)
        if rng.random() < p.player_state_change:
            player.state = self._player_state(player.idx)
        favs = player.favourites.get(player.zone)
        if favs is None:
            k = min(p.favourite_npcs, p.npcs_per_zone)
            favs = player.favourites[player.zone] = rng.sample(range(p.npcs_per_zone), k)
        favourite = rng.random() < 0.8
        n = rng.choice(favs) if favourite else rng.randrange(p.npcs_per_zone)
        npc = self._npc_index(player.zone, n)
        self._maybe_summarise(self._memory(player.idx, npc, n in favs))
        self._push(t, "turn", _Session(player.idx, npc, self._range(p.turns), raid=False))

    def _think(self, raid: bool) -> float:
        p = self.p
        think = math.exp(self.rng.gauss(math.log(p.think_median_s), p.think_sigma))
        think = min(max(think, p.think_range_s[0]), p.think_range_s[1])
        return think * p.raid_think_factor if raid else think

    def _turn(self, t: float, s: _Session) -> None:
        p, rng = self.p, self.rng
        player, npc = self.players[s.player], self.npcs[s.npc]
        if player.raid_sessions and not s.raid:  # busy raiding: the dialogue waits
            self._push(t + self._think(False), "turn", s)
            return
        zone = self.zones[npc.zone]
        mem = self._memory(s.player, s.npc, favourite=False)
        line = self.text.prose(self._range(p.line_tokens))
        reply_tokens = self._range(p.reply_tokens)
        messages: list[Message] = [
            {"role": "system", "content": zone.world},
            {"role": "system", "content": npc.persona},
            {"role": "system", "content": player.state},
            *mem.messages,
            {"role": "user", "content": line},
        ]
        session = f"player-{s.player}:{npc.key}"
        tag = f"zone-{npc.zone}/{npc.key}/player-{s.player}" + ("/raid" if s.raid else "")
        lead = p.warm_lead_s if s.first and p.warm_lead_s > 0 else None
        s.first = False
        priority = "interactive" if p.priority_classes else None
        self.requests.append(
            GameRequest(t, tuple(messages), reply_tokens, session, tag, lead, priority)
        )
        self._remember(mem, line, self.text.prose(reply_tokens))
        s.turns_left -= 1
        after = t + reply_tokens * p.reply_s_per_token + self._think(s.raid)
        if s.turns_left > 0:
            self._push(after, "turn", s)
        elif s.raid:
            player.raid_sessions -= 1
        else:
            self._push(after + rng.expovariate(1.0 / p.idle_mean_s), "idle_end", s.player)

    def _raid(self, t: float) -> None:
        p, rng = self.p, self.rng
        z = rng.randrange(p.zones)
        count = round(p.raid_share * len(self.players))
        for i in sorted(rng.sample(range(len(self.players)), count)):
            self.players[i].zone = z
            self.players[i].raid_sessions += p.raid_npcs
            for n in range(p.raid_npcs):
                npc = self._npc_index(z, n)
                self._maybe_summarise(self._memory(i, npc, favourite=False))
                start = t + rng.uniform(0.0, p.raid_window_s)
                self._push(start, "turn", _Session(i, npc, self._range(p.raid_turns), raid=True))
        self._push(t + rng.expovariate(1.0 / p.raid_every_mean_s), "raid", None)

    def _bark(self, t: float) -> None:
        """An NPC's ambient line (no player, no session): background work."""
        rng = self._bark_rng
        npc = self.npcs[rng.randrange(len(self.npcs))]
        zone = self.zones[npc.zone]
        line = self._bark_text.prose(rng.randint(5, 15), prefix="(ambient)")
        messages = (
            {"role": "system", "content": zone.world},
            {"role": "system", "content": npc.persona},
            {"role": "user", "content": line},
        )
        priority = "background" if self.p.priority_classes else None
        tokens = rng.randint(*self.p.reply_tokens)
        tag = f"zone-{npc.zone}/{npc.key}/bark"
        self.requests.append(GameRequest(t, messages, tokens, "", tag, None, priority))
        self._push(t + rng.expovariate(self.p.bark_rate_per_s), "bark", None)

    def generate(self) -> list[GameRequest]:
        """Every request with an arrival before the horizon, in arrival order."""
        if self.requests:
            return self.requests
        self._build()
        heap = self._heap
        while heap:
            t, _, kind, payload = heapq.heappop(heap)
            if t >= self.horizon_s:
                break
            if kind == "turn":
                self._turn(t, payload)
            elif kind == "idle_end":
                self._start_dialogue(t, self.players[payload])
            elif kind == "version":
                self._new_version(self.zones[payload])
                self._push(
                    t + self.rng.expovariate(1.0 / self.p.world_version_mean_s), "version", payload
                )
            elif kind == "raid":
                self._raid(t)
            elif kind == "bump":  # a world event: every zone's state changes at once
                for zone in self.zones:
                    self._new_version(zone)
            elif kind == "bark":
                self._bark(t)
        return self.requests


def generate(params: GameParams) -> list[GameRequest]:
    """The game workload of `params`, requests in arrival order."""
    return GameWorkload(params).generate()
