"""Types of tierd's native copy module (the C extension `tierd.native._native`).

`tierd.native._fallback` implements the same names in pure Python; `tierd.native` re-exports
whichever was loaded. Buffers are anything with the buffer protocol (bytes, bytearray,
memoryview, numpy arrays, mmap, `HostArena`); destinations must be writable and C-contiguous.
Offsets and sizes are byte counts; every one is checked before any byte moves:
negative -> ValueError, past the end of its buffer -> IndexError, destination ranges that
overlap each other or a source range in the same memory -> ValueError, list lengths that
differ -> ValueError. The GIL is released while bytes move. The ValueErrors, TypeErrors and
RuntimeErrors are the classes of `tierd.native.errors` (both implementations raise them):
NativeArgumentError, CopyOverlapError, ClosedHandleError, UnknownBackendError (ValueError);
NativeArgumentTypeError (TypeError); BackendUnavailableError, DeviceCopyError,
HandleStateError (RuntimeError).
"""

from collections.abc import Sequence
from os import PathLike
from typing import Any

from typing_extensions import Buffer

StrPath = str | bytes | PathLike[str] | PathLike[bytes]

IMPLEMENTATION: str
"""'c' for the C extension, 'python' for the fallback."""

def backends() -> dict[str, dict[str, Any]]:
    """Every backend (`host`, `hip`, `cuda`, `python`) with `built`, `usable`, `selected`,
    `reason` and its flags (`o_direct`, `crc32c_hw`, `threads`, `devices`, ...)."""

class HostArena:
    """Page-aligned host memory (anonymous mmap), zero-filled; supports the buffer protocol
    (`memoryview(arena)` is writable). `pinned=True` locks it in RAM (mlock) and, where a GPU
    backend is usable, registers it for DMA; `pinned` tells whether that worked."""

    nbytes: int
    pinned: bool
    backend: str
    def __init__(self, nbytes: int, *, pinned: bool = False) -> None: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def read(self, offset: int, size: int) -> bytes: ...
    def write(self, offset: int, data: Buffer) -> None: ...
    def close(self) -> None:
        """Unmap now (refused with BufferError while a memoryview is alive)."""
    def __enter__(self) -> HostArena: ...
    def __exit__(self, *exc: object) -> None: ...

class DeviceArena:
    """Device memory of a GPU backend ('cuda' or 'hip'); BackendUnavailableError (a
    RuntimeError) where that backend is not usable (not built, or no device). No buffer
    protocol: move bytes with `copy_batch` (or `read`/`write`, which stage through host
    memory)."""

    nbytes: int
    backend: str
    device: int
    batch_api: bool
    """Whether the last copy used the runtime's batched copy (cudaMemcpyBatchAsync)."""
    def __init__(self, nbytes: int, backend: str = "cuda", *, device: int = 0) -> None: ...
    def __len__(self) -> int: ...
    def read(self, offset: int, size: int) -> bytes: ...
    def write(self, offset: int, data: Buffer) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> DeviceArena: ...
    def __exit__(self, *exc: object) -> None: ...

KvLayer = tuple[int, int, Sequence[int], int, int]

class BlockCopier:
    """Gathers KV blocks out of buffers an engine owns (raw pointers, e.g. a torch tensor's
    `untyped_storage().data_ptr()`, on the device of `backend`) into slices of a host buffer,
    and scatters them back; every layer in one call. Backends: "host" (memcpy, synchronous;
    the engine's buffers are host memory), "cuda" / "hip" (BackendUnavailableError, a
    RuntimeError, where not usable). One thread at a time (HandleStateError otherwise)."""

    backend: str
    device: int
    batch_api: bool
    """Whether the last copy used the runtime's batched copy (cudaMemcpyBatchAsync)."""
    last_copies: int
    """Copies the last call issued (runs contiguous on both sides are merged)."""
    last_bytes: int
    registered: int
    def __init__(self, backend: str = "host", *, device: int = 0) -> None: ...
    def copy(
        self,
        layers: Sequence[KvLayer],
        num_blocks: int,
        block_ids: Sequence[int],
        host: Buffer,
        host_offsets: Sequence[int],
        *,
        to_host: bool,
        stream: int | None = None,
    ) -> int:
        """Layer l = (ptr, nbytes, starts, block_stride, run_bytes): block b's runs in that
        buffer are [ptr + start + b*block_stride, +run_bytes) for each start. Block i's slice
        (every layer's runs, end to end) is host[host_offsets[i]:]. `to_host`: engine ->
        host (a save), else host -> engine (a load). Checked before a byte moves: block ids
        < num_blocks, runs inside nbytes, slices inside host (IndexError); negatives and
        overlapping destinations (ValueError; CopyOverlapError for the overlaps); malformed
        layers (TypeError). GPU: the copies are enqueued and a ticket returned at once;
        with `stream` (a raw stream handle, torch's `current_stream().cuda_stream`), they
        come after the work already on that stream and later work on it waits for them.
        Host: done on return."""
    def wait(self, ticket: int) -> None:
        """Until the ticket's copies are done (then the host bytes are there)."""
    def done(self, ticket: int) -> bool: ...
    def synchronize(self) -> None: ...
    def register(self, buffer: Buffer) -> bool:
        """Page-lock a host buffer with the GPU runtime (once; kept referenced until
        unregister/close), so copies to and from it are DMA. False where not possible (host
        backend, or the runtime refused; copies still work, staged)."""
    def unregister(self, buffer: Buffer) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> BlockCopier: ...
    def __exit__(self, *exc: object) -> None: ...

