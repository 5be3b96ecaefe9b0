"""Whether the worker's ``spark-submit`` can start, checked before the merge task runs it.

PySpark's ``spark-submit`` is a shell script: it runs ``$SPARK_HOME/bin/spark-class``, and
when ``SPARK_HOME`` is unset, the pip-installed script first asks ``find_spark_home.py`` for it
through ``$PYSPARK_DRIVER_PYTHON`` (else ``$PYSPARK_PYTHON``, else ``python3``). Either one
missing on the worker makes the script exit with code 127 ("No such file or directory") before
any JVM starts, which the Spark provider reports as ``Cannot execute: spark-submit ... Error code
is: 127`` and Airflow retries to no avail. Two ways a worker gets there:

* ``SPARK_HOME`` in its environment names a Spark that is not (or no longer) there: an old
  installation, a removed virtual environment's PySpark;
* the driver's Python in the task's ``env_vars`` is a path that exists on the cluster's nodes,
  not on the worker (set for a cluster deploy mode).

No Airflow and no Spark import: plain file checks on the worker.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path


def pyspark_home() -> str | None:
    """The Spark inside the installed PySpark (its ``bin/spark-class``), if any: the
    ``SPARK_HOME`` its ``spark-submit`` finds when none is set."""
    from importlib.util import find_spec

    spec = find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).parent
    return str(home) if (home / "bin" / "spark-class").is_file() else None


def spark_submit_problem(binary: str, env: Mapping[str, str]) -> str | None:
    """Why ``binary`` (a ``spark-submit``, by path or as found on ``env``'s PATH) run with ``env``
    would exit 127 before Spark starts, with the remedy; None when it can start."""
    pyspark = pyspark_home()
    own = f" (this worker's PySpark has one: {pyspark})" if pyspark else ""
    home = env.get("SPARK_HOME")
    if home:
        if (Path(home) / "bin" / "spark-class").is_file():
            return None
        return (
            f"spark-submit cannot start: SPARK_HOME={home} in the merge task's environment has no "
            "bin/spark-class, and spark-submit runs $SPARK_HOME/bin/spark-class (it would exit with "
            f"code 127). Remedy: unset SPARK_HOME for the worker, or point it at a Spark installation{own}"
        )
    found = shutil.which(binary, path=env.get("PATH"))
    if found is None or not (Path(found).parent / "find_spark_home.py").is_file():
        return None  # not PySpark's script: a Spark distribution's finds its home by its own path
    name = "PYSPARK_DRIVER_PYTHON" if env.get("PYSPARK_DRIVER_PYTHON") else "PYSPARK_PYTHON"
    python = env.get(name) or "python3"
    if shutil.which(python, path=env.get("PATH")) is not None:
        return None
    given = f"{name}={python}" if env.get(name) else "python3 (no PYSPARK_DRIVER_PYTHON or PYSPARK_PYTHON)"
    return (
        f"spark-submit cannot start: {found} finds its Spark with the driver's Python, {given}, "
        "which is not on this worker (it would exit with code 127). Remedy: leave "
        "PYSPARK_DRIVER_PYTHON out of the merge's env_vars (the task's own Python is the default), "
        "and name a Python that exists on the cluster's nodes with the Spark setting "
        "spark.pyspark.driver.python (or spark.pyspark.python) instead"
    )
