"""Batched file reads and writes of the pure-Python fallback (same contract as the C ones).

Each slice is one job on a thread pool: open, then os.preadv / os.pwritev (they release the
GIL) until the slice is done, end of file or an error (reported as -errno). O_DIRECT needs
aligned file offsets, sizes and memory: a slice is read through a page-aligned mmap bounce
buffer covering the aligned span around it; writes go direct for the aligned head and
buffered for the tail. A file whose filesystem refuses O_DIRECT (EINVAL) is read buffered.
"""

from __future__ import annotations

import errno
import functools
import mmap
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tierd.native import _checks
from tierd.native.errors import NativeArgumentError

ALIGN = 4096
MAX_THREADS = 16
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def _open(path: Any, flags: int, direct: bool) -> tuple[int, bool]:
    """Open, with O_DIRECT when asked and allowed; returns (fd, direct_in_use)."""
    if direct and _O_DIRECT:
        try:
            return os.open(path, flags | _O_DIRECT, 0o644), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def _pread_full(fd: int, view: memoryview, offset: int) -> int:
    done = 0
    while done < view.nbytes:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _pwrite_full(fd: int, view: memoryview, offset: int) -> int:
    done = 0
    while done < view.nbytes:
        done += os.pwritev(fd, [view[done:]], offset + done)
    return done


def _read_direct(fd: int, dst: memoryview, off: int, size: int, foff: int) -> int:
    start = foff - foff % ALIGN
    span = -(-(foff + size - start) // ALIGN) * ALIGN
    with mmap.mmap(-1, span) as bounce:
        bview = memoryview(bounce)
        got = _pread_full(fd, bview, start)
        n = max(0, min(size, got - (foff - start)))
        dst[off : off + n] = bview[foff - start : foff - start + n]
        bview.release()
        return n


def _read_one(path: Any, dst: memoryview, off: int, size: int, foff: int, direct: bool) -> int:
    try:
        fd, use_direct = _open(path, os.O_RDONLY, direct)
    except OSError as exc:
        return -(exc.errno or errno.EIO)
    try:
        if use_direct and size:
            try:
                return _read_direct(fd, dst, off, size, foff)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(fd)  # the filesystem refused O_DIRECT I/O: read buffered
                fd = os.open(path, os.O_RDONLY)
        return _pread_full(fd, dst[off : off + size], foff)
    except OSError as exc:
        return -(exc.errno or errno.EIO)
    finally:
        os.close(fd)


def _write_one(
    path: Any, src: memoryview, off: int, size: int, foff: int | None, direct: bool, sync: bool
) -> int:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if foff is None else 0)
    pos = 0 if foff is None else foff
    try:
        fd, use_direct = _open(path, flags, direct and pos % ALIGN == 0)
    except OSError as exc:
        return -(exc.errno or errno.EIO)
    try:
        head = size - size % ALIGN if use_direct else 0
        done = 0
        if head:
            with mmap.mmap(-1, head) as bounce:
                bview = memoryview(bounce)
                bview[:] = src[off : off + head]
                done = _pwrite_full(fd, bview, pos)
                bview.release()
        if done < size:
            if use_direct:
                os.close(fd)
                fd = os.open(path, os.O_WRONLY)
            done += _pwrite_full(fd, src[off + done : off + size], pos + done)
        if sync:
            os.fsync(fd)
        return done
    except OSError as exc:
        return -(exc.errno or errno.EIO)
    finally:
        os.close(fd)


def _run(jobs: list[Callable[[], int]], threads: int) -> list[int]:
    if threads < 0:
        raise NativeArgumentError("threads must be >= 0")
    workers = min(len(jobs), threads or MAX_THREADS)
    if workers <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job(), jobs))


def read_batch(
    paths: Sequence[Any],
    dst: Any,
    dst_offsets: Sequence[int],
    sizes: Sequence[int],
    file_offsets: Sequence[int] | None = None,
    *,
    direct: bool = False,
    threads: int = 0,
) -> list[int]:
    view = _checks.as_bytes_view(dst, "dst", writable=True)
    doffs = _checks.int_list(dst_offsets, "dst_offsets")
    szs = _checks.int_list(sizes, "sizes")
    foffs = [0] * len(szs) if file_offsets is None else _checks.int_list(file_offsets, "")
    paths = [os.fspath(p) for p in paths]
    _checks.check_lengths(("paths", paths), ("dst_offsets", doffs), ("sizes", szs), ("", foffs))
    _checks.check_ranges("dst", view.nbytes, doffs, szs)
    _checks.check_file_offsets(foffs)
    _checks.check_no_overlap(_checks.address_of(view), doffs, szs)
    jobs: list[Callable[[], int]] = [
        functools.partial(_read_one, p, view, d, s, f, direct)
        for p, d, s, f in zip(paths, doffs, szs, foffs, strict=True)
    ]
    return _run(jobs, threads)


def write_batch(
    paths: Sequence[Any],
    src: Any,
    src_offsets: Sequence[int],
    sizes: Sequence[int],
    file_offsets: Sequence[int] | None = None,
    *,
    direct: bool = False,
    fsync: bool = False,
    threads: int = 0,
) -> list[int]:
    view = _checks.as_bytes_view(src, "src", writable=False)
    soffs = _checks.int_list(src_offsets, "src_offsets")
    szs = _checks.int_list(sizes, "sizes")
    foffs: list[int | None] = (
        [None] * len(szs)
        if file_offsets is None
        else list(_checks.int_list(file_offsets, "file_offsets"))
    )
    paths = [os.fspath(p) for p in paths]
    _checks.check_lengths(("paths", paths), ("src_offsets", soffs), ("sizes", szs), ("", foffs))
    _checks.check_ranges("src", view.nbytes, soffs, szs)
    _checks.check_file_offsets([f for f in foffs if f is not None])
    jobs: list[Callable[[], int]] = [
        functools.partial(_write_one, p, view, o, s, f, direct, fsync)
        for p, o, s, f in zip(paths, soffs, szs, foffs, strict=True)
    ]
    return _run(jobs, threads)


def probe_direct(directory: Any) -> tuple[bool, str]:
    if not _O_DIRECT:
        return False, "this platform has no O_DIRECT"
    fd, path = tempfile.mkstemp(prefix=".odirect-probe-", dir=directory)
    os.close(fd)
    try:
        try:
            fd = os.open(path, os.O_RDWR | _O_DIRECT)
        except OSError as exc:
            return False, f"open(O_DIRECT) refused: {os.strerror(exc.errno or 0)}"
        try:
            with mmap.mmap(-1, ALIGN) as buf:
                view = memoryview(buf)
                view[:] = b"\x5a" * ALIGN
                os.pwritev(fd, [view], 0)
                got = os.preadv(fd, [view], 0)
                view.release()
            return (got == ALIGN, "" if got == ALIGN else f"short O_DIRECT read ({got})")
        except OSError as exc:
            return False, f"O_DIRECT I/O refused: {os.strerror(exc.errno or 0)}"
        finally:
            os.close(fd)
    finally:
        os.unlink(path)


def drop_page_cache(paths: Sequence[Any]) -> list[int]:
    out = []
    for path in paths:
        try:
            fd = os.open(os.fspath(path), os.O_RDONLY)
        except OSError as exc:
            out.append(-(exc.errno or errno.EIO))
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            out.append(0)
        except OSError as exc:
            out.append(-(exc.errno or errno.EIO))
        finally:
            os.close(fd)
    return out
