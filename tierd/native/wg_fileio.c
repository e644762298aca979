/* Batched file I/O: one slice per work item (see wg_parallel_for), each opened, read or
 * written with pread/pwrite until done, end of file or an error (-errno), then closed.
 * O_DIRECT: reads go straight into the destination when its address, the file offset and
 * the size are 4 KiB aligned, else through an aligned bounce buffer covering the aligned
 * span around the slice; writes send the aligned head direct and the tail buffered. A
 * filesystem that refuses O_DIRECT (EINVAL at open or at the first I/O) gets buffered I/O. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wg_common.h"

static int wg_open(const char *path, int flags, int direct, int *direct_used) {
    *direct_used = 0;
#ifdef O_DIRECT
    if (direct) {
        int fd = open(path, flags | O_DIRECT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            *direct_used = 1;
            return fd;
        }
        if (errno != EINVAL)
            return -errno;
    }
#else
    (void)direct;
#endif
    int fd = open(path, flags | O_CLOEXEC, 0644);
    return fd >= 0 ? fd : -errno;
}

/* Reads up to len bytes at off; returns bytes read (short at end of file) or -errno. */
static int64_t wg_pread_full(int fd, char *buf, size_t len, off_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, buf + done, len - done, off + (off_t)done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

static int64_t wg_pwrite_full(int fd, const char *buf, size_t len, off_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(fd, buf + done, len - done, off + (off_t)done);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        done += (size_t)w;
    }
    return (int64_t)done;
}

static int wg_aligned(const void *p, size_t size, off_t off) {
    return ((uintptr_t)p % WG_ALIGN) == 0 && size % WG_ALIGN == 0 && off % WG_ALIGN == 0;
}

static int64_t wg_read_direct(int fd, wg_io *io) {
    if (wg_aligned(io->buf, io->size, io->file_offset))
        return wg_pread_full(fd, io->buf, io->size, io->file_offset);
    off_t start = io->file_offset - io->file_offset % WG_ALIGN;
    size_t lead = (size_t)(io->file_offset - start);
    size_t span = (lead + io->size + WG_ALIGN - 1) / WG_ALIGN * WG_ALIGN;
    void *bounce = NULL;
    if (posix_memalign(&bounce, WG_ALIGN, span) != 0)
        return -ENOMEM;
    int64_t got = wg_pread_full(fd, (char *)bounce, span, start);
    if (got >= 0) {
        size_t n = (size_t)got > lead ? (size_t)got - lead : 0;
        if (n > io->size)
            n = io->size;
        memcpy(io->buf, (char *)bounce + lead, n);
        got = (int64_t)n;
    }
    free(bounce);
    return got;
}

void wg_read_item(void *batch_, size_t i) {
    wg_io_batch *batch = (wg_io_batch *)batch_;
    wg_io *io = &batch->items[i];
    int direct_used = 0;
    int fd = wg_open(io->path, O_RDONLY, batch->direct && io->size > 0, &direct_used);
    if (fd < 0) {
        io->status = fd;
        return;
    }
    int64_t r;
    if (direct_used) {
        r = wg_read_direct(fd, io);
        if (r == -EINVAL) { /* the filesystem refused O_DIRECT I/O after open */
            close(fd);
            fd = open(io->path, O_RDONLY | O_CLOEXEC);
            r = fd < 0 ? -errno : wg_pread_full(fd, io->buf, io->size, io->file_offset);
        }
    } else {
        r = wg_pread_full(fd, io->buf, io->size, io->file_offset);
    }
    if (fd >= 0)
        close(fd);
    io->status = r;
}

/* Writes the aligned head of a slice with O_DIRECT (through a bounce buffer when the source
 * is not aligned); returns bytes written or -errno. */
static int64_t wg_write_direct_head(int fd, const wg_io *io, size_t head) {
    if (((uintptr_t)io->buf % WG_ALIGN) == 0)
        return wg_pwrite_full(fd, io->buf, head, io->file_offset);
    void *bounce = NULL;
    if (posix_memalign(&bounce, WG_ALIGN, head) != 0)
        return -ENOMEM;
    memcpy(bounce, io->buf, head);
    int64_t w = wg_pwrite_full(fd, (const char *)bounce, head, io->file_offset);
    free(bounce);
    return w;
}

void wg_write_item(void *batch_, size_t i) {
    wg_io_batch *batch = (wg_io_batch *)batch_;
    wg_io *io = &batch->items[i];
    int flags = O_WRONLY | O_CREAT | (batch->truncate ? O_TRUNC : 0);
    size_t head = io->size - io->size % WG_ALIGN;
    int want_direct = batch->direct && head > 0 && io->file_offset % WG_ALIGN == 0;
    int direct_used = 0;
    int fd = wg_open(io->path, flags, want_direct, &direct_used);
    if (fd < 0) {
        io->status = fd;
        return;
    }
    int64_t done = 0;
    if (direct_used) {
        done = wg_write_direct_head(fd, io, head);
        if (done == -EINVAL)
            done = 0; /* refused: everything goes buffered below */
        close(fd);
        fd = open(io->path, O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            io->status = -errno;
            return;
        }
    }
    if (done >= 0 && (size_t)done < io->size) {
        int64_t w = wg_pwrite_full(fd, io->buf + done, io->size - (size_t)done,
                                   io->file_offset + (off_t)done);
        done = w < 0 ? w : done + w;
    }
    if (done >= 0 && batch->fsync && fsync(fd) != 0)
        done = -errno;
    close(fd);
    io->status = done;
}

int wg_probe_direct(const char *directory, char *why, size_t whylen) {
#ifndef O_DIRECT
    snprintf(why, whylen, "this platform has no O_DIRECT");
    return 0;
#else
    char path[4096];
    snprintf(path, sizeof(path), "%s/.odirect-probe-XXXXXX", directory);
    int tmp = mkstemp(path);
    if (tmp < 0) {
        snprintf(why, whylen, "cannot create a probe file: %s", strerror(errno));
        return 0;
    }
    close(tmp);
    int ok = 0;
    int fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
    void *buf = NULL;
    if (fd < 0) {
        snprintf(why, whylen, "open(O_DIRECT) refused: %s", strerror(errno));
    } else if (posix_memalign(&buf, WG_ALIGN, WG_ALIGN) != 0) {
        snprintf(why, whylen, "out of memory");
    } else {
        memset(buf, 0x5a, WG_ALIGN);
        int64_t w = wg_pwrite_full(fd, (const char *)buf, WG_ALIGN, 0);
        int64_t r = w == (int64_t)WG_ALIGN ? wg_pread_full(fd, (char *)buf, WG_ALIGN, 0) : w;
        ok = r == (int64_t)WG_ALIGN;
        if (!ok)
            snprintf(why, whylen, "O_DIRECT I/O refused: %s",
                     r < 0 ? strerror((int)-r) : "short transfer");
        else if (whylen)
            why[0] = '\0';
    }
    free(buf);
    if (fd >= 0)
        close(fd);
    unlink(path);
    return ok;
#endif
}

int wg_drop_page_cache(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (fdatasync(fd) != 0)
        rc = -errno;
    else {
        int e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        if (e != 0)
            rc = -e;
    }
    close(fd);
    return rc;
}
