"""The app of the relay tests that need sinks apps.relays has not:
``python -m x_jobs relay apps.relay_edges:app``. It writes to the tables of ``apps.relays``
(``SCHEMA``; the tests create them).

Its sinks, by topic:

- ``record`` and ``gated``: those of ``apps.relays``;
- ``slow``: records that it began (``begun``), sleeps ``payload["sleep"]`` seconds, then records
  the delivery (``delivery``): a delivery as long as the test wants, longer than the lease say;
- ``hang``: records that it began, then never returns (a sink stuck for good).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import x_jobs
from apps import relays
from x_jobs.outbox import OutboxMessage

logger = logging.getLogger(__name__)

app = x_jobs.App()

app.outbox.add_sink("record", relays.record)
app.outbox.add_sink("gated", relays.gated)


@app.outbox.sink("slow")
def slow(message: OutboxMessage) -> None:
    relays._db(relays.BEGIN, [message.id, os.getpid()])
    time.sleep(float(message.payload["sleep"]))
    relays._record(message)


@app.outbox.sink("hang")
def hang(message: OutboxMessage) -> None:
    relays._db(relays.BEGIN, [message.id, os.getpid()])
    threading.Event().wait()
