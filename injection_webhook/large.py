"""Large metaData edits run in a helper process, so they never hold up the admissions around them.

Editing metaData means a YAML parse, the merge and a second parse to check the result. For the
few hundred bytes CAPM3 writes that takes microseconds; near the 1 MiB a Secret may hold it takes
most of a second of CPU, and in a thread it would still hold the GIL against the event loop for
stretches of tens of milliseconds. So values over :data:`OFFLOAD_METADATA_BYTES` are edited by
:func:`injection_webhook.handler.respond` in one helper process (started on first use with the
``spawn`` method, so it shares no threads or locks with this process). If the helper cannot be
started or dies, the edit runs in a worker thread instead and a warning says why: slower for
neighbours, never wrong.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from common.admission import AdmissionResponse
from injection_webhook.handler import MetaDataSecret, Resolution, respond

log = logging.getLogger("slime.injection.large")

OFFLOAD_METADATA_BYTES = 64 * 1024


class LargeEdits:
    """Answers for selected Secrets: inline when small, in the helper process when large."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._unavailable = ""
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None and not self._unavailable:
                try:
                    self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
                except (OSError, ImportError) as exc:  # e.g. no /dev/shm for the pool's semaphores
                    self._unavailable = f"{type(exc).__name__}: {exc}"
                    log.warning(
                        "no helper process for large metaData; editing in a thread", extra={"error": self._unavailable}
                    )
            return self._pool

    async def respond(self, secret: MetaDataSecret, resolution: Resolution) -> AdmissionResponse:
        if len(secret.encoded_metadata) <= OFFLOAD_METADATA_BYTES:
            return respond(secret, resolution)
        pool = self._executor()
        if pool is not None:
            try:
                return await asyncio.wrap_future(pool.submit(respond, secret, resolution))
            except BrokenProcessPool as exc:
                log.warning(
                    "the helper process for large metaData died; editing in a thread", extra={"error": str(exc)}
                )
                with self._lock:
                    if self._pool is pool:
                        self._pool = None  # a fresh one next time
                pool.shutdown(wait=False)
        return await asyncio.to_thread(respond, secret, resolution)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
