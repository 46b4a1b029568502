"""gRPC options for running the services behind Kubernetes headless Services.

HTTP/2 keeps one long-lived connection per client and server, so a client that resolved a
headless Service once would keep calling the replicas it first found, and a replica added by
a scale-out would get no calls. Two settings fix that:

* servers close each connection after ``max_connection_age`` (a GOAWAY: calls in flight
  finish, new calls open a new connection, and the client re-resolves the name);
* internal channels to a ``dns:///`` name use the ``round_robin`` policy: one subchannel per
  address the name resolves to, calls spread over all of them (``pick_first``, gRPC's
  default, sends every call to the first address). An ``ipv4:``/``ipv6:`` address list
  (``ipv4:10.0.0.5:50051,10.0.0.6:50051``) is balanced the same way: the shape of a headless
  Service without DNS (local replicas, ``tests/integration/test_scale_out.py``).

Pure configuration: no grpc import here (the options are plain tuples).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from fortis.services.common import errors

#: Default age after which a server closes a connection (clients reconnect and re-resolve).
DEFAULT_MAX_CONNECTION_AGE_S = 300.0
#: Environment variable with the age in seconds (the Helm chart's ConfigMap sets it); 0: never.
MAX_CONNECTION_AGE_ENV = "FORTIS_MAX_CONNECTION_AGE_S"
#: Service config of internal channels to ``dns:///`` names: round_robin over the servers
#: that say SERVING. With ``healthCheckConfig`` each subchannel watches its server's gRPC
#: health, so a replica that drains on SIGTERM (NOT_SERVING, infra/serving/server.py) gets
#: no new call from these channels while it finishes the calls it has.
ROUND_ROBIN_SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}],
                                         "healthCheckConfig": {"serviceName": ""}})


def max_connection_age_s(value: float | None = None,
                         environ: Mapping[str, str] | None = None) -> float:
    """``value`` when given, else ``$FORTIS_MAX_CONNECTION_AGE_S``, else the default (300 s).
    A value that is not a number >= 0 is the operator's error, named."""
    if value is None:
        raw = (os.environ if environ is None else environ).get(MAX_CONNECTION_AGE_ENV, "").strip()
        if not raw:
            return DEFAULT_MAX_CONNECTION_AGE_S
        try:
            value = float(raw)
        except ValueError:
            raise errors.InvalidArgument("max_connection_age_s", f"${MAX_CONNECTION_AGE_ENV} "
                                         f"'{raw[:40]}' is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise errors.InvalidArgument("max_connection_age_s",
                                     f"must be a number of seconds >= 0 (0: never), got {value}")
    return float(value)


def server_options(max_connection_age: float,
                   grace: float | None = None) -> list[tuple[str, int]]:
    """Server options closing each connection after ``max_connection_age`` seconds (0: never).

    ``grace`` (None: unlimited, gRPC's default) is how long calls in flight on an aged
    connection may still run before it is cut: unlimited by default, so a long server stream
    (an evaluation's progress) is never cut by the rebalancing, only new calls move."""
    if max_connection_age <= 0:
        return []
    opts = [("grpc.max_connection_age_ms", max(1, int(max_connection_age * 1000)))]
    if grace is not None:
        opts.append(("grpc.max_connection_age_grace_ms", max(0, int(grace * 1000))))
    return opts


#: gRPC target schemes that name a list of addresses, given as a list: ``ipv4:`` and
#: ``ipv6:`` (``ipv4:127.0.0.1:7001,127.0.0.1:7002``, gRPC's own comma-separated form).
ADDRESS_LIST_SCHEMES = ("ipv4:", "ipv6:")


def is_multi_address(address: str) -> bool:
    """True for a target gRPC resolves to several servers and balances per call with
    ``round_robin``: a ``dns:`` name (a headless Service) or an ``ipv4:``/``ipv6:`` address
    list (the same shape without DNS, e.g. replicas on loopback ports)."""
    return address.strip().lower().startswith(("dns:", *ADDRESS_LIST_SCHEMES))


def client_options(address: str) -> list[tuple[str, str | int]]:
    """Channel options for ``address``: ``round_robin`` over every address a ``dns:`` name
    resolves to (a headless Service's pods) or an ``ipv4:``/``ipv6:`` list names; nothing
    for a plain HOST:PORT (one server)."""
    if not is_multi_address(address):
        return []
    opts: list[tuple[str, str | int]] = [("grpc.service_config", ROUND_ROBIN_SERVICE_CONFIG)]
    if address.strip().lower().startswith("dns:"):
        # a GOAWAY from an aged connection re-resolves the name at once
        opts.append(("grpc.dns_min_time_between_resolutions_ms", 1000))
    return opts
