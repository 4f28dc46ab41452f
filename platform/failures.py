"""The two kinds of failure a job's caller tells apart, below every floor that raises them: the input's fault
(:class:`BadInput`: shown to whoever submitted it, never retried) and a passing one (:class:`TransientError`: retried
with backoff). The job queue classifies by them (:mod:`posttrain.platform.jobs.registry`); an engine's tier catalogue,
a task builder or a training kind raises them without importing the queue."""

from __future__ import annotations


class BadInput(ValueError):
    """A job failed because of its input (a kind raises it; never retried)."""


class TransientError(RuntimeError):
    """A failure worth retrying (a flaky network, a busy resource): retried with backoff."""
