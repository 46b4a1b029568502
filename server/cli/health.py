"""``fortis health``: the gRPC health check of a running service (the image's
``HEALTHCHECK``, and what an operator runs by hand). Exit 0 when the service answers
SERVING, 1 otherwise (NOT_SERVING while draining on SIGTERM, unreachable, timed out)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("health", help="gRPC health check of a running Fortis service")
    sp.add_argument("--address", default="127.0.0.1:50051")
    sp.add_argument("--service", default="",
                    help="a service name, e.g. fortis.proxy.v1.TargetProxyService "
                         "(default: the server as a whole)")
    sp.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS")
    sp.add_argument("--tls-ca", metavar="FILE", help="connect with TLS trusting this CA")
    sp.add_argument("--tls-cert", metavar="FILE",
                    help="client certificate (PEM) for a server that requires mTLS")
    sp.add_argument("--tls-key", metavar="FILE", help="the client certificate's key (PEM)")
    sp.add_argument("--tls-server-name", metavar="NAME",
                    help="the name to verify in the server's certificate (default: the host "
                         "dialled), e.g. the Service name when probing 127.0.0.1 in a pod")
    sp.set_defaults(fn=cmd_health)


def cmd_health(ns: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if ns.tls_ca:
        def read(path: str | None) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()

        creds = grpc.ssl_channel_credentials(read(ns.tls_ca), read(ns.tls_key),
                                             read(ns.tls_cert))
        opts = ([("grpc.ssl_target_name_override", ns.tls_server_name)]
                if ns.tls_server_name else [])
        ch = grpc.secure_channel(ns.address, creds, options=opts)
    else:
        ch = grpc.insecure_channel(ns.address)
    try:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=ns.service), timeout=ns.timeout)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError as exc:
        status = f"{exc.code().name}: {exc.details() or ''}".strip()
    finally:
        ch.close()
    print(json.dumps({"address": ns.address, "service": ns.service, "status": status}))
    return 0 if status == "SERVING" else 1
