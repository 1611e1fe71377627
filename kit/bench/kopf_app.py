"""The Python peer: kopf's admission server with a trivial validating handler.

Run by the bench as ``python -m bench.kopf_app`` with ``BENCH_PORT``, ``BENCH_CERT``,
``BENCH_KEY`` and ``KUBECONFIG`` (the emulator) in the environment. ``kopf.run`` (not the ``kopf``
CLI) keeps the standard-library event loop, as our services use, and leaves logging unconfigured
(warnings only), so kopf is not slowed down by per-request log lines. The handler is served at
``POST /trivial``.
"""

import os

import kopf


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: object) -> None:
    settings.admission.server = kopf.WebhookServer(
        addr="127.0.0.1",
        port=int(os.environ["BENCH_PORT"]),
        certfile=os.environ["BENCH_CERT"],
        pkeyfile=os.environ["BENCH_KEY"],
    )
    settings.admission.managed = None  # no webhook configuration objects: the bench calls it directly
    settings.posting.enabled = False


@kopf.on.validate("secrets", id="trivial")
def trivial(**_: object) -> None:
    """Allow everything: the cheapest handler kopf can serve."""


if __name__ == "__main__":
    kopf.run(standalone=True, clusterwide=True)
