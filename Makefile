# Everything a newcomer needs runs from here; each target installs what it uses.
#   make demo   local Vitess + sample data + the example DAG through Airflow, Delta vs source printed
#   make test   lint + type-check + every tier below (tests/README.md) against a real local Vitess
#   make unit / make job / make integration   one tier: pure logic (seconds); the merge job on
#               local Spark from synthetic windows (a minute); the real cluster, Airflow, Spark, Delta
#   make vitess / make vitess-stop   start (idempotent) / stop the local Vitess cluster
#   make fleet / make fleet-stop     an Airflow fleet (CeleryExecutor, two workers, S3, PostgreSQL)
#   make test-fleet  the fleet tests (tests/fleet/; not part of `make test`)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The releases `make test` runs on: the newest of airflow_provider_vitess/versions.py (which
# `make test-compat` runs all of; tests/unit/floor/test_versions.py keeps the two equal).
AIRFLOW_VERSION ?= 3.3.2
PYSPARK_VERSION ?= 4.2.0
DELTA_VERSION ?= 4.4.0
STAMP := $(VENV)/.installed-$(AIRFLOW_VERSION)-$(PYSPARK_VERSION)-$(DELTA_VERSION)
# Spark 4.1 beside the venv's 4.2: Apache Iceberg publishes no runtime for Spark 4.2, so the
# Iceberg tests' merges run Spark 4.1's spark-submit (tests/support/iceberg_spark.py). Only its
# PySpark, in a directory of its own (kept, reused); the venv's Python runs its driver.
ICEBERG_PYSPARK ?= 4.1.3
ICEBERG_SPARK ?= $(HOME)/.cache/airflow-provider-vitess/spark-$(ICEBERG_PYSPARK)
ICEBERG_STAMP := $(ICEBERG_SPARK)/.installed

.PHONY: demo test lint unit job integration soak soak-matrix soak-reshard-model vitess vitess-stop protos clean bench-peers test-compat \
	fleet fleet-stop test-fleet iceberg-spark

demo: $(STAMP) protos vitess
	$(BIN)/python dev/demo.py

# Two workers: most of the suite waits on servers, so the second core would idle. Modules that
# share tables of the cluster run in one worker (tests/conftest.py, SHARED_TABLES).
# Then the table-format contract's Iceberg cases, on Spark 4.1's PySpark (in-process Spark: the
# venv's 4.2 has no Iceberg runtime; the Delta cases ran above).
TEST_WORKERS ?= 2
test: lint vitess $(ICEBERG_STAMP)
	VITESS_ICEBERG_SPARK="$(ICEBERG_SPARK)" $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope \
		--no-loadscope-reorder --durations=25 --ignore=tests/fleet tests
	PYTHONPATH="$(ICEBERG_SPARK)" $(BIN)/pytest -q -p no:cacheprovider tests/job/test_table_formats.py -k iceberg

iceberg-spark: $(ICEBERG_STAMP)

$(ICEBERG_STAMP): | $(STAMP)
	rm -rf "$(ICEBERG_SPARK)"
	$(BIN)/pip install -q --no-deps --target "$(ICEBERG_SPARK)" "pyspark==$(ICEBERG_PYSPARK)"
	touch $@

