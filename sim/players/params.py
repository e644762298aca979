"""Parameters of the game workload, each with what it models. Token counts are in the
workload's own unit (4 characters of generated text = 1 token, `router.blocks`' estimate).

Defaults aim at the load the product is for: 100+ players and 4-16 concurrent requests
per instance on a few instances of a 32B-class model.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.errors import ConfigurationError


class WorkloadParamsError(ConfigurationError, ValueError):
    """A game workload parameter out of range."""


@dataclass(frozen=True, slots=True)
class GameParams:
    # -- the world ----------------------------------------------------------------------
    players: int = 120  # concurrent players on the shard
    minutes: float = 10.0  # length of the trace
    seed: int = 7  # everything below is drawn from it: same seed, same trace
    zones: int = 6  # zones (maps) players are spread over
    npcs_per_zone: int = 6  # NPCs with a persona in each zone
    world_tokens: tuple[int, int] = (2000, 8000)  # a zone's world-state prompt
    world_dynamic_share: float = 0.25  # its tail that changes with each version (events,
    # weather, faction standings); the head is static lore
    world_version_mean_s: float = 300.0  # mean time between a zone's world-state versions
    persona_tokens: tuple[int, int] = (500, 2000)  # an NPC's persona and instructions
    player_state_tokens: tuple[int, int] = (500, 2000)  # a player's sheet: class, quests
    player_state_change: float = 0.3  # chance the sheet changed between two dialogues
    # -- dialogues ----------------------------------------------------------------------
    turns: tuple[int, int] = (5, 30)  # turns of one dialogue
    line_tokens: tuple[int, int] = (20, 200)  # what the player says in one turn
    reply_tokens: tuple[int, int] = (50, 300)  # what the NPC answers (output tokens)
    think_median_s: float = 30.0  # time from the reply's end to the player's next line:
    think_sigma: float = 1.0  # log-normal (median, sigma), clipped to think_range_s
    think_range_s: tuple[float, float] = (2.0, 180.0)  # "seconds to minutes"
    reply_s_per_token: float = 0.05  # streaming the reply and reading it, per token
    idle_mean_s: float = 60.0  # mean pause between dialogues (walking, fighting, trading)
    favourite_npcs: int = 3  # NPCs of a zone a player keeps going back to (memory)
    move_zone_chance: float = 0.15  # chance a player changes zone between dialogues
    prior_history_tokens: tuple[int, int] = (0, 24000)  # what an NPC already remembers of
    # a player from earlier play sessions (it makes contexts grow past 30k tokens)
    max_history_tokens: int = 40000  # past this, the older half of a memory is summarised
    summary_tokens: int = 300  # the summary that replaces it
    start_spread_s: float = 180.0  # players log in over the first three minutes
    # -- raids --------------------------------------------------------------------------
    raid_every_mean_s: float = 600.0  # mean time between raids / world events
    raid_first_s: tuple[float, float] = (120.0, 300.0)  # when the first one starts
    raid_share: float = 0.8  # share of all players who join a raid
    raid_npcs: int = 2  # raid NPCs each participant talks to (boss, herald): sessions
    raid_window_s: float = 5.0  # every raid session starts within this window
    raid_turns: tuple[int, int] = (5, 8)  # turns of a raid dialogue
    raid_think_factor: float = 1.0  # combat chatter: think times shortened by this factor
    # -- what a game server tells the gateway (issue 22; all off by default, so older
    # traces and figures stay reproducible) --------------------------------------------
    warm_lead_s: float = 0.0  # > 0: each dialogue's first line is warmed this long before
    # (the player walks up to the NPC or logs in: POST /v1/warm of the context)
    bump_at_s: tuple[float, ...] = ()  # every zone gets a new world version at these times
    bark_rate_per_s: float = 0.0  # ambient barks: one-off NPC lines nobody waits for
    priority_classes: bool = False  # dialogue lines interactive, barks background

    def __post_init__(self) -> None:
        if self.players <= 0 or self.minutes <= 0:
            raise WorkloadParamsError("players and minutes must be positive")
        if self.zones <= 0 or self.npcs_per_zone <= 0:
            raise WorkloadParamsError("zones and npcs_per_zone must be positive")
        if self.raid_npcs > self.npcs_per_zone:
            raise WorkloadParamsError("raid_npcs cannot exceed npcs_per_zone")
        if self.warm_lead_s < 0 or self.bark_rate_per_s < 0:
            raise WorkloadParamsError("warm_lead_s and bark_rate_per_s must be >= 0")
        if any(t < 0 for t in self.bump_at_s):
            raise WorkloadParamsError("bump_at_s times must be >= 0")
        for name in (
            "world_tokens",
            "persona_tokens",
            "player_state_tokens",
            "turns",
            "line_tokens",
            "reply_tokens",
            "raid_turns",
            "prior_history_tokens",
        ):
            lo, hi = getattr(self, name)
            if lo < 0 or hi < lo:
                raise WorkloadParamsError(
                    f"{name} must be a (low, high) range with 0 <= low <= high"
                )
