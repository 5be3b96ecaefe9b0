"""The merge job's entry point in this repository: ``spark-submit spark_jobs/merge_cdc.py ...``.

The job itself ships inside the provider (:mod:`airflow_provider_vitess.merge.job.main`, the
file ``VitessMergeOperator`` submits), so a ``pip install`` of the provider carries it; this
wrapper keeps the older path working from a checkout. Arguments: see the job's docstring.
"""

from __future__ import annotations

import sys

from airflow_provider_vitess.merge.job.main import main
from airflow_provider_vitess.merge.job.run import merge

__all__ = ["main", "merge"]

if __name__ == "__main__":
    sys.exit(main())
