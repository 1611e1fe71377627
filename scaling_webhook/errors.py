"""Why a scale could not be done, and the HTTP status a denial passes on to the scaler.

Every module of the scaling wing that talks to the API server raises :class:`ScaleError`, so
the admission flow and the reconciler handle one exception type.
"""

from __future__ import annotations


class ScaleError(Exception):
    """A failed scale or read, with a cause fit for an admission message and an HTTP code."""

    def __init__(self, cause: str, code: int = 503) -> None:
        super().__init__(cause)
        self.cause = cause
        self.code = code


def denial_code(api_status: int) -> int:
    """The code of a denial caused by an API call that answered ``api_status``.

    A 4xx needs a person (not found, forbidden, invalid) and is passed on as it is; anything
    else (no answer, a timeout, a server error) may pass by itself, so it becomes 503 and the
    scaler retries.
    """
    return api_status if 400 <= api_status < 500 else 503
