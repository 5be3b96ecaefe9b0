# Everything a newcomer needs runs from here; each target installs what it uses.
#   make demo   local Vitess + sample data + the example DAG through Airflow, Delta vs source printed
#   make test   lint + type-check + unit and integration tests against a real local Vitess
#   make vitess / make vitess-stop   start (idempotent) / stop the local Vitess cluster

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The Airflow release we test on (the provider supports 3.x).
AIRFLOW_VERSION ?= 3.3.2
STAMP := $(VENV)/.installed-$(AIRFLOW_VERSION)

.PHONY: demo test lint unit integration vitess vitess-stop protos clean

demo: $(STAMP) protos vitess
	$(BIN)/python dev/demo.py

test: lint vitess
	$(BIN)/pytest -q -p no:cacheprovider tests

$(STAMP): pyproject.toml setup.py $(wildcard protos/*.proto)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[spark,s3,test]" "apache-airflow==$(AIRFLOW_VERSION)"
	touch $@

protos: $(STAMP)
	$(BIN)/python setup.py -q build_protos

lint: $(STAMP) protos
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy airflow_provider_vitess spark_jobs tests dags_examples bench dev setup.py

unit: $(STAMP) protos
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

integration: $(STAMP) protos vitess
	$(BIN)/pytest -q -p no:cacheprovider tests/integration

vitess:
	dev/local_vitess.sh start

vitess-stop:
	dev/local_vitess.sh stop

clean: vitess-stop
	rm -rf $(VENV) build *.egg-info airflow_provider_vitess/_proto/*_pb2*
