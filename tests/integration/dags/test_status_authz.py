"""The status page under per-DAG permissions: a real ``airflow api-server`` with the FAB auth
manager, two users each allowed to read one sync DAG, and an admin.

Each user sees only the syncs whose DAGs they may read: in the list and one by one (another's
sync is not found, its existence untold). A sync recorded before its DAG was (no ``dags`` in its
config) is shown only to users who may read every DAG. The syncs' DAGs are recorded by the real
snapshot operator (``airflow tasks test``) against the local vtgate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import AirflowEnv, make_airflow_env
from tests.support.airflow_services import AirflowServices, airflow_services
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
DAG_A, DAG_B, LEGACY = "authz_sync_a", "authz_sync_b", "authz_legacy"
TABLE = {DAG_A: "authz_a", DAG_B: "authz_b", LEGACY: "authz_legacy"}
PASSWORD = "reader-password-1"

DAG_FILE = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="commerce",
    tables=["{table}"],
    staging_location="{root}/staging",
    target_location="{root}/delta",
    schedule=None,
)
"""


# What ``airflow sync-perm --include-dags``, ``roles create``, ``roles add-perms`` and ``users
# create`` do, in one process: eight CLI calls were ~30 s of Airflow start-ups. argv: a JSON of
# {role: DAG it may read} and [(user, password, role)].
FAB_USERS = """
import json, sys
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

reads, people = json.loads(sys.argv[1]), json.loads(sys.argv[2])
with get_application_builder() as builder:
    sm = builder.sm
    builder.add_permissions(update_perms=True)
    sm.sync_roles()
    sm.create_dag_specific_permissions()
    for role, dag_id in reads.items():
        sm.add_permission_to_role(sm.add_role(role), sm.create_permission("can_read", "DAG:" + dag_id))
    for user, password, role in people:
        created = sm.add_user(
            username=user, first_name=user, last_name="test", email=user + "@example.com",
            role=sm.find_role(role), password=password,
        )
        assert created, "user not created: " + user
"""


def _users(airflow: AirflowEnv, admin: str, admin_password: str) -> None:
    """Every DAG in the database, its FAB permissions, and the users: the admin the services
    log in as, ``reader_a`` who may read DAG A only, ``reader_b`` who may read DAG B only."""
    airflow.airflow("dags", "reserialize")
    readers = {"reader_a": DAG_A, "reader_b": DAG_B}
    people = [(admin, admin_password, "Admin")]
    people += [(user, PASSWORD, f"role_{user}") for user in readers]
    reads = {f"role_{user}": dag_id for user, dag_id in readers.items()}
    airflow.python("-c", FAB_USERS, json.dumps(reads), json.dumps(people))


@pytest.fixture(scope="module")
def api(vitess: LocalVitess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServices]:
    root = tmp_path_factory.mktemp("authz")
    env = make_airflow_env(root, vitess)
    env.env["AIRFLOW__CORE__AUTH_MANAGER"] = FAB
    name, value = connection_uri_env("vitess_authz", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_authz")
        execute(
            hook,
            *[f"CREATE TABLE IF NOT EXISTS commerce.{t} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64))"
              for t in TABLE.values()],
            *[f"INSERT IGNORE INTO commerce.{t} (id, note) VALUES (1, 'secret key value of {t}')"
              for t in TABLE.values()],
        )  # fmt: skip
        for dag_id in (DAG_A, DAG_B):
            env.write_dag(dag_id, DAG_FILE.format(dag_id=dag_id, table=TABLE[dag_id], root=root / dag_id))
            # The real snapshot operator: it records its DAG in the sync's config.
            env.airflow("tasks", "test", dag_id, "snapshot", timeout=300)
        # A sync from before DAGs were recorded.
        store = CheckpointStore(f"sqlite:///{env.home / 'vitess_sync.db'}")
        spec = SyncSpec(LEGACY, "commerce", (TABLE[LEGACY],), str(root / "legacy"))
        CaptureRunner(hook, store, spec, holder="test-legacy").snapshot()
        store.close()
        hook.close()
    with airflow_services(env, services=(), prepare=_users) as running:
        yield running


def _login(api: AirflowServices, user: str) -> dict[str, str]:
    response = api.request("POST", "/auth/token", {"username": user, "password": PASSWORD}, auth=False)
    assert response.status_code in (200, 201), response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def _get(api: AirflowServices, path: str, headers: dict[str, str]) -> Any:
    return api.client.get(api.base_url + path, headers=headers)


def test_each_user_sees_only_the_syncs_of_the_dags_they_may_read(api: AirflowServices) -> None:
    for user, mine, other in (("reader_a", DAG_A, DAG_B), ("reader_b", DAG_B, DAG_A)):
        headers = _login(api, user)
        listed = _get(api, "/vitess/api/syncs", headers)
        assert listed.status_code == 200, listed.text
        assert [s["sync_id"] for s in listed.json()["syncs"]] == [mine], (user, listed.json())
        own = _get(api, f"/vitess/api/syncs/{mine}", headers)
        assert own.status_code == 200 and own.json()["tables"] == [TABLE[mine]], own.text
        for hidden in (other, LEGACY):
            refused = _get(api, f"/vitess/api/syncs/{hidden}", headers)
            # As for a sync that does not exist.
            assert (refused.status_code, refused.json()) == (
                404,
                {"detail": f"no sync {hidden!r} in the checkpoint stores default"},
            ), user
        # Airflow's own API agrees on what the user may read.
        dags = json.loads(_get(api, "/api/v2/dags", headers).text)["dags"]
        assert [d["dag_id"] for d in dags] == [mine]
    # The admin may read every DAG: every sync, the one without recorded DAGs too.
    admin = api.api("GET", "/vitess/api/syncs")
    assert {s["sync_id"]: s["dags"] for s in admin["syncs"]} == {DAG_A: [DAG_A], DAG_B: [DAG_B], LEGACY: []}
    for sync in (DAG_A, DAG_B, LEGACY):
        assert api.api("GET", f"/vitess/api/syncs/{sync}")["sync_id"] == sync
