"""The merge job's entry point in this repository: ``spark-submit spark_jobs/merge_cdc.py ...``.

The job itself ships inside the provider (:mod:`airflow_provider_vitess.merge.job`), so a
``pip install`` of the provider carries it and ``VitessMergeOperator`` submits that file; this
wrapper keeps the documented path working from a checkout. Arguments: see the job's docstring.
"""

from __future__ import annotations

import sys

from airflow_provider_vitess.merge.job import main, merge

__all__ = ["main", "merge"]

if __name__ == "__main__":
    sys.exit(main())
