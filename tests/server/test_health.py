from progrouter.server.health import HealthTracker


def test_state_flips_only_after_consecutive_results() -> None:
    tracker = HealthTracker(["http://a:1", "http://b:1"], failure_threshold=3, success_threshold=2)
    a = "http://a:1"
    assert tracker.unhealthy() == []
    assert [tracker.record(a, False) for _ in range(2)] == [False, False]
    assert tracker.record(a, True) is False  # a success resets the failure streak
    assert [tracker.record(a, False) for _ in range(3)] == [False, False, True]
    assert tracker.unhealthy() == [a]
    assert tracker.record(a, True) is False
    assert tracker.record(a, False) is False  # resets the success streak
    assert [tracker.record(a, True) for _ in range(2)] == [False, True]
    assert tracker.unhealthy() == [] and tracker.healthy["http://b:1"]
