"""The merge: staged windows into Delta tables, each window once.

Two sides. The Airflow worker's (this package's modules): :mod:`.runner` drives the window
state machine under the sync's lock and builds the :mod:`.plan`; :mod:`.report` is what comes
back; :mod:`.spark_conf` and :mod:`.jar_cache` set up the Spark that runs it. The Spark
driver's (:mod:`.job`): the merge itself, on spark-submit's driver or over Spark Connect. The
worker side never imports the driver side; the driver side reads only the plan, report and
Spark settings from here.
"""
