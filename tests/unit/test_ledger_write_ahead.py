"""The ledger is what the target saw and sessions are per tenant, at the proxy's domain
level: no gRPC.

Findings reproduced: "A target answering one prediction too few: 40 images sent, 0 ledger
rows, INTERNAL to the client"; "a crash leaves ... never a silent gap"; "Ids are global".
"""

from __future__ import annotations

import threading

import pytest
from fortis.adapters.torch_target import ClassifierTarget
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from fortis.services.proxy.ledger import IN_FLIGHT, Ledger
from fortis.services.proxy.proxy import RetryPolicy, TargetEntry, TargetProxy
from fortis.services.proxy.ratelimit import RateLimiter


def _proxy(tmp_path, backend):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    proxy = TargetProxy(ledger, [TargetEntry(name="t", backend=backend, limiter=RateLimiter(0))],
                        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.0),
                        sleep=lambda s: None)
    return proxy, ledger


def _imgs(images, ids):
    return [image_msg(i, images[k % len(images)]) for k, i in enumerate(ids)]


class OneShort(ClassifierTarget):
    """Answers one prediction too few."""

    def predict(self, imgs):
        return super().predict(imgs)[:-1]


class Broken(ClassifierTarget):
    def predict(self, imgs):
        raise RuntimeError("x" * 10_000)


def test_one_prediction_too_few_is_recorded_as_failed(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, OneShort(fmnist_target))
    s = proxy.create_session(tenant="a", target="t", query_budget=100)
    # a malformed answer is the target's permanent failure (one error mapping):
    # FAILED_PRECONDITION naming the target, not INTERNAL
    with pytest.raises(errors.FailedPrecondition, match="target 't' answered 39"):
        proxy.predict(tenant="a", session_id=s.session_id, origin="x",
                      images=_imgs(images, [f"i{k}" for k in range(40)]))
    rows = ledger.entries(s.session_id)
    assert len(rows) == 40                                   # never a silent gap
    assert {r[9] for r in rows} == {"FAILED_PRECONDITION"}
    assert all("39 predictions for 40 images" in r[10] for r in rows)
    assert proxy.queries_attempted("a", s.session_id) == 40  # the target received them
    assert proxy.queries_used("a", s.session_id) == 0


def test_unexpected_backend_failure_is_recorded_bounded(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, Broken(fmnist_target))
    s = proxy.create_session(tenant="a", target="t")
    with pytest.raises(errors.Internal) as ei:
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a"]))
    assert "xxx" not in str(ei.value)                         # nothing internal leaks
    (row,) = ledger.entries(s.session_id)
    assert row[9] == "INTERNAL" and len(row[10]) <= 500


def test_rows_are_reserved_before_the_target_is_called(tmp_path, fmnist_target, fmnist_test_images):
    """While the target works, its rows are visible as in flight; a crash there leaves them."""
    images, _ = fmnist_test_images
    seen = []

    class Peeking(ClassifierTarget):
        def predict(self, imgs):
            seen.extend(r[9] for r in ledger.entries(s.session_id))
            return super().predict(imgs)

    proxy, ledger = _proxy(tmp_path, Peeking(fmnist_target))
    s = proxy.create_session(tenant="a", target="t")
    proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a", "b"]))
    assert seen == [IN_FLIGHT, IN_FLIGHT]
    assert {r[9] for r in ledger.entries(s.session_id)} == {"OK"}


def test_in_flight_rows_count_after_a_crash(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images

    class Crash(BaseException):
        pass

    class Dying(ClassifierTarget):
        def predict(self, imgs):
            raise Crash()      # the process "dies" while the target has the images

    proxy, ledger = _proxy(tmp_path, Dying(fmnist_target))
    s = proxy.create_session(tenant="a", target="t", per_image_budget=2)
    with pytest.raises(Crash):
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a"]))
    st = ledger.stats(s.session_id)
    assert st.in_flight == 1 and st.attempts == 1 and st.queries_ok == 0
    ledger.close()
    proxy2, ledger2 = _proxy(tmp_path, ClassifierTarget(fmnist_target))
    proxy2.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a"]))
    with pytest.raises(errors.BudgetExhausted):       # the in-flight attempt still counts
        proxy2.predict(tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, ["a"]))


