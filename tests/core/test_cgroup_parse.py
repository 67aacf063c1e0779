"""The cgroup v2 file formats (this host is v1, where test_metrics reads real counters): the
parser against files written in the kernel's documented format."""

from __future__ import annotations

from hybrid.workstation.cgroup import Cgroup, delta


def _tree(root, user, system, throttled, rbytes, wbytes, ooms, peak):  # type: ignore[no-untyped-def]
    (root / "cpu.stat").write_text(
        f"usage_usec {user + system}\nuser_usec {user}\nsystem_usec {system}\n"
        f"nr_periods 10\nnr_throttled 2\nthrottled_usec {throttled}\n"
    )
    (root / "io.stat").write_text(
        f"8:0 rbytes={rbytes} wbytes={wbytes} rios=3 wios=4 dbytes=0 dios=0\n"
        "8:16 rbytes=100 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n"
    )
    (root / "memory.events").write_text(f"low 0\nhigh 0\nmax 5\noom 1\noom_kill {ooms}\n")
    (root / "memory.peak").write_text(f"{peak}\n")
    (root / "memory.current").write_text("1000\n")


def test_v2_counters_and_their_delta(tmp_path):
    group = Cgroup({}, tmp_path)
    _tree(tmp_path, 1_000_000, 250_000, 0, 4096, 0, 0, 10_000)
    before = group.sample()
    _tree(tmp_path, 2_500_000, 500_000, 300_000, 8192, 65536, 1, 50_000_000)
    used = delta(before, group.sample())
    assert used.cpu_user_seconds == 1.5 and used.cpu_system_seconds == 0.25
    assert used.cpu_throttled_seconds == 0.3
    assert (used.block_read_bytes, used.block_write_bytes) == (4096, 65536)
    assert used.oom_events == 1 and used.peak_memory_bytes == 50_000_000


def test_a_group_that_is_gone_gives_no_numbers(tmp_path):
    group = Cgroup({}, tmp_path / "gone")
    assert group.sample() is None
    assert delta(None, None).cpu_user_seconds is None
    assert Cgroup.of_pid(0) is None
