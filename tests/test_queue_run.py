from sglang_obs.exporter.queue_run import RUN_BUCKETS, QueueRunTracker


def feed(tracker, samples):
    for t, q in samples:
        tracker.observe(float(t), q)


def test_current_run_grows_while_queue_stays_non_empty_and_resets_when_it_drains():
    tracker = QueueRunTracker()
    feed(tracker, [(0, 0), (1, 3), (2, 5), (3, 1)])
    assert tracker.state().current_seconds == 2.0
    tracker.observe(4.0, 0)
    state = tracker.state()
    assert state.current_seconds == 0.0
    assert state.runs_count == 1
    assert state.runs_sum_seconds == 3.0  # from first seen at t=1 to first seen empty at t=4
    assert state.nonempty_seconds_total == 3.0


def test_an_89_second_episode_lands_in_the_90_second_bucket_not_in_shorter_ones():
    tracker = QueueRunTracker()
    feed(tracker, [(t, 1) for t in range(0, 90)] + [(89, 0)])
    state = tracker.state()
    buckets = dict(state.cumulative_buckets())
    assert state.runs_sum_seconds == 89.0
    assert buckets["60.0"] == 0
    assert buckets["90.0"] == 1
    assert buckets["+Inf"] == 1
    assert len(state.bucket_counts) == len(RUN_BUCKETS) + 1


def test_total_counts_only_time_after_a_non_empty_observation():
    tracker = QueueRunTracker()
    feed(tracker, [(0, 2), (1, 0), (5, 0), (6, 4), (8, 4), (9, 0)])
    state = tracker.state()
    assert state.nonempty_seconds_total == 1.0 + 3.0
    assert state.runs_count == 2


def test_losing_the_server_closes_the_run_at_the_last_non_empty_sighting():
    tracker = QueueRunTracker()
    feed(tracker, [(0, 1), (10, 1)])
    tracker.lost()
    state = tracker.state()
    assert state.current_seconds == 0.0
    assert state.runs_count == 1
    assert state.runs_sum_seconds == 10.0
    # After the outage a new run starts from scratch, with no time counted across the gap.
    feed(tracker, [(100, 1), (101, 1)])
    assert tracker.state().current_seconds == 1.0
    assert tracker.state().nonempty_seconds_total == 11.0
