"""Large metaData edits run in a worker thread, so they never hold up the admissions around them.

Editing metaData means a budgeted walk of its YAML events, a load, the merge and a second load to
check the result. For the few hundred bytes CAPM3 writes that takes microseconds, and it runs
inline. A larger value (over :data:`INLINE_METADATA_BYTES` of base64) is edited in a worker
thread: the parsers hold the interpreter for a few milliseconds at a time, so on the event loop
a burst of them would queue every admission behind it, while from a thread the loop keeps its
turn between them. (Reviews over 64 KiB are also taken one at a time by the transport,
:mod:`common.webhook`, so a flood of large bodies costs one edit's work at any moment.)
"""

from __future__ import annotations

import asyncio

from common.admission import AdmissionResponse
from injection_webhook.handler import JoinInfo, MetaDataSecret, Resolution, respond

INLINE_METADATA_BYTES = 4 * 1024


async def respond_off_loop(secret: MetaDataSecret, resolution: Resolution) -> AdmissionResponse:
    """The answer for a selected Secret: inline when nothing large is parsed, else in a worker thread."""
    if not isinstance(resolution, JoinInfo) or len(secret.encoded_metadata) <= INLINE_METADATA_BYTES:
        return respond(secret, resolution)
    return await asyncio.to_thread(respond, secret, resolution)
