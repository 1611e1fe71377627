"""Large metaData edits run in a worker thread, one at a time, so they never hold up the admissions around them.

Editing metaData means a budgeted walk of its YAML events, a load, the merge and a second load to
check the result. For the few hundred bytes CAPM3 writes that takes microseconds, and it runs
inline. A larger value (over :data:`INLINE_METADATA_BYTES` of base64) is edited in a worker
thread: the parsers hold the interpreter for a few milliseconds at a time, so on the event loop
a burst of them would queue every admission behind it, while from a thread the loop keeps its
turn between them. One large edit runs at a time; one that cannot start within
:data:`QUEUE_SECONDS` is refused (CAPM3 retries), so a flood of large hostile bodies costs at
most one edit's work at any moment and every answer stays prompt.
"""

from __future__ import annotations

import asyncio

from common.admission import AdmissionResponse, errored
from injection_webhook.handler import JoinInfo, MetaDataSecret, Resolution, respond

INLINE_METADATA_BYTES = 4 * 1024
QUEUE_SECONDS = 0.25


class LargeEdits:
    """Answers for selected Secrets: inline when small, in a worker thread (one at a time) when large."""

    def __init__(self) -> None:
        self._one_at_a_time = asyncio.Semaphore(1)

    async def respond(self, secret: MetaDataSecret, resolution: Resolution) -> AdmissionResponse:
        if not isinstance(resolution, JoinInfo) or len(secret.encoded_metadata) <= INLINE_METADATA_BYTES:
            return respond(secret, resolution)
        try:
            await asyncio.wait_for(self._one_at_a_time.acquire(), QUEUE_SECONDS)
        except TimeoutError:
            return errored(
                503,
                f"cannot edit Secret {secret.ref} now: another large metaData edit is in progress; retry",
            )
        try:
            return await asyncio.to_thread(respond, secret, resolution)
        finally:
            self._one_at_a_time.release()
