"""Clock skew judged only from round trips short enough to bound it."""

from __future__ import annotations

import pytest

from treadle.domain.clock import SkewSample, SkewVerdict, judge_skew, max_round_trip_s


def _sample(*, before: float, db: float, after: float) -> SkewSample:
    return SkewSample(host_before_s=before, db_s=db, host_after_s=after)


def test_the_estimate_is_the_database_time_against_the_midpoint_of_the_round_trip() -> None:
    sample = _sample(before=100.0, db=103.2, after=100.4)
    assert sample.round_trip_s == pytest.approx(0.4)
    assert sample.skew_s == pytest.approx(3.0)


def test_a_long_round_trip_is_no_evidence_however_large_the_apparent_skew() -> None:
    # A 45 s stall: the database answered at its end, so the midpoint makes it look 22 s ahead.
    stalled = _sample(before=0.0, db=45.0, after=45.0)
    judgement = judge_skew([stalled], max_skew_s=2.0)
    assert judgement.verdict is SkewVerdict.UNKNOWN
    assert judgement.skew_s is None
    assert judgement.best_round_trip_s == 45.0


def test_a_short_round_trip_with_a_large_skew_is_evidence() -> None:
    judgement = judge_skew([_sample(before=0.0, db=10.05, after=0.1)], max_skew_s=2.0)
    assert judgement.verdict is SkewVerdict.TOO_LARGE
    assert judgement.skew_s == pytest.approx(10.0)
    assert judgement.uncertainty_s == pytest.approx(0.05)


@pytest.mark.parametrize("skew_s", [-4.3, 4.3])
def test_the_uncertainty_of_half_the_round_trip_is_given_to_the_host(skew_s: float) -> None:
    # 4.3 s away, +/-0.4 s: the true skew may be 3.9 s, within the 4 s limit (the bound is 1 s).
    rtt = 0.8
    sample = _sample(before=0.0, db=rtt / 2 + skew_s, after=rtt)
    judgement = judge_skew([sample], max_skew_s=4.0)
    assert judgement.verdict is SkewVerdict.WITHIN
    assert judgement.uncertainty_s == pytest.approx(0.4)
    # The same skew read over a 0.2 s round trip is certainly over the limit.
    tight = _sample(before=0.0, db=0.1 + skew_s, after=0.2)
    assert judge_skew([tight], max_skew_s=4.0).verdict is SkewVerdict.TOO_LARGE


def test_the_shortest_usable_round_trip_decides() -> None:
    samples = [
        _sample(before=0.0, db=30.0, after=20.0),  # stalled
        _sample(before=50.0, db=50.2, after=50.4),  # within the bound, skew 0
        _sample(before=60.0, db=63.01, after=60.02),  # shortest: skew 3 s
    ]
    judgement = judge_skew(samples, max_skew_s=2.0)
    assert judgement.verdict is SkewVerdict.TOO_LARGE
    assert judgement.skew_s == pytest.approx(3.0)
    assert judgement.best_round_trip_s == pytest.approx(0.02)


def test_a_small_skew_over_a_short_round_trip_is_within() -> None:
    judgement = judge_skew([_sample(before=0.0, db=0.51, after=0.02)], max_skew_s=2.0)
    assert judgement.verdict is SkewVerdict.WITHIN
    assert judgement.skew_s == pytest.approx(0.5)


def test_a_host_clock_that_stepped_back_during_the_read_is_no_evidence() -> None:
    judgement = judge_skew([_sample(before=100.0, db=200.0, after=99.0)], max_skew_s=2.0)
    assert judgement.verdict is SkewVerdict.UNKNOWN
    assert judgement.best_round_trip_s is None
    assert judge_skew([], max_skew_s=2.0).verdict is SkewVerdict.UNKNOWN


def test_the_round_trip_bound_is_a_quarter_of_the_allowed_skew() -> None:
    assert max_round_trip_s(2.0) == 0.5
    just_over = _sample(before=0.0, db=100.0, after=0.5001)
    assert judge_skew([just_over], max_skew_s=2.0).verdict is SkewVerdict.UNKNOWN
