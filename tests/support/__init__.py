"""Helpers shared by tests: real processes on loopback, free ports, a real Redis."""