def test_concurrent_reservations_group_commit(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, ClassifierTarget(fmnist_target))
    s = proxy.create_session(tenant="a", target="t")
    ts = [threading.Thread(target=lambda k=k: [proxy.predict(
        tenant="a", session_id=s.session_id, origin="x", images=_imgs(images, [f"{k}-{j}"]))
        for j in range(10)]) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    st = ledger.stats(s.session_id)
    assert st.queries_ok == 60 and st.in_flight == 0


def test_same_session_id_in_two_tenants(tmp_path, fmnist_target, fmnist_test_images):
    images, _ = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, ClassifierTarget(fmnist_target))
    a = proxy.create_session(tenant="a", target="t", session_id="ev/clean", query_budget=1)
    b = proxy.create_session(tenant="b", target="t", session_id="ev/clean", query_budget=5)
    assert (a.tenant, b.tenant) == ("a", "b") and b.query_budget == 5
    proxy.predict(tenant="b", session_id="ev/clean", origin="x", images=_imgs(images, ["p", "q"]))
    proxy.predict(tenant="a", session_id="ev/clean", origin="x", images=_imgs(images, ["p"]))
    assert proxy.queries_used("a", "ev/clean") == 1 and proxy.queries_used("b", "ev/clean") == 2
    assert ledger.stats("ev/clean", "a").queries_ok == 1
    assert {r[1] for r in ledger.entries("ev/clean", tenant="b")} == {"b"}
    with pytest.raises(errors.NotFound) as ei:
        proxy.session("c", "ev/clean")
    with pytest.raises(errors.NotFound) as free:
        proxy.session("c", "ev/other")
    assert str(ei.value).replace("ev/clean", "ID") == str(free.value).replace("ev/other", "ID")


@pytest.mark.parametrize("bad", ["..", "../x", "a/../b", ".hidden", "a//b", "a/", "a b",
                                 "a\nb", "x" * 201, "é"])
def test_session_ids_are_restricted(tmp_path, fmnist_target, bad):
    proxy, _ = _proxy(tmp_path, ClassifierTarget(fmnist_target))
    with pytest.raises(errors.InvalidArgument) as ei:
        proxy.create_session(tenant="a", target="t", session_id=bad)
    assert ei.value.violations[0].field == "session_id" and (len(bad) < 3 or bad not in str(ei.value))
    with pytest.raises(errors.InvalidArgument):
        proxy.session("a", bad)


def test_good_session_ids(tmp_path, fmnist_target):
    proxy, _ = _proxy(tmp_path, ClassifierTarget(fmnist_target))
    for sid in ["ev-1/clean", "ev_1.2/query/square/00001/a2", "x" * 200, "a.b"]:
        assert proxy.create_session(tenant="a", target="t", session_id=sid).session_id == sid


def test_restart_marks_interrupted_rows_and_replays_a_resumed_attempt(
        tmp_path, fmnist_target, fmnist_test_images):
    """The SIGKILL crash test, at the domain level: rows a dead process left in
    flight become INTERRUPTED on the next start, still charged; a resumed attempt repeating
    the dead process's answered queries gets the recorded answers (the target is not asked,
    no row added); what the target must see again is sent and counted; Q_m holds."""
    images, _ = fmnist_test_images
    arrivals: list[str] = []

    class Crash(BaseException):
        pass

    class Recording(ClassifierTarget):
        die = False

        def predict(self, imgs):
            arrivals.extend(i.image_id for i in imgs)
            if self.die:
                raise Crash()
            return super().predict(imgs)

    first = Recording(fmnist_target)
    proxy, ledger = _proxy(tmp_path, first)
    s = proxy.create_session(tenant="a", target="t", per_image_budget=3)
    call1 = [image_msg("a", images[0]), image_msg("b", images[1])]
    call2 = [image_msg("a", images[2]), image_msg("b", images[3])]
    answers = proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=call1)
    first.die = True
    with pytest.raises(Crash):
        proxy.predict(tenant="a", session_id=s.session_id, origin="x", images=call2)
    ledger.close()
    assert arrivals == ["a", "b", "a", "b"]

    proxy2, ledger2 = _proxy(tmp_path, Recording(fmnist_target))
    assert proxy2.interrupted_at_start == 2
    st = ledger2.stats(s.session_id, "a")
    assert (st.queries_ok, st.in_flight, st.interrupted, st.attempts) == (2, 2, 2, 4)
    assert [r[9] for r in ledger2.entries(s.session_id)] == ["OK", "OK", "INTERRUPTED",
                                                             "INTERRUPTED"]
    # the resumed attempt: call 1 again is answered from the ledger, identically
    again = proxy2.predict(tenant="a", session_id=s.session_id, origin="x", images=call1)
    assert [p.SerializeToString() for p in again.predictions] == \
        [p.SerializeToString() for p in answers.predictions]
    assert len(arrivals) == 4 and len(ledger2.entries(s.session_id)) == 4
    # call 2's answers were never recorded: it goes to the target again (rows 5, 6)
    proxy2.predict(tenant="a", session_id=s.session_id, origin="x", images=call2)
    assert arrivals[4:] == ["a", "b"] and ledger2.stats(s.session_id).attempts == 6
    # Q_m = 3 per image: a third new query of "a" is refused, nothing sent
    with pytest.raises(errors.BudgetExhausted):
        proxy2.predict(tenant="a", session_id=s.session_id, origin="x",
                       images=[image_msg("a", images[4])])
    assert len(arrivals) == 6 == len(ledger2.entries(s.session_id))


