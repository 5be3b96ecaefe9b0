"""The merge's Spark-driver side: what runs where Spark's driver runs, never in Airflow itself.

That is spark-submit's driver (:mod:`.main`, the file ``VitessMergeOperator`` submits) or, over
Spark Connect, the task's process driving a remote server (:mod:`.connect`). :func:`.run.merge`
applies a :class:`~airflow_provider_vitess.merge.plan.MergePlan` and returns a
:class:`~airflow_provider_vitess.merge.report.MergeReport`: the parent package's contract,
which is all this package shares with the worker side (``merge/runner.py``), and which never
imports this package.
"""
