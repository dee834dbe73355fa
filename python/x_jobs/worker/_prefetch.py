"""How many claimed jobs a worker keeps waiting beside the running ones, when it is not told.

Claims and settlements go to the database in batches as big as the room a worker has, so the
room decides what a job costs the database: with room for 20 (10 running, 10 waiting) a drain of
no-op jobs ran at a sixth of the rate it reached with room for 510. But a waiting job is held,
leased to this worker, where no other worker may take it; for jobs that run a second each, 500
waiting would be minutes of work hoarded by one process. So the local queue is sized by time:
enough jobs to keep the handlers busy for HORIZON seconds, from the mean time a handler takes,
between ``concurrency`` (one claim's worth, what jobs of unknown length get) and MOST.
"""

from __future__ import annotations

#: Seconds of work a worker keeps claimed beyond what it runs: how long a waiting job waits for a
#: handler at most, about, and so how long it is kept from other workers.
HORIZON = 0.5
#: Past this, a drain of no-op jobs gained nothing measurable (docs/benchmarks.md), and a claim
#: hands out 1,000 rows at most.
MOST = 500
#: Weight of the newest run time in the moving mean: a change in the mix of jobs shows within
#: a few claims' worth of them.
WEIGHT = 0.05


class PrefetchSizer:
    """The local queue's size for ``concurrency`` handlers, following the jobs' run times."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.mean_seconds: float | None = None
        self.size = concurrency

    def ran(self, seconds: float) -> bool:
        """Count one handler's run time; answers whether the size changed."""
        seconds = max(seconds, 0.0)
        if self.mean_seconds is None:
            self.mean_seconds = seconds
        else:
            self.mean_seconds += WEIGHT * (seconds - self.mean_seconds)
        wanted = MOST
        if self.mean_seconds > 0:
            wanted = int(self.concurrency * HORIZON / self.mean_seconds)
        size = max(self.concurrency, min(MOST, wanted))
        changed = size != self.size
        self.size = size
        return changed
