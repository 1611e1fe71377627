"""What real slurmrestd releases serve and how each words its answers: the tables the fake slurmrestd plays.

:data:`SERVED` is the data parsers each release serves; :class:`Dialect` is where 24.11 and 26.05
answer the same request differently (each difference seen by the conformance test,
kit/tests/real_slurm/test_conformance.py); the functions build slurmrestd's shapes (a body with its
``meta``, an error, a number that may be unset or infinite).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# The data parsers each Slurm release serves (of those SliMe speaks, v0.0.42 and up; 24.11 also
# serves v0.0.40 and v0.0.41, 25.11 v0.0.41 to v0.0.44; 26.11 removes v0.0.42 and adds v0.0.46).
SERVED = {
    "24.11": ("v0.0.40", "v0.0.41", "v0.0.42"),
    "25.05": ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43"),
    "25.11": ("v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44"),
    "26.05": ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"),
    "26.11": ("v0.0.43", "v0.0.44", "v0.0.45", "v0.0.46"),
}
HEALTH_PATHS = ("/healthz", "/readyz", "/livez")


@dataclass(frozen=True)
class Dialect:
    """Where real slurmrestd 24.11 and 26.05 answer the same request differently (each seen by the conformance test)."""

    release: str  # meta.slurm.release
    error_status: int  # a node update or delete slurmctld refuses: 500 (24.11), 422 Unprocessable Content (26.05)
    delete_words: str  # how a refused DELETE's description begins
    refused_state: tuple[int, str]  # FUTURE of a busy node, or of one already FUTURE
    untyped_post: tuple[int, str]  # a POST without Content-Type: application/json
    not_found: str  # the text/plain 404 of an unserved version or path
    reason_outlives_drain: bool  # 24.11 keeps a reason after UNDRAIN/FUTURE until the node next runs a job
    registered_by: str  # reason_set_by_user of a node that just registered
    ping_word: bool  # 24.11's ping carries "pinged": "UP"/"DOWN"; 26.05's only "responding" and "status"
    health: bool = False  # slurmrestd serves /healthz, /readyz, /livez (26.05 only: 24.11 never, 26.11 no more)


DIALECTS = {
    "24.11": Dialect(
        release="24.11.5",
        error_status=500,
        delete_words="Failure to update node",
        refused_state=(2028, "Invalid node state specified"),
        untyped_post=(400, "Unable to parse query."),
        not_found="Unable find requested URL. Please view /openapi/v3 for API reference.",
        reason_outlives_drain=True,
        registered_by="root",
        ping_word=True,
    ),
    "26.05": Dialect(
        release="26.05.5",
        error_status=422,
        delete_words="Failure to delete node",
        refused_state=(2180, "Invalid node state transition"),
        untyped_post=(500, "Unspecified error"),
        not_found=(
            "Unable to find requested URL endpoint. Please query the '/openapi/v3' endpoint or visit"
            " 'https://slurm.schedmd.com/rest_api.html' for the OpenAPI specification which includes a list of"
            " all possible slurmrestd endpoints."
        ),
        reason_outlives_drain=False,
        registered_by="",
        ping_word=False,
        health=True,
    ),
}
# 26.11: 26.05's answers without the health paths (not run for real here: see the module's docstring).
DIALECTS["26.11"] = replace(DIALECTS["26.05"], release="26.11.0", health=False)
DEFAULT_RELEASE = "26.05"  # Slinky's default Slurm


def error_source(method: str) -> str:
    """The function slurmrestd names in a node error: ``_update_node`` for a POST, ``op_handler_node`` for a DELETE."""
    return "_update_node" if method == "POST" else "op_handler_node"


def no_val(number: int | None, infinite: bool = False) -> dict[str, Any]:
    """slurmrestd's shape of a number that may be unset or infinite (UINT32_NO_VAL, TIMESTAMP_NO_VAL)."""
    return {"set": number is not None and not infinite, "infinite": infinite, "number": number or 0}


def error(description: str, number: int, error: str, source: str) -> dict[str, Any]:
    return {"description": description, "error_number": number, "error": error, "source": source}


def slurm_body(release: str, errors: list[dict[str, Any]] | None = None, **payload: Any) -> dict[str, Any]:
    meta = {
        "plugin": {"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld"},
        "slurm": {"release": release, "cluster": "fake"},
    }
    return {**payload, "meta": meta, "errors": errors or [], "warnings": []}
