"""Apache Airflow provider for change data capture out of Vitess into lakehouse tables."""

from __future__ import annotations

__version__ = "0.1.0"