# dev/constraints.txt: the AWS client releases that agree (pip alone backtracks past its limit).
$(STAMP): pyproject.toml setup.py dev/constraints.txt $(wildcard protos/*.proto)
	@echo "[setup] installing the Python packages into $(VENV) (cold: minutes; pip's cache: less)"
	@began=$$(date +%s) \
		&& { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); } \
		&& $(BIN)/pip install -q --upgrade pip \
		&& $(BIN)/pip install -q -c dev/constraints.txt -e ".[spark,s3,test]" "apache-airflow==$(AIRFLOW_VERSION)" \
			"pyspark[connect]==$(PYSPARK_VERSION)" "delta-spark==$(DELTA_VERSION)" \
		&& echo "[setup] installed the Python packages in $$(( $$(date +%s) - began )) s"
	touch $@

# The editable install leaves an *.egg-info in the checkout. Any process with the checkout on
# sys.path (tests, `python -m`, PYTHONPATH) then sees the provider twice, with its airflow.plugins
# entry point twice, and Airflow 3.3's plugin loader stops at a repeated plugin name: every
# plugin after it (OpenLineage's listener among them) is dropped. The installed metadata is in
# the venv; the copy in the checkout is only a by-product.
protos: $(STAMP)
	$(BIN)/python setup.py -q build_protos
	rm -rf airflow_provider_vitess.egg-info

lint: $(STAMP) protos
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy airflow_provider_vitess spark_jobs tests dags_examples bench dev setup.py

unit: $(STAMP) protos
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

# The merge job's rows and order on local Spark from synthetic staged windows: no Vitess, no Airflow.
job: $(STAMP) protos
	$(BIN)/pytest -q -p no:cacheprovider tests/job

integration: $(STAMP) protos vitess
	$(BIN)/pytest -q -p no:cacheprovider tests/integration

# Not part of `test`: an Airflow 3 deployment with the CeleryExecutor and two Celery workers that
# share no directory, staging and Delta on S3, the checkpoint store on PostgreSQL, merges on Spark
# Connect (dev/fleet.sh; docs/deployment.md). `make fleet` starts it for a person to look at (the
# UI's address and password file are printed; `make fleet-stop` stops it); `make test-fleet` runs
# tests/fleet/ on it, starting and stopping it unless it already runs.
fleet: $(STAMP) protos vitess
	dev/fleet.sh start

fleet-stop:
	dev/fleet.sh stop

test-fleet: $(STAMP) protos vitess
	$(BIN)/pytest -q -p no:cacheprovider --durations=10 tests/fleet

# Not part of `test`: our snapshot and catch-up window next to Debezium's Vitess connector
# (builds bench/peers with Maven; see bench/README.md). E.g. BENCH_PEERS_ARGS="--repeat 1".
BENCH_PEERS_ARGS ?=
bench-peers: $(STAMP) protos vitess
	$(BIN)/python bench/bench_peers.py $(BENCH_PEERS_ARGS)

# The seeded kill soak in full mode (every phase faulted, the 100k-row transaction in every seed);
# `make test` runs its five small seeds. Prints the tally at the end; SOAK_LOG=file keeps each seed's.
SEEDS ?= 50
soak: $(STAMP) protos vitess
	SOAK_FULL=1 SOAK_SEEDS=$(SEEDS) $(BIN)/pytest -q -p no:cacheprovider -m soak tests/integration/operations/test_soak.py

# The matrix soak (bench/README.md): per seed a drawn configuration (target modes, shard groups,
# column choice, max_events, sensor) and script (moves, same-second deletes, key changes, long
# transactions, ADD COLUMN, a re-snapshot) through the DAG factory, each mode's oracle after every
# run; `make test` runs its fixed seed. A line per seed and the tally at the end; MATRIX_FIRST=n
# starts at seed n, MATRIX_LOG=file keeps each seed's result.
soak-matrix: $(STAMP) protos vitess
	MATRIX_FULL=1 MATRIX_SEEDS=$(SEEDS) $(BIN)/pytest -q -p no:cacheprovider -m soak tests/integration/operations/test_matrix_soak.py

# The job tier's reshard model (tests/support/reshard_model.py) on more seeds than `make test`'s
# one: per seed 40 scenarios of keys moved, deleted and re-inserted across a reshard's switch and
# window stops, `history` and the mirror merged window by window against the source. No Vitess.
# E.g. SEEDS=200; RESHARD_MODEL_FIRST=n starts at seed n.
soak-reshard-model: $(STAMP) protos
	RESHARD_MODEL_SEEDS=$(SEEDS) $(BIN)/pytest -q -p no:cacheprovider -m soak tests/job/test_reshard_property.py

# Not part of `test`: every Airflow minor and every Spark/Delta pair of
# airflow_provider_vitess/versions.py, each from the repo's wheel in a venv of its own (kept in
# COMPAT_DIR, reused by later runs): unit tests, a DAG-factory sync, the merge tests. Prints the
# matrix. E.g. COMPAT_ARGS="--only airflow" or "--only spark-3.5".
COMPAT_DIR ?= $(HOME)/.cache/airflow-provider-vitess/compat
COMPAT_ARGS ?=
test-compat: vitess
	$(PYTHON) dev/test_compat.py --cache-dir "$(COMPAT_DIR)" $(COMPAT_ARGS)

vitess:
	dev/local_vitess.sh start

vitess-stop:
	dev/local_vitess.sh stop

clean: vitess-stop
	rm -rf $(VENV) build *.egg-info airflow_provider_vitess/_proto/*_pb2*
