"""The server's allocator setting (infra/serving/allocator.py): a large buffer freed and
allocated again is reused, not faulted in afresh page by page. Counted in minor page faults
(the kernel's count, not a timer), in a fresh interpreter per case: the setting applies to
the whole process and must come before its threads."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from fortis.infra.serving.allocator import keep_freed_memory

_PROBE = r"""
import ctypes, json, resource, sys
from fortis.infra.serving.allocator import keep_freed_memory
applied = keep_freed_memory(int(sys.argv[1]))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size = 64 << 20
faults = []
for _ in range(3):                 # what gRPC does with each 64 MiB answer: malloc, copy, free
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    libc.free(p)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def _probe(retain: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(retain)], capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout)


glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")


@glibc
def test_a_freed_large_buffer_is_reused_without_faulting_its_pages_in_again():
    pages = (64 << 20) // 4096
    kept = _probe(256 << 20)
    assert kept["applied"] is True
    # the first allocation faults its pages in; the next ones reuse them
    assert kept["faults"][0] > pages // 2
    assert max(kept["faults"][1:]) < pages // 20, kept
    default = _probe(0)
    assert default["applied"] is False
    # glibc's defaults: every 64 MiB buffer is a fresh mapping, every page faulted again
    assert min(default["faults"][1:]) > pages // 2, default


def test_zero_or_negative_changes_nothing():
    assert keep_freed_memory(0) is False
    assert keep_freed_memory(-5) is False
