"""The Slurm metrics stand-in (kit/testbed/components/slurm_metrics.py) reads slurmrestd with the newest data parser it
serves: against the fake playing 24.11 (v0.0.42 only) and 26.11 (v0.0.42 removed), over HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

from testbed.components.fake_slurmrestd import PARTITION, FakeSlurmrestd
from testbed.components.slurm_metrics import PATH, SlurmMetrics
from testbed.framework.world import make_jwt_key


@pytest.mark.parametrize(("release", "version"), [("24.11", "v0.0.42"), ("26.05", "v0.0.45"), ("26.11", "v0.0.46")])
def test_the_stand_in_reads_the_newest_data_parser_served(release: str, version: str) -> None:
    key = make_jwt_key()
    fake = FakeSlurmrestd(key, release=release)
    metrics = SlurmMetrics(fake.url, key)
    try:
        fake.add_node("n1", "10.0.0.1")
        fake.start_job("n1", time.time() + 600)
        fake.submit(2)
        metrics.start()
        answer = httpx.get(f"http://{metrics.address}{PATH}", timeout=10)
        assert answer.status_code == 200, (answer.text, metrics.errors)
        lines = answer.text.splitlines()
        assert f'slurm_partition_jobs_pending{{partition="{PARTITION}"}} 1' in lines
        assert f'slurm_partition_jobs_running{{partition="{PARTITION}"}} 1' in lines
        assert metrics.api_version == version
        assert {path.split("?")[0] for _, path in fake.calls if "/ping" not in path} == {
            f"/slurm/{version}/jobs/",
            f"/slurm/{version}/partitions/",
        }
    finally:
        metrics.stop()
        fake.stop()
