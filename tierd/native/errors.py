"""The errors of tierd's native copy module, in the project's tree (contracts/errors.py).

Pure Python and importing nothing of tierd's, so both implementations raise these very
classes: the C extension (`_native.c` looks them up here at import, `wg_py.h`) and the
pure-Python fallback (`_fallback.py`, `_checks.py`, `_kvcopy.py`, `_pyio.py`). Each is still
the builtin the module raised before (TypeError, ValueError, RuntimeError), so callers'
`except ValueError` hold. Offsets past a buffer's end stay IndexError, a buffer that cannot be
exported or closed BufferError, a number too large OverflowError: builtins, as before.
"""

from __future__ import annotations

from contracts.errors import ConfigurationError, InputError, UpstreamError


class NativeArgumentTypeError(InputError, TypeError):
    """An argument of the wrong kind: not a buffer, not writable or not C-contiguous, not a
    sequence of ints, a KV layer that is not (ptr, nbytes, starts, block_stride, run_bytes),
    a DeviceArena where only host memory is accepted, a copy without its direction."""


class NativeArgumentError(InputError, ValueError):
    """An argument's value refused before any byte moves: a negative offset, size, count or
    device, batch lists of different lengths, an arena size that is not positive, a CRC
    outside 32 bits, a ticket never issued, a cuda and a hip arena in one copy."""


class CopyOverlapError(NativeArgumentError):
    """Destination ranges that overlap each other (a block or slice given twice) or a
    source range."""


class ClosedHandleError(InputError, ValueError):
    """A HostArena, DeviceArena or BlockCopier used after `close()`."""


class HandleStateError(InputError, RuntimeError):
    """A call its object's state refuses (C extension): initialised twice, used by another
    thread during a copy, closed while a copy is in flight."""


class UnknownBackendError(ConfigurationError, ValueError):
    """A copy backend that does not exist (host, cuda or hip)."""


class BackendUnavailableError(ConfigurationError, RuntimeError):
    """A backend that exists but cannot run here: its library was not built, no device, or
    the C extension is not loaded (the pure-Python fallback has no GPU backend)."""


class DeviceCopyError(UpstreamError, RuntimeError):
    """The GPU runtime failed a copy, an allocation or a synchronisation (its message
    says why)."""
