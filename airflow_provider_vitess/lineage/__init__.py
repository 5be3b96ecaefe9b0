"""What a sync tells the rest of a data platform: Assets for its Delta tables (events that
schedule downstream DAGs) and OpenLineage datasets for its source and target tables.

The modules here build names, URIs and event payloads from plain values (the merge report, the
staged manifest, the connection's vtgate address); the operators hand them to Airflow. The
OpenLineage provider is optional: only :mod:`.openlineage` imports it, and only when called.
"""
