"""How the provider's errors end an Airflow task: the Airflow edge of ``exceptions.is_permanent``.

A permanent error (bad input, a damaged or diverged target) fails the task at once with
``AirflowFailException``: retrying burns time and hides the message under retries. Any other
error is left to Airflow's retries. Either way the user sees the product's one-line message
last and alone: the library traceback it was raised from (gRPC, pyarrow, SQLAlchemy) goes to
the task log at DEBUG level, where it helps a bug report without burying the remedy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from airflow_provider_vitess.exceptions import VitessProviderError, is_permanent
from airflow_provider_vitess.utils.airflow_compat import AirflowFailException


class _Log(Protocol):
    def debug(self, event: Any, /, *args: Any, **kwargs: Any) -> Any: ...


def fail_permanently(message: str) -> AirflowFailException:
    return AirflowFailException(f"{message} (a permanent error: the task is not retried)")


@contextlib.contextmanager
def task_failures(log: _Log) -> Iterator[None]:
    """Wrap an operator's work: permanent product errors fail without retries, every product
    error without its library chain (kept in the DEBUG log)."""
    try:
        yield
    except VitessProviderError as exc:
        if exc.__cause__ is not None or exc.__context__ is not None:
            log.debug("%s was raised from:", type(exc).__name__, exc_info=exc)
        if is_permanent(exc):
            raise fail_permanently(f"{type(exc).__name__}: {exc}") from None
        raise exc from None
