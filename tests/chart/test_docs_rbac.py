"""What the docs say each service may do is what the chart grants.

docs/interfaces.md, "What the chart grants (RBAC)", is the table: the chart is rendered with its
defaults (the rows marked ``always``) and with every opt-in (all rows), and each ServiceAccount's
rules (through its Role/ClusterRole bindings) must be exactly the table's rows, verb for verb.
Then every verb list the other pages give for a resource (install.md, configuration.md,
scaling.md, interfaces.md, values.yaml: "`machinedeployments` get/list/watch", "list/watch of
`metal3datas`", "Machines list/watch/patch") must be the verbs of a row of that resource, or of
all one service's rows of it: the kind of drift operator review 2026-11-26 found (doc error 7).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from testbed.framework.chart import TWO_MAPPINGS

REPO = Path(__file__).resolve().parents[2]
INTERFACES = REPO / "docs" / "interfaces.md"
ACCOUNTS = {
    "injection": "slime-injection-webhook",
    "scaling": "slime-scaling-webhook",
    "certgen (hook)": "slime-certgen",
}
Grant = tuple[str, str, str, str]  # (service, group, resource, verb)


def table() -> list[dict[str, Any]]:
    section = INTERFACES.read_text().split("\n## What the chart grants (RBAC)\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] in ("service", "---"):
            continue
        service, group, resource, verbs, _, when = cells
        rows.append(
            {
                "service": service,
                "group": "" if group == "core" else group.strip("`"),
                "resource": resource.strip("`"),
                "verbs": set(re.findall(r"`(\w+)`", verbs)),
                "always": when == "always",
            }
        )
    assert len(rows) >= 20, rows
    return rows


def grants(rows: list[dict[str, Any]]) -> set[Grant]:
    return {(r["service"], r["group"], r["resource"], v) for r in rows for v in r["verbs"]}


def rendered_grants(objects: list[dict[str, Any]]) -> set[Grant]:
    """(service, group, resource, verb) of every rule bound to each service's ServiceAccount."""
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}
    out: set[Grant] = set()
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        for service, account in ACCOUNTS.items():
            if not any(s.get("kind") == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
                continue
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
            role = roles[(ref["kind"], namespace, ref["name"])]
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out |= {(service, group, resource, verb) for verb in rule["verbs"]}
    return out


DEFAULTS: dict[str, Any] = {**TWO_MAPPINGS, "certManager": {"enabled": False}}
OPT_INS: dict[str, Any] = {
    "certManager": {"enabled": False},
    "admissionAuth": {"enabled": True},
    "scaling": {
        **TWO_MAPPINGS["scaling"],
        "safeScaleIn": {"enabled": True, "jwtSecrets": [{"name": "slurm-auth-jwths256", "namespace": "slurm"}]},
        "capacityAware": {"enabled": True},
        "slurmHealth": {"enabled": True, "jwtSecrets": [{"name": "slurm-auth-jwths256", "namespace": "slurm"}]},
    },
}


def test_the_table_is_what_the_chart_grants_by_default(render: Any) -> None:
    rows = table()
    always = [r for r in rows if r["always"] or r["service"] == "certgen (hook)"]
    assert rendered_grants(render(DEFAULTS)) == grants(always)


def test_the_table_is_what_the_chart_grants_with_every_opt_in(render: Any) -> None:
    assert rendered_grants(render(OPT_INS)) == grants(table())


def test_the_comparison_would_see_a_missing_verb(render: Any) -> None:
    rows = table()
    for row in rows:
        if row["resource"] == "clusters":
            row["verbs"] = {"list"}
    assert rendered_grants(render(OPT_INS)) != grants(rows)


VERB = r"`?(?:get|list|watch|patch|create|update|delete)`?"
VERBS = rf"{VERB}(?:/{VERB})*"
WORDS = {
    "Machines": "machines",
    "BareMetalHosts": "baremetalhosts",
    "Metal3MachineTemplates": "metal3machinetemplates",
    "MachineDeployments": "machinedeployments",
    "Clusters": "clusters",
    "Leases": "leases",
    "Secrets": "secrets",
    "Events": "events",
    "ConfigMaps": "configmaps",
}
PLAIN = (
    "machinedeployments/scale",
    "machinedeployments",
    "deployments",
    "machines",
    "secrets",
    "configmaps",
    "leases",
    "events",
    "clusters",
    "pods",
    "services",
    "statefulsets",
    "controllers",
    "baremetalhosts",
    "metal3machinetemplates",
    "metal3datas",
    "metal3datatemplates",
)
MENTIONS = [
    # `machinedeployments` get/list/watch ; `machinedeployments/scale` patch
    re.compile(rf"`(?P<res>[a-z][a-z0-9./-]*)`\s+(?P<verbs>{VERBS})\b"),
    # list/watch of `metal3datas` ; get/update of `leases`
    re.compile(rf"\b(?P<verbs>{VERB}(?:/{VERB})+)\s+(?:of\s+)?(?:the\s+)?`(?P<res>[a-z][a-z0-9./-]*)`"),
    # Machines list/watch/patch
    re.compile(rf"\b(?P<word>{'|'.join(WORDS)})\s+(?P<verbs>{VERBS})\b"),
    # list/patch Machines
    re.compile(rf"\b(?P<verbs>{VERB}(?:/{VERB})+)\s+(?:of\s+)?(?:the\s+)?(?P<word>{'|'.join(WORDS)})\b"),
    # patch machinedeployments/scale and get machinedeployments (values.yaml's comments)
    re.compile(rf"(?<!kubectl )\b(?P<verbs>{VERBS})\s+(?:of\s+)?(?:the\s+)?(?P<res>{'|'.join(PLAIN)})\b(?!/)"),
]
PAGES = [REPO / "docs" / p for p in ("install.md", "configuration.md", "scaling.md", "interfaces.md")] + [
    REPO / "charts" / "slime" / "values.yaml"
]


def mentions(text: str) -> list[tuple[str, set[str], str]]:
    found = []
    for pattern in MENTIONS:
        for m in pattern.finditer(text):
            groups = m.groupdict()
            resource = groups.get("res") or WORDS[groups["word"]]
            resource = resource.rsplit(".", 1)[0] if "/" not in resource and resource.count(".") else resource
            found.append((resource, set(m.group("verbs").replace("`", "").split("/")), m.group(0)))
    return found


def allowed_sets(rows: list[dict[str, Any]], resource: str) -> list[set[str]]:
    matching = [r for r in rows if r["resource"] == resource]
    sets = [r["verbs"] for r in matching]
    for service in {r["service"] for r in matching}:
        sets.append(set().union(*(r["verbs"] for r in matching if r["service"] == service)))
    return sets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_verb_list_a_page_gives_is_the_charts(page: Path) -> None:
    rows = table()
    known = {r["resource"] for r in rows}
    wrong = []
    for resource, verbs, text in mentions(page.read_text()):
        if resource in known and verbs not in allowed_sets(rows, resource):
            wrong.append(f"{text!r}: the chart grants {[sorted(s) for s in allowed_sets(rows, resource)]}")
    assert not wrong, f"{page.relative_to(REPO)}: {wrong}"


def test_the_scan_finds_the_drift_the_review_found() -> None:
    """Doc error 7's sentences, as they were: each is caught."""
    rows = table()
    for sentence in (
        "`deployments` get restricted to the mirrors",
        "`machinedeployments` get and",
        "RBAC for Slurm-aware scale-in (Machines list/patch)",
        "patch machinedeployments/scale and get machinedeployments, both restricted",
    ):
        found = mentions(sentence)
        assert found and any(verbs not in allowed_sets(rows, res) for res, verbs, _ in found), sentence
