"""Rate limits, session budgets and daily quotas shared by proxy replicas, in Redis (SPEC: the
proxy counts every query per image and enforces budgets and the rate limit before anything is
sent).

Several ``fortis serve --service proxy --redis-url URL`` processes in front of one target
hold, *in total*, what one process holds alone:

* **the exact rate limit** (``RedisLimiterStore``, a ``ratelimit.LimiterStore``): the grant
  log and the GCRA schedule of each limiter live at ``fortis:{ns}:rl:target:<name>`` /
  ``fortis:{ns}:rl:tenant:<name>`` (a hash, and its ``:log`` list); one script
  (``redis_lua.GRANT``) applies the rules of ``RateLimiter._wait_for``/``_take`` to the
  target's and the tenant's limiter at once, all-or-nothing, on Redis ``TIME`` (the one
  clock of all replicas). So no closed grant-time window of ``window_s + jitter_s`` holds
  more than L images across all replicas, and no 1-second window at the target more than
  L. Each replica keeps its own fair queue (``FairQueue``) for its own waiting calls;
* **session budgets** (``RedisSessionBudgets``, the proxy's ``SharedBudgets``): a session's
  ``query_budget`` and per-image Q_m are checked and charged in one script at
  ``fortis:{ns}:budget:<tenant>:<session>``, started from the ledger's counts when the key
  is missing (first use, expiry, a Redis restart), and refunded for images never sent;
* **queries per UTC day** (``RedisDailyQuotas``) at ``fortis:{ns}:quota:day:<day>:<tenant>``,
  the same way (tenants without a limit are counted in this process only: no Redis call).

Keys share the hash tag ``{ns}``, so one tenant's keys stay in one slot of a Redis Cluster
(the scripts touch several keys). Idle keys expire (TTLs). Every Redis call has a bounded
timeout (``timeout_s``, default 0.5 s; one immediate reconnect on a dropped connection).

**Fail closed.** Any Redis error or timeout is ``errors.Unavailable("rate limiter store
unavailable: ...")`` (UNAVAILABLE; the message never holds the URL or its password): the
proxy sends nothing and records the refusal; calls succeed again as soon as Redis answers.
A refund that cannot reach Redis is logged and lost, so the counts err on the safe side
(more charged than sent, never the reverse).

Limits of this design, said plainly: replicas must be given the same rates (each passes its
own to the script); the budgets' start from "the ledger" is exact when the replicas share
one ledger (PostgreSQL); with one SQLite ledger per replica, a key lost after a Redis
restart restarts from the local rows only.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import structlog
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.proxy import redis_lua
from fortis.services.proxy.ledger import SessionRecord
from fortis.services.proxy.quotas import DAY_S, DailyQueryQuotas, Hold, utc_day
from fortis.services.proxy.ratelimit import RateLimiter

log = structlog.get_logger("fortis.proxy.redis")

__all__ = ["RedisDailyQuotas", "RedisLimiterStore", "RedisSessionBudgets", "RedisStore",
           "check_namespace"]

#: Default bound of every Redis call (connect, and each read), seconds.
DEFAULT_TIMEOUT_S = 0.5
#: How long an idle session's budget key lives (then it starts again from the ledger).
DEFAULT_BUDGET_TTL_S = 7 * DAY_S
#: A day's quota key outlives its day by this much.
_DAY_TTL_S = 2 * DAY_S
_SCHEMES = ("redis", "rediss", "unix")


def check_namespace(namespace: str) -> str:
    """The namespace of every key (``fortis:{ns}:...``): letters, digits, '-', '_', '.';
    ``InvalidArgument`` on ``redis_namespace`` otherwise (a brace would break the hash tag)."""
    ok = 0 < len(namespace) <= 64 and all(c.isalnum() or c in "-_." for c in namespace)
    if not ok or not namespace.isascii():
        raise errors.InvalidArgument("redis_namespace", "use 1 to 64 letters, digits, '-', "
                                     "'_' or '.'")
    return namespace


class RedisStore:
    """One Redis connection pool, the scripts, and the keys of one namespace."""

    def __init__(self, client: Any, *, namespace: str = "default", password: str = "",
                 budget_ttl_s: float = DEFAULT_BUDGET_TTL_S) -> None:
        self.client = client
        self.namespace = check_namespace(namespace)
        self.prefix = f"fortis:{{{self.namespace}}}:"
        self.budget_ttl_ms = int(budget_ttl_s * 1000)
        self._password = password
        self._scripts = {name: client.register_script(getattr(redis_lua, name))
                         for name in ("GRANT", "CHARGE", "REFUND", "DAY_CHARGE", "DAY_REFUND")}
        self._down = False
        self._state_lock = threading.Lock()
        self.limiter = RedisLimiterStore(self)
        self.budgets = RedisSessionBudgets(self)

    @classmethod
    def connect(cls, url: str, *, namespace: str = "default",
                timeout_s: float = DEFAULT_TIMEOUT_S,
                budget_ttl_s: float = DEFAULT_BUDGET_TTL_S) -> RedisStore:
        """A store for ``url`` (``redis://[user:password@]host:port/db``, ``rediss://``,
        ``unix://``). Nothing is sent yet: a Redis that is down refuses calls later (fail
        closed), it does not stop the server from starting. A malformed URL is
        ``InvalidArgument`` on ``redis_url``, without repeating the URL (it may hold a
        password)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        check_namespace(namespace)
        if not 0 < timeout_s <= 30:
            raise errors.InvalidArgument("redis_timeout", "must be > 0 and <= 30 seconds")
        try:
            parts = urlsplit(url)
            password = parts.password or ""
            if parts.scheme not in _SCHEMES or (parts.scheme != "unix" and not parts.hostname):
                raise ValueError("scheme")
            client = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                # one immediate reconnect (a pooled connection Redis closed); no timeout retry
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
                health_check_interval=0, decode_responses=False)
        except ValueError:
            raise errors.InvalidArgument(
                "redis_url", "expected redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://... "
                "or unix:///PATH (the value is not repeated: it may hold a password)") from None
        return cls(client, namespace=namespace, password=password, budget_ttl_s=budget_ttl_s)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def close(self) -> None:
        self.client.close()

    def _unavailable(self, exc: BaseException) -> errors.Unavailable:
        text = f"{type(exc).__name__}: {exc}"
        if self._password:
            text = text.replace(self._password, "***")
        with self._state_lock:
            was_down, self._down = self._down, True
        if not was_down:
            log.warning("rate_limiter_store_unavailable", error=text[:200])
        return errors.Unavailable(f"rate limiter store unavailable: {text[:200]}")

    def _up(self) -> None:
        if self._down:
            with self._state_lock:
                was_down, self._down = self._down, False
            if was_down:
                log.info("rate_limiter_store_available")

    def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one of the scripts (EVALSHA; loaded again when Redis lost it); any Redis
        error or timeout is ``errors.Unavailable`` (fail closed)."""
        try:
            out = self._scripts[script](keys=list(keys), args=list(args))
        except Exception as exc:  # noqa: BLE001 - every failure of the store fails closed
            raise self._unavailable(exc) from None
        self._up()
        return out

    def get(self, key: str) -> bytes | None:
        try:
            out = self.client.get(key)
        except Exception as exc:  # noqa: BLE001
            raise self._unavailable(exc) from None
        self._up()
        return out  # type: ignore[no-any-return]

    def ping(self) -> bool:
        """Whether Redis answers now (logged when it does not; never raises)."""
        try:
            self.client.ping()
        except Exception as exc:  # noqa: BLE001
            self._unavailable(exc)
            return False
        self._up()
        return True

    def daily_quotas(self, limit_of: Callable[[str], int]) -> RedisDailyQuotas:
        return RedisDailyQuotas(self, limit_of)


class RedisLimiterStore:
    """``ratelimit.LimiterStore`` in Redis: ``RateLimiter``s built with this store and keys
    ``target:<name>`` / ``tenant:<name>`` share their state with every replica."""

    def __init__(self, store: RedisStore, *, clock_us: Callable[[], int] | None = None
                 ) -> None:
        self._store = store
        #: the tests' fake clock (integer microseconds); None: Redis TIME, the one clock
        self._clock_us = clock_us

    def try_grant(self, n: int, shared: RateLimiter, rest: Sequence[RateLimiter]
                  ) -> tuple[float, float]:
        keys: list[str] = []
        args: list[Any] = [n, 1 + len(rest)]
        for x in (shared, *rest):
            k = self._store.key("rl", x.key)
            keys += [k, k + ":log"]
            # the window rounded up and the pacing as given: never looser than in process
            args += [x.limit, math.ceil(x.span * 1e6 - 1e-6), repr(x.interval * 1e6),
                     repr(x.tau * 1e6)]
        if self._clock_us is not None:
            args.append(int(self._clock_us()))
        res = self._store.run("GRANT", keys, args)
        return max(0, int(res[0])) / 1e6, max(0, int(res[1])) / 1e6


class RedisSessionBudgets:
    """The proxy's ``SharedBudgets`` in Redis: a session's hard budgets across replicas."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store

    def _key(self, rec: SessionRecord) -> str:
        return self._store.key("budget", rec.tenant, rec.session_id)

    @staticmethod
    def _counts(rec: SessionRecord, images: Sequence[common_pb2.Image]) -> dict[str, int]:
        counts: dict[str, int] = {}
        if rec.per_image_budget:
            for img in images:
                counts[img.image_id] = counts.get(img.image_id, 0) + 1
        return counts

    def reserve(self, rec: SessionRecord, images: Sequence[common_pb2.Image],
                initial: Callable[[], Mapping[str, int]]
                ) -> tuple[bool, int, dict[str, int]]:
        """Charge ``images`` to the session if both budgets allow, else nothing:
        ``(charged, attempts in the session, attempts of each image id asked)`` -- after the
        charge when charged, as they stand when refused. ``initial()`` gives the ledger's
        attempts per image id, read only when Redis has no count for the session."""
        counts = self._counts(rec, images)
        ids = list(counts)
        head: list[Any] = [rec.query_budget, rec.per_image_budget, self._store.budget_ttl_ms,
                           len(images), len(ids)]
        pairs: list[Any] = [x for i in ids for x in (i, counts[i])]
        key = self._key(rec)
        res = self._store.run("CHARGE", [key], [*head, 0, *pairs])
        if int(res[0]) == -1:
            start = dict(initial())
            per_image = start if rec.per_image_budget else {}
            init: list[Any] = [sum(start.values()), len(per_image),
                               *[x for i, k in per_image.items() for x in (i, k)]]
            res = self._store.run("CHARGE", [key], [*head, 1, *pairs, *init])
        return int(res[0]) == 1, int(res[1]), {i: int(v) for i, v in zip(ids, res[2:],
                                                                          strict=True)}

    def refund(self, rec: SessionRecord, images: Sequence[common_pb2.Image]) -> None:
        """Give back ``images`` (charged, never sent). Best effort: if Redis cannot be
        reached the charge stays (logged): more counted than sent, never the reverse."""
        if not images:
            return
        counts = self._counts(rec, images)
        try:
            self._store.run("REFUND", [self._key(rec)],
                            [len(images), len(counts),
                             *[x for i, k in counts.items() for x in (i, k)]])
        except errors.Unavailable:
            log.warning("budget_refund_lost", tenant=rec.tenant, session=rec.session_id,
                        images=len(images))


