"""Benchmarks: cluster simulation, router speed, live replay against peers, reports."""
