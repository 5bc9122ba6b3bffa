from tracer.path.clock import ManualClock
from tracer.path.stages import GAP_BY_NAME, PATH_GAPS, Stage
from tracer.path.stamps import SkewTracker, Stamps, compute_gaps, timeline

MS = 1_000_000


def stamped(**ms: float) -> Stamps:
    s = Stamps()
    base = 1_700_000_000_000 * MS
    for name, v in ms.items():
        s.set(Stage[name.upper()], base + int(v * MS))
    return s


def test_gaps_from_a_fake_clock():
    clock = ManualClock()
    s = Stamps()
    for stage, step_ms in [(Stage.PRODUCE, 0), (Stage.BROKER_STORE, 3), (Stage.CLIENT_PULL, 40),
                           (Stage.DISPATCH_ENQUEUE, 1), (Stage.HANDLER_START, 250), (Stage.HANDLER_END, 90)]:
        clock.advance(step_ms * MS)
        s.set(stage, clock.now_ns())
    got = {g.gap.name: g.seconds for g in compute_gaps(s)}
    assert got == {"send": 0.003, "broker_wait": 0.040, "client_buffer": 0.001, "dispatch_wait": 0.250,
                   "handler": 0.090, "end_to_end": 0.384, "consumer_wait": 0.251}
    path = sum(got[g.name] for g in PATH_GAPS)
    assert abs(path - got["end_to_end"]) < 1e-9


def test_missing_stamps_give_no_gap():
    s = stamped(client_pull=0, handler_start=5, handler_end=9)
    names = {g.gap.name for g in compute_gaps(s)}
    assert names == {"handler", "consumer_wait"}


def test_negative_cross_clock_gap_is_clamped_and_flagged_as_skew():
    # broker clock 7 ms behind the producer's: send comes out as -4 ms
    s = stamped(produce=10, broker_store=6, client_pull=20)
    send = next(g for g in compute_gaps(s) if g.gap.name == "send")
    assert send.seconds == 0.0 and send.clamped and send.skewed and send.raw_ns == -4 * MS


def test_negative_gap_within_broker_resolution_is_rounding_not_skew():
    s = stamped(produce=10.7, broker_store=10.0)  # the broker stores whole milliseconds
    send = next(g for g in compute_gaps(s) if g.gap.name == "send")
    assert send.clamped and not send.skewed


def test_same_clock_gaps_never_cross_clocks():
    assert not GAP_BY_NAME["dispatch_wait"].crosses_clocks
    assert GAP_BY_NAME["send"].peer == "producer->broker"
    assert GAP_BY_NAME["broker_wait"].peer == "broker->consumer"


def test_timeline_is_monotonic_even_under_skew():
    s = stamped(produce=10, broker_store=6, client_pull=20, dispatch_enqueue=21, handler_start=22, handler_end=30)
    line = timeline(s)
    times = [t for _, t in line]
    assert times == sorted(times)
    assert dict(line)[Stage.BROKER_STORE] == dict(line)[Stage.PRODUCE]  # moved up, not down


def test_skew_tracker_keeps_smallest_recent_gap_per_peer():
    sk = SkewTracker()
    assert sk.observe("producer->broker", 5 * MS, 0) == 5 * MS
    assert sk.observe("producer->broker", 9 * MS, 0) is None
    assert sk.observe("producer->broker", -2 * MS, 0) == -2 * MS
    assert sk.bound_ns("producer->broker") == -2 * MS
    assert sk.bound_ns("broker->consumer") is None


# -- issue 19 item 8: no part exceeds the whole ---------------------------------------------------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tracer.path.stamps import causal, store_stamp  # noqa: E402

_T0 = 1_700_000_000_000 * MS


@given(st.lists(st.integers(-20 * MS, 20 * MS), min_size=6, max_size=6), st.integers(0, 5))
def test_a_messages_parts_never_exceed_its_whole_whatever_the_clocks_did(offsets, missing) -> None:
    """Consumer stamps in order (one monotonic clock); producer and broker stamps anywhere."""
    s = Stamps()
    consumer = sorted(abs(o) for o in offsets[2:])
    s.set(Stage.PRODUCE, _T0 + offsets[0])
    s.set(Stage.BROKER_STORE, _T0 + offsets[1])
    for stage, o in zip((Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START, Stage.HANDLER_END), consumer):
        s.set(stage, _T0 + o)
    if missing in (0, 1):
        s.set(Stage(missing), 0)  # a message without a produce or a store stamp
    gaps = {g.gap.name: g.seconds for g in compute_gaps(s)}
    whole = gaps["end_to_end"] if "end_to_end" in gaps else None
    for name, v in gaps.items():
        assert v >= 0, (name, gaps)
        if whole is not None:
            assert v <= whole + 1e-12, (name, gaps)
    if all(g.name in gaps for g in PATH_GAPS):
        assert abs(sum(gaps[g.name] for g in PATH_GAPS) - whole) < 1e-9, gaps
    # the consumer's own gaps are exact: never moved
    c = causal(s.times)
    for stage in (Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START, Stage.HANDLER_END):
        assert c[stage] == s.times[stage]
    # spans are drawn from the same stamps: every stamp no earlier than the one before
    drawn = [ns for _stage, ns in timeline(s)]
    assert drawn == sorted(drawn)


def test_the_brokers_millisecond_store_time_is_placed_within_its_millisecond() -> None:
    ms = 1_700_000_000_123
    floor = ms * MS
    assert store_stamp(ms) == floor  # nothing known around it: the floor, as the broker wrote it
    assert store_stamp(ms, produce_ns=floor + 700_000) == floor + 700_000  # not before the produce
    assert store_stamp(ms, produce_ns=floor + 700_000, pull_ns=floor + 400_000) == floor + 400_000  # nor after the pull
    assert store_stamp(ms, produce_ns=floor + 3 * MS) == floor + MS - 1  # skew beyond it: the millisecond's end
    assert store_stamp(ms, produce_ns=floor - 5 * MS, pull_ns=floor - MS) == floor  # skew: the floor, reported
