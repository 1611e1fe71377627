"""slime-check's checks, in the order a new node needs their answers: the release, the APIs, the bindings
that let each template have join data, Slinky and the key, CAPM3's identity, the mappings, the webhooks as
the API server reaches them, slurmrestd.

Each yields :class:`~preflight.report.Finding` lines. They read the cluster with the identity
slime-check runs as; where that identity may not read something (the chart's ``helm test``
ServiceAccount reads no Secret), a check asks the API server whether the *webhook's*
ServiceAccount may (a SubjectAccessReview) and says what it could not see. Nothing prints a
key, a token or any Secret's value: a key is checked for presence, base64 and length only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from common.kube import KubeError
from preflight.apis import apis
from preflight.context import INSTALL, Context, Options, ref_of
from preflight.injection import capm3_identity, slinky
from preflight.install import forbidden
from preflight.report import Finding, fail, ok, skip, warn
from preflight.scaling import health, mappings, slurmrestd
from preflight.templates import bindings
from preflight.version import running
from preflight.webhooks import admissions, webhooks

__all__ = ["Checks", "Options"]


def release(ctx: Context) -> Iterator[Finding]:
    install = ctx.install
    if not install.components:
        yield fail(
            "release",
            f"no SliMe release {install.release} in namespace {install.namespace} (no Deployment labelled "
            f"app.kubernetes.io/instance={install.release}, app.kubernetes.io/component=injection-webhook "
            "or scaling-webhook)",
            f"install it ({INSTALL}), or name it: slime-check --namespace <namespace> --release <release>",
        )
        return
    for component in install.components:
        deployment = component.deployment
        what = f"{component.name}-webhook Deployment {ref_of(deployment)}"
        if component.problem:
            yield fail(
                "release",
                f"{what}: its pods would exit 2 at start: {component.problem}",
                "correct the value (docs/configuration.md) and helm upgrade",
            )
            continue
        image = component.container.get("image", "")
        wanted = int(deployment["spec"].get("replicas", 1))
        ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
        try:
            build, consistent = running(ctx.kube, component, ctx.options.timeout)
        except KubeError as exc:  # the pods could not be listed: say so, the rest of the line stands
            build, consistent = f"version not read: {exc.message or exc.reason}", True
        build = f"; {build}" if build else ""
        if ready < 1 <= wanted:
            yield warn(
                "release",
                f"{what} (image {image}): {ready}/{wanted} replicas ready{build}",
                f"kubectl -n {component.namespace} describe pods -l "
                f"app.kubernetes.io/component={component.name}-webhook; its log names the problem",
            )
        elif not consistent:
            yield warn(
                "release",
                f"{what} (image {image}): {ready}/{wanted} replicas ready{build}",
                f"a rollout in progress: kubectl -n {component.namespace} rollout status deployment/"
                f"{component.deployment_name}; if it stays, the image tag was rebuilt: pin image.digest",
            )
        else:
            yield ok("release", f"{what} (image {image}): {ready}/{wanted} replicas ready{build}")


STEPS: tuple[tuple[str, Callable[[Context], Iterator[Finding]]], ...] = (
    ("release", release),
    ("api", apis),
    ("bindings", bindings),
    ("slinky", slinky),
    ("capm3", capm3_identity),
    ("mapping", mappings),
    ("webhook", webhooks),
    ("admission", admissions),
    ("slurmrestd", slurmrestd),
    ("health", health),
)


class Checks(Context):
    def run(self) -> Iterator[Finding]:
        """Every check, each guarded: an API error ends that check with a line, never the run."""
        for check, step in STEPS:
            try:
                yield from step(self)
            except KubeError as exc:
                if forbidden(exc):
                    yield skip(check, f"this identity may not read what the check needs: {exc.message}")
                else:
                    yield fail(check, f"the API server answered {exc}", "see the message; run again when it answers")
