"""A killed capture task (``on_kill``) cancels its open stream and releases the sync's lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.exceptions import VStreamError
from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator


class _Call:
    """Stands for the open gRPC call: records the cancel the kill must send."""

    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


@pytest.mark.parametrize("operator", [VitessSnapshotOperator, VitessCatchUpOperator])
def test_on_kill_cancels_the_stream_and_releases_the_lock(
    operator: type[VitessSnapshotOperator], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    task = operator(
        task_id="capture", sync_id="s1", keyspace="ks", tables="t", staging_location=str(tmp_path / "stage")
    )
    runner = task._runner({})
    call = _Call()
    monkeypatch.setattr(runner.hook, "open_vstream_raw", lambda request, timeout=None: call)
    other = CheckpointStore(f"sqlite:///{tmp_path / 'vitess_sync.db'}")
    with runner._locked():
        assert runner._open(object()) is call
        holder = other.lock_holder("s1")
        assert holder is not None and holder.holder == runner.holder
        task.on_kill()
        assert call.cancelled == 1
        assert other.lock_holder("s1") is None  # a rerun need not wait for the lock to go stale
        with pytest.raises(VStreamError, match="cancelled"):
            runner._open(object())  # a read that would reconnect stops instead
    other.close()
