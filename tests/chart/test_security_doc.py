"""docs/security.md's `kubectl auth can-i` checks answer, against the rendered chart, as their comments say.

The page lists the checks an operator runs on an install with the default values; each line's
comment is its expected answer. Each line is evaluated here with the same RBAC model the RBAC
audit uses, over ``helm template`` with the default values, so the page cannot drift from the chart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from testbed.framework.chart import NAMESPACE, RELEASE
from testbed.framework.paths import REPO_ROOT
from testbed.framework.rbac import ApiRequest, rbac_allows

SERVICE_ACCOUNTS = {"$INJ": f"{RELEASE}-injection-webhook", "$SCL": f"{RELEASE}-scaling-webhook"}
# The API groups kubectl's discovery finds for the short resource names the page uses.
GROUPS = {"secrets": "", "metal3datas": "infrastructure.cluster.x-k8s.io"}
CHECK = re.compile(
    r"^kubectl auth can-i (?P<verb>\S+) (?P<resource>\S+) (?:-A|-n (?P<namespace>\S+)) "
    r"--as=system:serviceaccount:\$NS:(?P<account>\$\w+)\s+# (?P<answer>yes|no)$",
    re.M,
)


def checks() -> list[re.Match[str]]:
    page = (REPO_ROOT / "docs" / "security.md").read_text()
    section = page[page.index("**Least privilege (control 9).**") :]
    return list(CHECK.finditer(section))


def test_the_page_lists_checks_for_both_services() -> None:
    found = checks()
    assert len(found) >= 8 and {m["account"] for m in found} == set(SERVICE_ACCOUNTS)


@pytest.mark.parametrize("check", checks(), ids=lambda m: m.group(0).split("   #")[0].removeprefix("kubectl auth "))
def test_each_check_answers_as_the_page_says(render: Callable[..., list[dict[str, Any]]], check: re.Match[str]) -> None:
    resource, _, name = check["resource"].partition("/")
    plural, _, group = resource.partition(".")
    request = ApiRequest(check["verb"], group or GROUPS[plural], plural, namespace=check["namespace"] or "", name=name)
    allowed = rbac_allows(render(None), SERVICE_ACCOUNTS[check["account"]], NAMESPACE, request)
    assert allowed == (check["answer"] == "yes"), f"{check.group(0)}: the rendered chart answers {allowed}"
