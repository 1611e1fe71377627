"""The teardown runs against the safe scale-in suite's pool: kubemu, the fake slurmrestd and the CAPI stand-in."""

from tests.scaling_webhook.conftest import jwt_key, slurm
from tests.scaling_webhook.safe_scale_in.conftest import env

__all__ = ["env", "jwt_key", "slurm"]
