"""Discrete-event cluster simulator: N instances with tiers, routed by the real `router`."""