def copy_batch(
    dst: Buffer | DeviceArena,
    dst_offsets: Sequence[int],
    src: Buffer | DeviceArena,
    src_offsets: Sequence[int],
    sizes: Sequence[int],
    *,
    threads: int = 0,
) -> int:
    """Copy slice i: src[src_offsets[i] : +sizes[i]] -> dst[dst_offsets[i] : +sizes[i]].
    Host to host: a pool of memcpy threads (`threads=0`: automatic; one thread for small
    batches). Any side a DeviceArena: async copies on the backend's streams, then synchronised.
    Returns the bytes copied."""

def memcpy_single(dst: Buffer, dst_offset: int, src: Buffer, src_offset: int, size: int) -> None:
    """One plain memcpy on the calling thread (GIL released): the benchmark's baseline."""

def read_batch(
    paths: Sequence[StrPath],
    dst: Buffer,
    dst_offsets: Sequence[int],
    sizes: Sequence[int],
    file_offsets: Sequence[int] | None = None,
    *,
    direct: bool = False,
    threads: int = 0,
) -> list[int]:
    """Read slice i: `sizes[i]` bytes of `paths[i]` at `file_offsets[i]` (default 0) into
    dst[dst_offsets[i]:]. Per slice: the bytes read (less than asked at end of file: bytes
    past it are left untouched) or -errno (e.g. -errno.ENOENT). `direct=True` uses O_DIRECT
    through aligned bounce buffers and silently uses buffered I/O for a file whose filesystem
    refuses it (see `probe_direct`). `threads=0`: automatic (up to 16 pread workers)."""

def write_batch(
    paths: Sequence[StrPath],
    src: Buffer,
    src_offsets: Sequence[int],
    sizes: Sequence[int],
    file_offsets: Sequence[int] | None = None,
    *,
    direct: bool = False,
    fsync: bool = False,
    threads: int = 0,
) -> list[int]:
    """Write slice i to `paths[i]` (created 0644 if missing) at `file_offsets[i]`; when
    `file_offsets` is None every file is written whole from offset 0 and truncated to
    `sizes[i]`. Per slice: bytes written or -errno. `fsync=True` fsyncs each file before
    returning. `direct=True`: O_DIRECT for the aligned part, buffered for an unaligned tail."""

def crc32c(
    buffer: Buffer, offset: int = 0, size: int = -1, *, value: int = 0, software: bool = False
) -> int:
    """CRC-32C (Castagnoli) of buffer[offset : offset+size] (size -1: to the end), continuing
    from `value` (the CRC of the bytes before). SSE4.2 instruction where the CPU has it, else
    slicing-by-8 tables (`software=True` forces them); both give identical results
    (crc32c(b"123456789") == 0xE3069283)."""

def crc32c_batch(
    buffer: Buffer, offsets: Sequence[int], sizes: Sequence[int], *, threads: int = 0
) -> list[int]:
    """CRC-32C of many slices of one buffer, in parallel for large batches."""

def probe_direct(directory: StrPath) -> tuple[bool, str]:
    """Whether O_DIRECT reads and writes work in `directory` (a temp file is written, read back
    and removed), and why not."""

def drop_page_cache(paths: Sequence[StrPath]) -> list[int]:
    """fdatasync then posix_fadvise(DONTNEED) each file, so the next read comes from the
    device. Per file: 0 or -errno."""
