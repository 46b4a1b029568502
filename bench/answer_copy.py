#!/usr/bin/env python3
"""What one large answer costs every *other* call of a server process: gRPC copies an answer's
bytes while it holds the interpreter lock, and with the C library's defaults the buffer it
copies into is a fresh mapping whose pages all fault in. A plain grpcio server (no Fortis
code in the path) answers 64 MiB to a client in another process; a watchdog thread in the
server sleeps 1 ms at a time and records how late it wakes (a late wake-up is time every
other thread could not run). Run with glibc's defaults and with freed memory kept
(infra/serving/allocator.py, ``fortis serve --keep-freed-mib``), side by side in one run,
each in a fresh process. Prints JSON; never part of the test run.

    python bench/answer_copy.py [--mib 64] [--calls 8]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import threading
import time
from concurrent import futures

_SERVER_OPTS = [("grpc.max_send_message_length", 1 << 30)]
_CLIENT_OPTS = [("grpc.max_receive_message_length", 1 << 30)]


def _server(retain_mib: int, mib: int, calls: int) -> dict:
    from fortis.infra.serving.allocator import keep_freed_memory
    applied = keep_freed_memory(retain_mib << 20)
    import grpc

    late: list[float] = []
    stop = threading.Event()

    def watchdog() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            over = time.perf_counter() - t - 0.001
            if over > 0.002:
                late.append(over * 1000)

    answer = bytes(mib << 20)
    server = grpc.server(futures.ThreadPoolExecutor(4), options=_SERVER_OPTS)
    handler = grpc.method_handlers_generic_handler("bench.Copy", {
        "Get": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer,
                                                   lambda b: b, lambda b: b)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = subprocess.Popen([sys.executable, __file__, "--client", str(port), "--calls",
                               str(calls)], stdout=subprocess.PIPE, text=True)
    threading.Thread(target=watchdog, daemon=True).start()
    out, _ = client.communicate(timeout=600)
    stop.set()
    server.stop(0)
    call_ms = json.loads(out)["call_ms"]
    warm = call_ms[1:]            # the first call also warms the channel up
    return {"allocator_setting_applied": applied,
            "call_ms_median": round(sorted(warm)[len(warm) // 2], 1),
            "stalls_over_2ms": len(late),
            "stall_ms_total": round(sum(late), 1),
            "stall_ms_per_answer": round(sum(late) / calls, 1),
            "stall_ms_max": round(max(late, default=0.0), 1)}


def _client(port: int, calls: int) -> None:
    import grpc
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=_CLIENT_OPTS) as ch:
        get = ch.unary_unary("/bench.Copy/Get")
        ms = []
        for _ in range(calls):
            t = time.perf_counter()
            get(b"")
            ms.append((time.perf_counter() - t) * 1000)
            time.sleep(0.2)            # each answer's stall stands alone
    print(json.dumps({"call_ms": ms}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="answer size (default 64 MiB, the "
                    "largest answer fortis serve sends by default)")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--server", type=int, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.client is not None:
        _client(ns.client, ns.calls)
        return
    if ns.server is not None:
        print(json.dumps(_server(ns.server, ns.mib, ns.calls)))
        return
    runs = {}
    for name, retain in (("c_library_defaults", 0), ("freed_memory_kept_256mib", 256)):
        out = subprocess.run([sys.executable, __file__, "--server", str(retain), "--mib",
                              str(ns.mib), "--calls", str(ns.calls)], capture_output=True,
                             text=True, check=True, timeout=900)
        runs[name] = json.loads(out.stdout)
    a, b = runs["c_library_defaults"], runs["freed_memory_kept_256mib"]
    print(json.dumps({
        "benchmark": "answer_copy", "answer_mib": ns.mib, "calls": ns.calls, "runs": runs,
        "ratios_defaults_over_kept": {
            "stall_ms_per_answer": round(a["stall_ms_per_answer"]
                                         / max(b["stall_ms_per_answer"], 1e-9), 2),
            "call_ms_median": round(a["call_ms_median"] / max(b["call_ms_median"], 1e-9), 2)},
        "python": platform.python_version(), "libc": "-".join(platform.libc_ver())},
        indent=2))


if __name__ == "__main__":
    main()
