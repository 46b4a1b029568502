"""How the C allocator of a server process keeps the memory its large messages pass through.

A server's large answers and requests (a 64 MiB perturbed image, a 1 MiB upload chunk) each
pass through buffers the C library allocates: gRPC's copy of an answer, a request's bytes, a
decoded array. With glibc's defaults every buffer over 32 MiB is a fresh ``mmap``, given
back to the kernel when freed, so each 64 MiB answer faults in 16,384 new pages. gRPC makes
its copy of an answer while holding the interpreter lock: measured here, ~31 ms of every
other call of the process waiting per 64 MiB answer, of which the page faults are ~24 ms
(docs/benchmarks.md, "Where the p99 went"). Kept memory is reused without faults.

:func:`keep_freed_memory` asks glibc (``mallopt``) to serve large buffers from its heap
instead of ``mmap`` (one arena: a thread's own arenas are at most 64 MiB and would map such
buffers anyway) and to give memory back only when more than ``retain_bytes`` is free at the
heap's top. The cost is stated: the process keeps up to ``retain_bytes`` it no longer uses
(its RSS stays near its high-water mark, which the memory budget bounds, docs/limits.md).

Other C libraries, or ``retain_bytes`` 0: nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["DEFAULT_RETAIN_BYTES", "keep_freed_memory"]

#: Free memory kept at the heap's top before any is given back (bytes): a few of the largest
#: answers (64 MiB each by default) are reused without faulting their pages in again.
DEFAULT_RETAIN_BYTES = 256 * 1024 ** 2

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory(retain_bytes: int = DEFAULT_RETAIN_BYTES) -> bool:
    """Keep freed memory for reuse (see the module docstring). Call before the process starts
    its threads (a thread's arena is chosen at its first allocation). True when glibc took
    every setting; False when nothing was changed (``retain_bytes`` 0, not glibc)."""
    if retain_bytes <= 0 or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    retain = min(int(retain_bytes), 2 ** 31 - 1)
    results = [mallopt(_M_ARENA_MAX, 1), mallopt(_M_MMAP_MAX, 0),
               mallopt(_M_TRIM_THRESHOLD, retain),
               # the heap grows in steps of a few MiB, not page by page
               mallopt(_M_TOP_PAD, min(retain, 16 * 1024 ** 2))]
    return all(r == 1 for r in results)
