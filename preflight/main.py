"""``slime-check``: run every check against the live cluster and print one line each.

Exit 0 when nothing failed (warnings and skips included), 1 when a check failed, 2 when the
command itself cannot run (a bad flag, an unusable kubeconfig), with one line saying why.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from common.kube import KubeConfigError, KubeError, local_client
from common.meta import is_dns1123_label
from common.version import version_line
from preflight.checks import Checks, Options
from preflight.install import find_installation
from preflight.report import exit_code, fail, summary

DEFAULT_NAMESPACE = "slime-system"  # docs/install.md installs SliMe there
DEFAULT_RELEASE = "slime"


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    command = _Parser(
        prog="slime-check",
        description="Check that an installed SliMe fits the cluster around it: one line per check, with the fix "
        "(docs/operations.md, 'Checking an install').",
    )
    command.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig to read the cluster with [env KUBECONFIG; default: in-cluster, else ~/.kube/config]",
    )
    command.add_argument(
        "--namespace",
        metavar="NAME",
        help=f"the release's namespace [env POD_NAMESPACE; default {DEFAULT_NAMESPACE}]",
    )
    command.add_argument(
        "--release", metavar="NAME", default=DEFAULT_RELEASE, help=f"the Helm release [default {DEFAULT_RELEASE}]"
    )
    command.add_argument(
        "--slurmrestd",
        metavar="URL=URL",
        action="append",
        default=[],
        help="reach a mapping's slurmrestd at another URL, e.g. through kubectl port-forward: "
        "http://slurm-restapi.slurm:6820=http://127.0.0.1:6820 (repeatable)",
    )
    command.add_argument(
        "--timeout", metavar="SECONDS", type=float, default=5.0, help="per TLS probe and slurmrestd call [default 5]"
    )
    command.add_argument(
        "--version", action="version", version=version_line("slime-check"), help="print the version and exit"
    )
    return command


def run(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    try:
        options = parser().parse_args(argv)
        namespace = options.namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
        if not is_dns1123_label(namespace):
            raise UsageError(f"--namespace: {namespace!r} is not a namespace name")
        remaps = {}
        for item in options.slurmrestd:
            origin, equals, target = item.partition("=")
            if not equals or not origin or not target:
                raise UsageError(f"--slurmrestd: {item!r} is not URL=URL")
            remaps[origin.rstrip("/")] = target.rstrip("/")
        kube = local_client(options.kubeconfig or os.environ.get("KUBECONFIG"), user_agent="slime-check")
    except (UsageError, KubeConfigError) as exc:
        print(f"slime-check: {exc}", file=sys.stderr)
        return 2
    findings = []
    try:
        try:
            install = find_installation(kube, namespace, options.release)
        except KubeError as exc:
            finding = fail(
                "release",
                f"cannot read the Deployments of namespace {namespace}: {exc}",
                "check the kubeconfig and that this identity may list Deployments there",
            )
            out(finding.line())
            out(summary([finding]))
            return 1
        checks = Checks(kube, install, Options(remaps, options.timeout))
        try:
            for finding in checks.run():
                findings.append(finding)
                out(finding.line())
        finally:
            checks.close()
    finally:
        kube.close()
    out(summary(findings))
    return exit_code(findings)


def main(argv: Sequence[str] | None = None) -> None:
    # The services' modules it uses log as the services do; the command's output is its lines.
    logging.getLogger().setLevel(logging.CRITICAL)
    sys.exit(run(argv, lambda line: print(line, flush=True)))


if __name__ == "__main__":
    main()
