"""rules.freshness: which tags pulled with Always the admission policy may place
from the catalog (pure, a fake monotonic clock)."""

from __future__ import annotations

import pytest

from podplacement.rules.freshness import PullAlwaysFreshness

A, B = "reg.example/a:1", "reg.example/b:1"


def test_a_tag_is_published_once_confirmed_and_for_the_window_only() -> None:
    f = PullAlwaysFreshness(5.0, keep=60.0)
    f.use(A, 0.0)
    assert f.published(0.0) == {}  # not confirmed yet
    assert f.due(0.0) == [A]
    assert f.due(0.1) == []  # being checked: not handed out twice
    f.confirmed(A, "sha256:1", 0.2)
    assert f.published(0.2) == {A: "sha256:1"}
    assert f.due(2.6) == []  # checked again every half window
    assert f.due(2.7) == [A]
    # the check is late (registry slow): the tag leaves once the window passed
    assert f.published(5.19) == {A: "sha256:1"}
    assert f.published(5.2) == {}
    f.confirmed(A, "sha256:2", 5.3)
    assert f.published(5.3) == {A: "sha256:2"}


def test_a_failed_check_unpublishes_at_once() -> None:
    f = PullAlwaysFreshness(5.0)
    f.use(A, 0.0)
    f.due(0.0)
    f.confirmed(A, "sha256:1", 0.0)
    f.due(3.0)
    f.failed(A)
    assert f.published(3.0) == {}
    assert f.due(3.0) == [A]  # tried again at the next pass


def test_a_tag_no_longer_in_use_is_neither_checked_nor_published() -> None:
    f = PullAlwaysFreshness(4.0, keep=10.0)
    f.use(A, 0.0)
    f.use(B, 8.0)
    for image in f.due(8.0):
        f.confirmed(image, "sha256:x", 8.0)
    assert f.published(9.0) == {A: "sha256:x", B: "sha256:x"}
    assert f.published(10.5) == {B: "sha256:x"}  # A's last pod was 10.5 s ago
    assert f.due(10.5) == [B]
    assert len(f) == 1


def test_a_window_of_zero_publishes_and_checks_nothing() -> None:
    f = PullAlwaysFreshness(0.0)
    f.use(A, 0.0)
    assert f.due(0.0) == []
    assert f.published(0.0) == {}


def test_bounded_least_recently_used_out_first() -> None:
    f = PullAlwaysFreshness(5.0, max_images=2)
    f.use(A, 0.0)
    f.use(B, 1.0)
    f.use(A, 2.0)
    f.use("reg.example/c:1", 3.0)
    assert sorted(f.due(3.0)) == sorted([A, "reg.example/c:1"])


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        PullAlwaysFreshness(-1.0)
    with pytest.raises(ValueError):
        PullAlwaysFreshness(1.0, max_images=0)
