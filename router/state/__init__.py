"""Shared state for gateway replicas: one protocol (`base`), `memory` and `redis` backends."""
