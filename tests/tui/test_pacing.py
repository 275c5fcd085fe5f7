"""The streaming write pacer: writes as often as the app thread's CPU budget allows, within bounds."""

import pytest

from radixchat.tui.pacing import WritePacer


class Clocks:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0

    def pass_time(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu


def pacer(c: Clocks, **kw) -> WritePacer:
    return WritePacer(clock=lambda: c.wall, cpu=lambda: c.cpu, **kw)


def test_the_first_write_goes_out_at_once_and_the_next_waits_at_least_the_fastest_interval():
    c = Clocks()
    p = pacer(c, fastest=0.2, slowest=1.0, share=0.05)
    assert p.due()
    p.wrote()
    c.pass_time(0.1, 0.0)
    assert not p.due()
    c.pass_time(0.11, 0.0)
    assert p.due()


@pytest.mark.parametrize(
    ("cpu_spent", "expected"),
    [(0.001, 0.2), (0.02, 0.4), (0.04, 0.8), (0.5, 1.0)],  # cheap frames: 5/s; costly: as slow as 1/s
)
def test_the_wait_keeps_the_app_threads_cpu_share_within_budget(cpu_spent, expected):
    c = Clocks()
    p = pacer(c, fastest=0.2, slowest=1.0, share=0.05)
    p.wrote()
    c.pass_time(0.2, cpu_spent)  # what the period after the first write cost this thread
    p.wrote()
    assert p.interval == pytest.approx(expected)
    c.pass_time(expected - 0.01, 0.0)
    assert not p.due()
    c.pass_time(0.02, 0.0)
    assert p.due()


def test_the_pace_recovers_when_frames_get_cheap_again():
    c = Clocks()
    p = pacer(c, fastest=0.2, slowest=1.0, share=0.05)
    p.wrote()
    c.pass_time(0.2, 0.5)
    p.wrote()
    assert p.interval == 1.0
    c.pass_time(1.0, 0.002)
    p.wrote()
    assert p.interval == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("fastest", "slowest", "share"), [(0.0, 1.0, 0.05), (2.0, 1.0, 0.05), (0.2, 1.0, 0.0)]
)
def test_bad_pacing_is_refused(fastest, slowest, share):
    with pytest.raises(ValueError, match="bad pacing"):
        WritePacer(fastest=fastest, slowest=slowest, share=share)
