"""The router's errors, in the project's tree (contracts/errors.py). Pure Python and
importing nothing of the router's, so the C extension `router._accel` can raise the same
classes as its pure-Python twin `router._accel_py` (it looks them up here at import)."""

from __future__ import annotations

from contracts.errors import ConfigurationError, InputError


class PolicyConfigError(ConfigurationError, ValueError):
    """A policy or cost-model setting out of range, an unknown policy or parameter. A
    ValueError too, so pydantic reports it as a validation error where settings build it."""


class BlockSizeError(ConfigurationError, ValueError):
    """A block size that is not positive (`router.blocks` and `router.precise` raise it, and
    `router.accel`'s hash_blocks, C or Python, for block_chars <= 0)."""


class AccelArgumentTypeError(InputError, TypeError):
    """An argument of `router.accel`'s loops of the wrong type: a seed or block size that is
    not an int, a block table that is neither a BlockMap nor a dict, a BlockMap key or value
    that is not an int. Raised alike by the C extension and the pure-Python twin."""
