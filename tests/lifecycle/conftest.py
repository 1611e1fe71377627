"""The teardown runs against the safe scale-in suite's pool: kubemu, the fake slurmrestd and the CAPI stand-in."""

from tests.scaling_webhook.conftest import env, jwt_key, slurm

__all__ = ["env", "jwt_key", "slurm"]
