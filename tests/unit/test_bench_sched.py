"""A process's time on a CPU and waiting for one (bench.procs.sched_s), and the
per-request figures bench compare makes of them (bench.procs)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.procs import sched_per_request, sched_s, sum_sched


def test_a_process_cpu_and_wait_are_read_and_grow_with_work() -> None:
    before = sched_s(os.getpid())
    assert before is not None and before[0] > 0 and before[1] >= 0
    sum(i * i for i in range(300_000))  # some CPU of our own
    after = sched_s(os.getpid())
    assert after is not None and after[0] > before[0] and after[1] >= before[1]


def test_a_process_that_is_gone_reads_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert sched_s(child.pid) is None


def test_the_figures_are_per_request_milliseconds() -> None:
    assert sched_per_request("gateway", (1.0, 2.0), (1.5, 2.25), 100) == {
        "gateway_cpu_ms_per_request": 5.0,
        "gateway_cpu_wait_ms_per_request": 2.5,
    }
    assert sched_per_request("tierd", None, (1.0, 1.0), 10) == {}
    assert sched_per_request("tierd", (1.0, 1.0), (2.0, 2.0), 0) == {}
    assert sum_sched([(1.0, 0.5), (2.0, 0.25)]) == (3.0, 0.75)
    assert sum_sched([(1.0, 0.5), None]) is None
