import aiohttp

from progrouter.server.hop.health import HealthChecker, HealthTracker
from support.redirect import redirect_to_canary


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


async def test_a_redirect_fails_the_health_check_and_is_never_followed() -> None:
    async with redirect_to_canary() as redirect, aiohttp.ClientSession() as session:
        tracker = HealthTracker([redirect.worker_url], failure_threshold=1, success_threshold=1)
        checker = HealthChecker(
            tracker,
            session,
            endpoint="/health",
            interval=1.0,
            timeout=5.0,
            headers={},
            on_change=lambda: None,
        )
        assert await checker.probe(redirect.worker_url) is False
        assert redirect.canary_hits == 0
