"""One audit scope's lane (gateway/pipeline/lanes.py): the post-audit of a ticket already given
goes before admissions waiting for the lane, and post-audits keep ticket order."""

from __future__ import annotations

import contextlib
import threading
import time

from gateway.pipeline.lanes import ScopeLane, TurnMissed


def _lane() -> ScopeLane:
    return ScopeLane("alice", hold=contextlib.nullcontext, sync=lambda: None)


def test_a_waiting_post_audit_goes_before_a_burst_of_admissions() -> None:
    """A dashboard: ticket 0 is given, then twenty more charts queue to be admitted while
    one admission holds the lane. Ticket 0's post-audit must come right after that
    admission, not after all twenty (it used to wait for them and miss its moment)."""
    lane = _lane()
    order: list[str] = []
    with lane.deciding():
        ticket = lane.ticket(None)
    admitting = threading.Event()
    release_first = threading.Event()

    def first_admission() -> None:
        with lane.deciding():
            admitting.set()
            release_first.wait(5)
            order.append("admit-0")

    def admission(i: int) -> None:
        with lane.deciding():
            order.append(f"admit-{i}")
            time.sleep(0.001)

    def post_audit() -> None:
        with lane.turn(ticket, time.monotonic() + 5):
            order.append("post-0")

    threads = [threading.Thread(target=first_admission)]
    threads[0].start()
    assert admitting.wait(5)
    threads += [threading.Thread(target=admission, args=(i,)) for i in range(1, 21)]
    for t in threads[1:]:
        t.start()
    time.sleep(0.05)  # the burst is queued behind the first admission
    post = threading.Thread(target=post_audit)
    post.start()
    deadline = time.monotonic() + 5
    while not getattr(lane, "_post_waiting", 0) and time.monotonic() < deadline:  # it waits
        time.sleep(0.001)
    release_first.set()
    for t in [*threads, post]:
        t.join(5)
    assert order[:2] == ["admit-0", "post-0"], order
    assert len(order) == 22


def test_post_audits_keep_ticket_order_and_a_late_turn_is_missed() -> None:
    lane = _lane()
    with lane.deciding():
        first, second = lane.ticket(None), lane.ticket(None)
    # the second ticket's turn cannot come while the first is not done
    try:
        with lane.turn(second, time.monotonic() + 0.05):
            raise AssertionError("the second ticket took its turn before the first")
    except TurnMissed:
        pass
    with lane.turn(first, None):
        pass
    lane.done(first)
    with lane.turn(second, time.monotonic() + 1):
        pass