def test_replay_stops_where_a_resumed_attempt_departs(tmp_path, fmnist_target,
                                                      fmnist_test_images):
    """A resumed attempt that sends other bytes than its record is sent (and charged) from
    there on; the record of that image is not used again, even for bytes seen before."""
    images, _ = fmnist_test_images
    proxy, ledger = _proxy(tmp_path, ClassifierTarget(fmnist_target))
    s = proxy.create_session(tenant="a", target="t", per_image_budget=10)
    for k in range(2):
        proxy.predict(tenant="a", session_id=s.session_id, origin="x",
                      images=[image_msg("a", images[k])])
    ledger.close()
    proxy2, ledger2 = _proxy(tmp_path, ClassifierTarget(fmnist_target))
    proxy2.predict(tenant="a", session_id=s.session_id, origin="x",
                   images=[image_msg("a", images[5])])                   # departs: sent
    proxy2.predict(tenant="a", session_id=s.session_id, origin="x",
                   images=[image_msg("a", images[0])])                   # sent again
    assert ledger2.stats(s.session_id).attempts == 4


def test_a_call_still_running_when_the_ledger_closes_gets_unavailable(
        tmp_path, fmnist_target, fmnist_test_images):
    """Shutdown: the stack closes the ledger after the server's grace, while a call
    may still be running. It used to fail with sqlite's "Cannot operate on a closed database"
    (INTERNAL, logged as a bug); now every later ledger use is UNAVAILABLE, writers waiting
    in a group commit are all released, and the row reserved before the send stays IN_FLIGHT
    on disk (INTERRUPTED at the next start), so the ledger still shows what may have been sent."""
    images, _ = fmnist_test_images
    entered, release = threading.Event(), threading.Event()

    class Slow(ClassifierTarget):
        def predict(self, imgs):
            entered.set()
            release.wait(10)
            return super().predict(imgs)

    proxy, ledger = _proxy(tmp_path, Slow(fmnist_target))
    s = proxy.create_session(tenant="a", target="t")
    out: list[BaseException | None] = []

    def call() -> None:
        try:
            proxy.predict(tenant="a", session_id=s.session_id, origin="x",
                          images=_imgs(images, ["i0"]))
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            out.append(exc)

    t = threading.Thread(target=call)
    t.start()
    assert entered.wait(10)
    ledger.close()
    release.set()
    t.join(10)
    assert not t.is_alive() and len(out) == 1
    assert isinstance(out[0], errors.Unavailable), repr(out[0])
    with pytest.raises(errors.Unavailable):
        ledger.stats(s.session_id)
    ledger.close()                                      # idempotent
    again = Ledger(tmp_path / "ledger.sqlite")
    st = again.stats(s.session_id, "a")
    assert st.queries_ok == 0 and st.in_flight == 1     # the reserved row is on disk
    again.close()
