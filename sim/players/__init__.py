"""The game workload: zones, NPCs and players talking, as chat requests with real text
(`workload.generate`) and as a Mooncake-format trace with a text sidecar (`encode`)."""
