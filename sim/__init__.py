"""The world warmgate stands in for: a simulated engine, the game workload, trace loaders and
a discrete-event cluster simulator."""
