"""answer(): the same answer as respond(), in a worker thread only for large metaData with join data."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from injection_webhook.admission import INLINE_METADATA_BYTES, answer
from injection_webhook.decision import JoinInfo, MetaDataSecret, NotOptedIn, Resolution, Unresolved, respond
from testbed.framework.objects import b64, decoded_metadata

JOIN = JoinInfo(
    host="192.0.2.10", port=6817, key_base64=b64(b"k" * 64), source="Controller slurm/slurm in cluster local"
)


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor (what ``asyncio.to_thread`` runs on), counting the work handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def answered(secret: MetaDataSecret, resolution: Resolution) -> tuple[Any, int]:
    """answer()'s answer, and how many jobs it handed to a worker thread."""
    executor = CountingExecutor()

    async def run() -> Any:
        asyncio.get_running_loop().set_default_executor(executor)
        return await answer(secret, resolution)

    try:
        return asyncio.run(run()), executor.submitted
    finally:
        executor.shutdown()


def secret_with(size: int) -> MetaDataSecret:
    """A metaData Secret whose base64 value is at least ``size`` bytes."""
    content = {"local-hostname": "m3m-0", "providerid": "metal3/bmh-0/m3m-0", "padding": "x" * (size * 3 // 4)}
    return MetaDataSecret("metal3", "m3m-0-metadata", "workers-template-0", b64(yaml.safe_dump(content)), "uid")


def test_small_metadata_is_edited_inline() -> None:
    secret = secret_with(100)
    assert len(secret.encoded_metadata) <= INLINE_METADATA_BYTES
    response, threads = answered(secret, JOIN)
    assert threads == 0
    assert response == respond(secret, JOIN)


def test_large_metadata_is_edited_in_a_worker_thread_with_the_same_answer() -> None:
    secret = secret_with(INLINE_METADATA_BYTES * 4)
    assert len(secret.encoded_metadata) > INLINE_METADATA_BYTES
    response, threads = answered(secret, JOIN)
    assert threads == 1
    assert response == respond(secret, JOIN)
    assert response.allowed and response.patch is not None
    merged = decoded_metadata(response.patch[0]["value"])
    assert merged["padding"] == "x" * (INLINE_METADATA_BYTES * 3)  # the operator's content survives the merge


@pytest.mark.parametrize("resolution", [NotOptedIn(), Unresolved("no slurmctld pod")])
def test_large_metadata_without_join_data_is_answered_inline(resolution: Resolution) -> None:
    secret = secret_with(INLINE_METADATA_BYTES * 4)
    response, threads = answered(secret, resolution)
    assert threads == 0
    assert response == respond(secret, resolution)