class _SharedHold(Hold):
    """Room held in Redis for one admitted call: charged at admission (so replicas never
    admit more than the limit together), the unsent rest given back at the end."""

    left: int

    def __init__(self, quotas: RedisDailyQuotas, tenant: str, n: int, day: int) -> None:
        super().__init__(quotas, tenant, n)
        self._shared, self._day_of_charge = quotas, day

    def take(self, k: int) -> None:
        self.left -= min(k, self.left)       # already counted in Redis at admission

    def release(self) -> None:
        if self.left:
            self._shared._give_back(self.tenant, self.left, self._day_of_charge)
        self.left = 0


class RedisDailyQuotas(DailyQueryQuotas):
    """Queries per UTC day per tenant, counted in Redis for tenants with a limit (the day
    from this replica's clock); tenants without one are counted in this process as before."""

    def __init__(self, store: RedisStore, limit_of: Callable[[str], int], *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(limit_of, clock=clock)
        self._store = store
        self._ledger: Any = None

    def load_from(self, ledger: Any) -> None:
        super().load_from(ledger)
        self._ledger = ledger       # a missing day key starts from the ledger's rows

    def _key(self, tenant: str, day: int) -> str:
        return self._store.key("quota", "day", str(day), tenant)

    def _charge(self, tenant: str, limit: int, n: int) -> tuple[bool, int, int]:
        day = utc_day(self._clock())
        key, ttl = self._key(tenant, day), _DAY_TTL_S * 1000
        res = self._store.run("DAY_CHARGE", [key], [limit, n, ttl, 0, 0])
        if int(res[0]) == -1:
            start = 0
            if self._ledger is not None:
                start = int(self._ledger.attempts_since(float(day * DAY_S)).get(tenant, 0))
            res = self._store.run("DAY_CHARGE", [key], [limit, n, ttl, 1, start])
        return int(res[0]) == 1, int(res[1]), day

    def _give_back(self, tenant: str, n: int, day: int) -> None:
        try:
            self._store.run("DAY_REFUND", [self._key(tenant, day)], [n])
        except errors.Unavailable:
            log.warning("quota_refund_lost", tenant=tenant, images=n)

    def admit(self, tenant: str, n: int) -> Hold:
        limit = self.limit_of(tenant)
        if not limit:
            return super().admit(tenant, n)
        ok, used, day = self._charge(tenant, limit, n)
        if not ok:
            with self._lock:
                self._day = day
                violation = self._violation(tenant, used, 0, limit, n)
            raise errors.QuotaExceeded([violation])
        return _SharedHold(self, tenant, n, day)

    def try_charge(self, tenant: str, n: int) -> bool:
        limit = self.limit_of(tenant)
        if not limit:
            return super().try_charge(tenant, n)
        return self._charge(tenant, limit, n)[0]

    def refund(self, tenant: str, n: int) -> None:
        if not self.limit_of(tenant):
            super().refund(tenant, n)
            return
        self._give_back(tenant, n, utc_day(self._clock()))

    def usage(self, tenant: str) -> tuple[int, int]:
        limit = self.limit_of(tenant)
        if not limit:
            return super().usage(tenant)
        raw = self._store.get(self._key(tenant, utc_day(self._clock())))
        return (int(raw) if raw else 0), limit
