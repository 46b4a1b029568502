"""Target-proxy domain logic without gRPC: rate limiter, ledger, budgets, retries.

The target is the real Fashion-MNIST CNN served in-process by ``ClassifierTarget`` (it
implements the proxy's ``TargetBackend`` protocol directly).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from fortis.adapters.torch_target import ClassifierTarget
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from fortis.services.proxy.ledger import Ledger, max_in_window
from fortis.services.proxy.proxy import RetryPolicy, TargetEntry, TargetProxy
from fortis.services.proxy.ratelimit import RateLimiter


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_rate_limiter_never_exceeds_limit_in_any_window():
    clock = FakeClock()
    rl = RateLimiter(10, clock=clock, sleep=clock.sleep)
    grants = []
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 5))
        t = rl.acquire(n)
        grants += [t] * n
        clock.t += float(rng.exponential(0.02))
    assert max_in_window(grants, 1.0) <= 10
    # and it sustains close to the limit: 200 calls of 1..4 images at 10/s. The exact limit
    # keeps a 0.1 s allowance for grant-to-arrival jitter (a window of 1.1 s at the grant
    # side) and batches that do not divide 10 cannot fill it: 7.7/s measured with this seed.
    span = grants[-1] - grants[0]
    assert len(grants) / span > 7.5


def test_rate_limiter_rejects_oversized_grant_and_bad_limits():
    rl = RateLimiter(5)
    with pytest.raises(ValueError):
        rl.acquire(6)
    with pytest.raises(ValueError):
        RateLimiter(-1)
    assert RateLimiter(0).unlimited


def test_max_in_window():
    assert max_in_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0) == 3
    assert max_in_window([], 1.0) == 0


def _proxy(tmp_path, fmnist_target, *, backend=None, rate=0.0, sleep=time.sleep):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    target = backend or ClassifierTarget(fmnist_target)
    proxy = TargetProxy(ledger, [TargetEntry(name="t", backend=target, limiter=RateLimiter(rate))],
                        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01), sleep=sleep)
    return proxy, ledger


def _counting_proxy(tmp_path, fmnist_target):
    """A proxy whose target records the size of every call it receives."""
    calls: list[int] = []

    class Counting(ClassifierTarget):
        def predict(self, imgs):
            calls.append(len(imgs))
            return super().predict(imgs)

    proxy, ledger = _proxy(tmp_path, fmnist_target, backend=Counting(fmnist_target))
    return proxy, ledger, calls


def _imgs(images, ids):
    return [image_msg(i, images[k]) for k, i in enumerate(ids)]


def test_queries_counted_per_image_and_recorded(tmp_path, fmnist_target, fmnist_test_images):
    images, labels = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, fmnist_target)
    s = proxy.create_session(tenant="a", target="t", query_budget=10)
    res = proxy.predict(tenant="a", session_id=s.session_id, origin="clean",
                        images=_imgs(images, [f"img{i}" for i in range(4)]))
    assert len(res.predictions) == 4 and res.queries_left == 6
    st = ledger.stats(s.session_id)
    assert st.queries_ok == 4 and set(st.per_image) == {"img0", "img1", "img2", "img3"}
    rows = ledger.entries(s.session_id)
    assert len(rows) == 4 and {r[9] for r in rows} == {"OK"}
    assert all(len(r[6]) == 64 for r in rows)          # sha256 of the input
    assert rows[0][7].startswith("top1=")              # output summary


def test_budget_refuses_whole_call_and_sends_nothing(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    proxy, ledger, calls = _counting_proxy(tmp_path, fmnist_target)
    s = proxy.create_session(tenant="a", target="t", query_budget=5, per_image_budget=2)
    proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a", "b", "c"]))
    with pytest.raises(errors.BudgetExhausted) as ei:
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a", "b", "c"]))
    assert "sessions/" in ei.value.violations[0].subject
    # per-image budget: a third query of image "a" is refused even within the session budget
    proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a"]))
    with pytest.raises(errors.BudgetExhausted) as ei:
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a"]))
    assert ei.value.violations[0].subject.endswith("/images/a")
    assert calls == [3, 1]                              # refused calls never reached the target
    st = ledger.stats(s.session_id)
    assert st.queries_ok == 4 and st.calls_refused == 2


def test_budget_survives_restart(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, fmnist_target)
    s = proxy.create_session(tenant="a", target="t", per_image_budget=2)
    proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a", "a"]))
    ledger.close()
    proxy2, ledger2 = _proxy(tmp_path, fmnist_target)      # same ledger file, new process state
    # a resumed attempt repeating the first query gets the recorded answer: the target is
    # not asked again and no row is added (Q_m holds across resumed attempts, CAN-9)
    again = proxy2.predict(tenant="a", session_id=s.session_id, origin="x",
                           images=_imgs(images, ["a"]))
    assert len(again.predictions) == 1 and ledger2.stats(s.session_id).attempts == 2
    with pytest.raises(errors.BudgetExhausted):               # a new query of "a" is refused
        proxy2.predict(tenant="a", session_id=s.session_id, origin="x",
                       images=[image_msg("a", images[2])])


def test_concurrent_calls_never_exceed_budget(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, fmnist_target)
    s = proxy.create_session(tenant="a", target="t", query_budget=50)
    ok = []
    refused = []

    def worker(k):
        for j in range(10):
            try:
                proxy.predict(tenant="a", session_id=s.session_id, origin="x",
                              images=_imgs(images, [f"w{k}-{j}", f"w{k}-{j}b"]))
                ok.append(2)
            except errors.BudgetExhausted:
                refused.append(1)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sum(ok) == 50 and ledger.stats(s.session_id).queries_ok == 50
    assert len(refused) == 60 - 25


class FlakyTarget(ClassifierTarget):
    """Fails with UNAVAILABLE for the first ``failures`` calls. A stand-in for a network
    outage of a remote service, which cannot be produced on demand here."""

    def __init__(self, model, failures):
        super().__init__(model)
        self.failures = failures
        self.calls = 0

    def predict(self, imgs):
        self.calls += 1
        if self.calls <= self.failures:
            raise errors.Unavailable("connection refused")
        return super().predict(imgs)


def test_retries_with_backoff_then_success(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    sleeps = []
    flaky = FlakyTarget(fmnist_target, failures=2)
    proxy, ledger = _proxy(tmp_path, fmnist_target, backend=flaky, sleep=sleeps.append)
    s = proxy.create_session(tenant="a", target="t")
    proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a"]))
    assert sleeps == [0.01, 0.02]                       # exponential backoff
    rows = ledger.entries(s.session_id)
    # write-ahead: every attempt the target received is its own row
    assert [(r[9], r[13]) for r in rows] == [("UNAVAILABLE", 1), ("UNAVAILABLE", 2), ("OK", 3)]
    assert len({r[12] for r in rows}) == 1               # one call id
    assert proxy.queries_used("a", s.session_id) == 1    # answered (IEEE-M6)
    assert proxy.queries_attempted("a", s.session_id) == 3


def test_failed_attempts_recorded_and_charged(tmp_path, fmnist_target, fmnist_test_images):
    """Every attempt the target received counts against the hard budget; a retry the budget
    cannot pay is not sent."""
    images, _ = fmnist_test_images
    flaky = FlakyTarget(fmnist_target, failures=99)
    proxy, ledger = _proxy(tmp_path, fmnist_target, backend=flaky, sleep=lambda s: None)
    s = proxy.create_session(tenant="a", target="t", query_budget=2)
    with pytest.raises(errors.Unavailable):
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a", "b"]))
    assert flaky.calls == 1                              # no budget left for a retry
    st = ledger.stats(s.session_id)
    assert st.queries_failed == 2 and st.queries_ok == 0 and st.attempts == 2
    assert {r[9] for r in ledger.entries(s.session_id)} == {"UNAVAILABLE"}
    assert proxy.queries_used("a", s.session_id) == 0    # nothing answered
    assert proxy.queries_attempted("a", s.session_id) == 2
    with pytest.raises(errors.BudgetExhausted):
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["c"]))
    # unlimited session: all three attempts are sent and recorded
    u = proxy.create_session(tenant="a", target="t", per_image_budget=5)
    with pytest.raises(errors.Unavailable):
        proxy.predict(tenant="a", session_id=u.session_id, origin="x", images=_imgs(images, ["a"]))
    assert [r[13] for r in ledger.entries(u.session_id)] == [1, 2, 3]
    assert ledger.stats(u.session_id).per_image_attempts == {"a": 3}


def test_sessions_are_per_tenant_and_idempotent(tmp_path, fmnist_target):
    proxy, _ = _proxy(tmp_path, fmnist_target)
    s = proxy.create_session(tenant="a", target="t", session_id="s1", query_budget=3)
    assert proxy.create_session(tenant="a", target="t", session_id="s1", query_budget=3) == s
    with pytest.raises(errors.AlreadyExists):
        proxy.create_session(tenant="a", target="t", session_id="s1", query_budget=4)
    with pytest.raises(errors.NotFound):
        proxy.session("b", "s1")
    with pytest.raises(errors.NotFound):
        proxy.create_session(tenant="a", target="nope")
    with pytest.raises(errors.InvalidArgument) as ei:
        proxy.create_session(tenant="a", target="t", query_budget=-1)
    assert ei.value.violations[0].field == "query_budget"


def test_a_call_waiting_for_the_rate_limit_holds_no_cpu_slot(tmp_path, fmnist_target,
                                                             fmnist_test_images):
    """A built-in target computes in the proxy's process, so each call to it takes a slot of
    the tenant's CPU share -- but not while it only waits for the rate limiter: with one slot,
    bob's call held back by the target's rate leaves the slot to alice's work meanwhile, and
    is still answered (and recorded) after."""
    from fortis.infra.serving.workshare import WorkShare

    images, _ = fmnist_test_images
    share = WorkShare(1)
    limiter = RateLimiter(2, jitter_s=0.0)
    proxy = TargetProxy(Ledger(tmp_path / "ledger.sqlite"),
                        [TargetEntry(name="t", backend=ClassifierTarget(fmnist_target),
                                     limiter=limiter, builtin_model="fmnist-cnn")],
                        work=share)
    try:
        s = proxy.create_session(tenant="bob", target="t")
        proxy.predict(tenant="bob", session_id=s.session_id, origin="x",
                      images=_imgs(images, ["b0", "b1"]))       # this second's two images
        done: list[object] = []
        bob = threading.Thread(target=lambda: done.append(proxy.predict(
            tenant="bob", session_id=s.session_id, origin="x",
            images=_imgs(images, ["b2", "b3"]))), daemon=True)
        bob.start()
        deadline = time.monotonic() + 10
        while len(limiter.queue) == 0:          # bob's call waits for its grant
            assert time.monotonic() < deadline and bob.is_alive()
            time.sleep(0.005)
        with share.slot("alice"):               # at once: bob's wait holds no slot
            assert bob.is_alive() and len(limiter.queue) == 1
        bob.join(10)
        assert len(done) == 1 and len(done[0].predictions) == 2     # type: ignore[attr-defined]
        assert [r[9] for r in proxy.ledger.entries(s.session_id)] == ["OK"] * 4   # status
        assert share.snapshot().get("bob", {}).get("running", 0) == 0
    finally:
        share.close()


@pytest.mark.parametrize(("shape", "data", "field"), [
    ((28, 28, 1), b"x" * 5, "images[1].tensor.data"),                  # bytes != shape
    ((100000, 100000, 3), b"", "images[1].tensor.shape"),              # past the element bound
    ((28, 0, 1), b"", "images[1].tensor.shape"),                       # a zero dimension
    ((), b"", "images[1].tensor.shape"),                               # no dimension at all
])
def test_a_self_contradicting_tensor_is_refused_before_it_is_charged(
        tmp_path, fmnist_target, fmnist_test_images, shape, data, field):
    """A tensor whose shape, dtype and bytes disagree is not an image for any target: the
    call is refused naming the field, nothing is sent, charged or recorded."""
    images, _ = fmnist_test_images
    proxy, ledger, calls = _counting_proxy(tmp_path, fmnist_target)
    s = proxy.create_session(tenant="a", target="t", query_budget=5, per_image_budget=2)
    bad = common_pb2.Image(image_id="bad")
    bad.tensor.dtype = common_pb2.D_TYPE_UINT8
    bad.tensor.shape.extend(shape)
    bad.tensor.data = data
    good = _imgs(images, ["good"])[0]
    with pytest.raises(errors.InvalidArgument) as ei:
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=[good, bad])
    assert ei.value.violations[0].field == field
    assert calls == []
    assert proxy.queries_attempted("a", s.session_id) == 0
    assert ledger.entries(s.session_id) == []
    # the session is untouched: a well-formed call still has its whole budget
    assert proxy.predict(tenant="a", session_id=s.session_id, origin="x",
                         images=[good]).queries_left == 4
