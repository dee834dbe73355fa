"""x_jobs: a durable job queue inside PostgreSQL, and its thin Python client."""

from __future__ import annotations

from x_jobs.errors import XJobsError, translate

__all__ = ["XJobsError", "translate"]
__version__ = "0.1.0"
