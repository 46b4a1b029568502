#!/usr/bin/env python3
"""What building a request that carries images costs, by how it is built.
Under the upb protobuf runtime, a message built on its own and then passed to another message's
constructor (or ``append``/``extend``) is copied slowly, in proportion to its bytes; filled in
place (``repeated.add()`` then the fields: ``codec.add_images``) or copied with ``CopyFrom`` it
is a memcpy. Every request and answer between Fortis's services carries images, so the runner,
the perturbation service's query client, the proxy and the targets build them in place. Prints
JSON (microseconds per request of one image). Never part of the test run.

    python bench/codec.py [--n 2000] [--size 224]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import google.protobuf
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.core.tensors import array_to_tensor
from fortis.proxy.v1 import proxy_pb2
from fortis.services.common.codec import add_images


def _us(fn, n: int) -> float:
    for i in range(min(n, 100)):
        fn(i)
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return round((time.perf_counter() - t0) / n * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--size", type=int, default=224, help="image side (3 channels, uint8)")
    ns = ap.parse_args()
    img = np.random.default_rng(0).integers(0, 256, (ns.size, ns.size, 3), dtype=np.uint8)

    def constructor(i: int) -> object:        # the form Fortis used before
        return proxy_pb2.PredictRequest(session_id="s", origin="o", images=[
            common_pb2.Image(image_id=f"x{i}", tensor=array_to_tensor(img))])

    def in_place(i: int) -> object:           # codec.add_images
        req = proxy_pb2.PredictRequest(session_id="s", origin="o")
        add_images(req.images, [(f"x{i}", img)])
        return req

    def copy_from(i: int) -> object:          # a message built apart, then CopyFrom
        msg = common_pb2.Image(image_id=f"x{i}")
        msg.tensor.CopyFrom(array_to_tensor(img))
        req = proxy_pb2.PredictRequest(session_id="s", origin="o")
        req.images.add().CopyFrom(msg)
        return req

    assert constructor(1).SerializeToString() == in_place(1).SerializeToString()
    out = {"benchmark": "building a PredictRequest of one image", "image_bytes": img.nbytes,
           "n": ns.n, "protobuf": google.protobuf.__version__, "python": platform.python_version(),
           "constructor_us": _us(constructor, ns.n), "in_place_us": _us(in_place, ns.n),
           "copy_from_us": _us(copy_from, ns.n)}
    out["constructor_over_in_place"] = round(out["constructor_us"] / out["in_place_us"], 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
