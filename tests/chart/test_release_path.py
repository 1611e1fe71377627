"""The chart on an operator's path: the image it runs, a placeholder refused, the ``helm test`` hook, ``helm package``.

The default image is what the documented build makes (``localhost/slime:<appVersion>``); an image
value left at a placeholder from the docs fails the render with what to do. ``helm test`` runs
``slime-check`` from that image as a ServiceAccount that reads no Secret and may create nothing
but SubjectAccessReviews. ``helm package`` gives the archive ``helm push`` sends to an OCI
registry (no registry here: the push itself is shown in docs/release.md, not run).
"""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.framework.chart import NAMESPACE, RELEASE, HelmError
from testbed.framework.paths import CHART

Render = Callable[..., list[dict[str, Any]]]
CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())


def _hook(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "check"]


def test_the_default_image_is_what_the_documented_build_makes(render: Render) -> None:
    images = {
        c["image"]
        for o in render()
        if o["kind"] in ("Deployment", "Pod")
        for c in (o["spec"].get("template", {}).get("spec") or o["spec"])["containers"]
        if c["name"] != "mirror"
    }
    assert images == {f"localhost/slime:{CHART_YAML['appVersion']}"}


@pytest.mark.parametrize(
    "repository",
    ["registry.example.com/slime", "<your-registry>/slime", "$REGISTRY/slime", "registry.example.org:5000/hpc/slime"],
)
def test_an_image_left_at_a_placeholder_fails_with_what_to_do(render: Render, repository: str) -> None:
    with pytest.raises(HelmError) as failed:
        render({"image": {"repository": repository}})
    assert (
        f'image.repository="{repository}" with tag "{CHART_YAML["appVersion"]}" is a placeholder, '
        "not an image: build the "
        "image, push it to your registry and set image.repository (and image.tag) to where you pushed it "
        '(docs/install.md, "The image")'
    ) in failed.value.stderr


def test_a_real_registry_is_taken_as_it_is(render: Render) -> None:
    objs = render({"image": {"repository": "harbor.hpc.internal/slime/slime", "tag": "0.1.0-1"}})
    assert {
        c["image"] for o in objs if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]
    } >= {"harbor.hpc.internal/slime/slime:0.1.0-1"}


def test_the_test_hook_runs_slime_check_from_the_product_image(render: Render) -> None:
    hook = _hook(render())
    kinds = sorted(o["kind"] for o in hook)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Pod", "Role", "RoleBinding", "ServiceAccount"]
    (pod,) = [o for o in hook if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["namespace"] == NAMESPACE
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["slime-check"]
    assert container["args"] == ["--namespace", NAMESPACE, "--release", RELEASE]
    assert container["image"] == f"localhost/slime:{CHART_YAML['appVersion']}"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == f"{RELEASE}-check"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_test_hook_reads_no_secret_and_writes_nothing(render: Render) -> None:
    rules = [r for o in _hook(render()) if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]
    assert rules
    for rule in rules:
        assert "secrets" not in rule["resources"] and "*" not in rule["resources"] + rule["verbs"]
        if rule["resources"] == ["subjectaccessreviews"]:
            assert rule["verbs"] == ["create"]
        else:
            assert set(rule["verbs"]) <= {"get", "list"}, rule


def test_the_test_hook_can_be_left_out(render: Render) -> None:
    assert _hook(render({"test": {"enabled": False}})) == []


def test_helm_package_gives_the_archive_helm_push_sends(helm: Path, tmp_path: Path) -> None:
    subprocess.run([str(helm), "package", str(CHART), "-d", str(tmp_path)], check=True, capture_output=True, timeout=60)
    archive = tmp_path / f"slime-{CHART_YAML['version']}.tgz"
    assert archive.is_file()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "slime/Chart.yaml" in names and "slime/values.schema.json" in names
    assert "slime/templates/tests/slime-check.yaml" in names
    shown = subprocess.run(
        [str(helm), "show", "chart", str(archive)], check=True, capture_output=True, text=True, timeout=60
    )
    assert yaml.safe_load(shown.stdout)["version"] == CHART_YAML["version"]
    rendered = subprocess.run(
        [str(helm), "template", RELEASE, str(archive), "--namespace", NAMESPACE],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "kind: MutatingWebhookConfiguration" in rendered.stdout
