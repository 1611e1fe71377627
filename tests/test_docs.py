"""The configuration page and the public names stay true to the code and the chart.

``docs/configuration.md`` lists every flag with its environment twin, and every chart value;
``common/names.py`` spells every public name, ``docs/interfaces.md`` documents them and the chart
spells none of its own. A setting, value or name added to one side only fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import names
from common.settings import ServiceSettings
from injection_webhook.settings import InjectionSettings
from scaling_webhook.settings import ScalingSettings

REPO = Path(__file__).resolve().parents[1]
CONFIGURATION = REPO / "docs" / "configuration.md"
SERVICES: dict[str, type[ServiceSettings]] = {
    "Both services": ServiceSettings,
    "`injection-webhook`": InjectionSettings,
    "`scaling-webhook`": ScalingSettings,
}


def section(text: str, heading: str) -> str:
    """The body of the markdown section whose heading line ends with ``heading``."""
    match = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    assert match, f"docs/configuration.md has no section {heading!r}"
    return match.group(1)


def first_cells(table: str) -> list[str]:
    """The first code span of each table row (the key the row documents)."""
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", table, re.M)]


def documented_flags(heading: str) -> dict[str, str]:
    """flag -> its env variable, as the section's table gives them."""
    rows = re.findall(r"^\| `(--[a-z-]+)` \| `([A-Z_]+)` \|", section(CONFIGURATION.read_text(), heading), re.M)
    return dict(rows)


def own_fields(settings: type[ServiceSettings]) -> dict[str, str]:
    """flag -> env of the fields a service adds to the shared ones."""
    shared = ServiceSettings.model_fields if settings is not ServiceSettings else {}
    return {
        "--" + name.replace("_", "-"): settings.env_name(name) for name in settings.model_fields if name not in shared
    }


@pytest.mark.parametrize("heading", SERVICES)
def test_every_flag_and_its_variable_is_documented_and_nothing_else(heading: str) -> None:
    assert documented_flags(heading) == own_fields(SERVICES[heading])


def value_paths(values: Any, prefix: str = "") -> set[str]:
    """Every key path of values.yaml, inner maps included."""
    paths = {prefix} if prefix else set()
    if isinstance(values, dict):
        for key, child in values.items():
            paths |= value_paths(child, f"{prefix}.{key}" if prefix else key)
    return paths


def leaf_paths(values: Any, prefix: str = "") -> set[str]:
    if isinstance(values, dict) and values:
        return set().union(*(leaf_paths(v, f"{prefix}.{k}" if prefix else k) for k, v in values.items()))
    return {prefix}


def test_every_chart_value_is_documented_and_every_documented_value_exists() -> None:
    values = yaml.safe_load((REPO / "charts" / "slime" / "values.yaml").read_text())
    documented = set(first_cells(section(CONFIGURATION.read_text(), "Chart values")))
    undocumented = sorted(
        leaf for leaf in leaf_paths(values) if not any(leaf == d or leaf.startswith(d + ".") for d in documented)
    )
    assert not undocumented, f"chart values missing from docs/configuration.md: {undocumented}"
    unknown = sorted(documented - value_paths(values))
    assert not unknown, f"docs/configuration.md documents chart values that do not exist: {unknown}"


def test_every_chart_value_a_flag_row_names_exists() -> None:
    values = value_paths(yaml.safe_load((REPO / "charts" / "slime" / "values.yaml").read_text()))
    text = CONFIGURATION.read_text()
    named = set()
    for heading in SERVICES:
        for row in re.findall(r"^\| `--.*$", section(text, heading), re.M):
            cells = [c.strip() for c in row.strip("|").split("|")]
            named |= set(re.findall(r"`([a-zA-Z][\w.]+)`", cells[3]))
    assert named and not sorted(named - values)


PUBLIC: dict[str, str] = {key: value for key, value in vars(names).items() if key.isupper() and isinstance(value, str)}


def test_docs_interfaces_names_every_public_name() -> None:
    interfaces = (REPO / "docs" / "interfaces.md").read_text()
    missing = sorted(f"{key} = {value}" for key, value in PUBLIC.items() if value not in interfaces)
    assert not missing, f"docs/interfaces.md does not mention: {missing}"


# SliMe's own spellings: a string of these shapes in the chart must be one of common/names.py.
OWN_NAME = re.compile(
    r"\b(slime/[a-z-]+|slurm-(?:controller-[a-z]+|conf-server|extra-join-data)|[a-z-]+\.hook\.machine\."
    r"cluster\.x-k8s\.io/[a-z-]+|slurm_[a-z0-9_]+)\b"
)


def test_the_chart_spells_only_public_names() -> None:
    found = set()
    for path in (REPO / "charts" / "slime").rglob("*"):
        if path.is_file():
            found |= set(OWN_NAME.findall(path.read_text()))
    unknown = sorted(n for n in found if n not in PUBLIC.values() and not n.startswith("slurm_partition_"))
    assert not unknown, f"the chart spells names common/names.py does not hold: {unknown}"


def test_the_name_check_catches_an_unknown_name() -> None:
    assert OWN_NAME.findall("annotations: {slime/made-up: x}") == ["slime/made-up"]
    assert "slime/made-up" not in PUBLIC.values()


def registered_metrics() -> set[str]:
    """The metric families both services register (their instruments, built as the services build them)."""
    from common.metrics import WebhookMetrics
    from injection_webhook.metrics import InjectionMetrics
    from scaling_webhook.demand_poller import DemandGauges
    from scaling_webhook.metrics import ScalingMetrics

    scaling = ScalingMetrics(WebhookMetrics())  # each service's registry holds the shared instruments too
    DemandGauges(scaling)
    injection = InjectionMetrics(WebhookMetrics())
    return {family.name for metrics in (scaling, injection) for family in metrics.webhook.registry.collect()}


def test_docs_operations_lists_every_metric() -> None:
    operations = (REPO / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(slime_[a-z_]+)` \|", operations, re.M))
    # prometheus_client names a counter's family without its _total suffix
    registered = {n if n in documented else n + "_total" for n in registered_metrics()}
    assert registered == documented


def _tested_versions() -> list[tuple[str, list[str], str]]:
    """docs/interfaces.md's "Tested upstream versions" rows: (upstream, versions, pinned-in file or "-")."""
    section = (REPO / "docs" / "interfaces.md").read_text().split("## Tested upstream versions", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("Upstream", "---"):
            rows.append((cells[0], re.findall(r"v?\d+\.\d+(?:\.\d+)?", cells[1].split("(")[0]), cells[3].strip("`")))
    return rows


def test_the_tested_versions_table_names_the_pinned_versions() -> None:
    rows = _tested_versions()
    assert len(rows) >= 9, rows
    for upstream, versions, pinned_in in rows:
        if pinned_in == "-":
            continue
        text = (REPO / pinned_in).read_text()
        missing = [v for v in versions if v not in text]
        assert versions and not missing, f"{upstream}: {missing or 'no version'} not in {pinned_in}"


def test_slime_check_flags_are_documented_and_nothing_else() -> None:
    from preflight.main import parser

    documented = re.findall(r"^\| `(--[a-z-]+)` \|", section(CONFIGURATION.read_text(), "`slime-check`"), re.M)
    flags = [o for action in parser()._actions for o in action.option_strings if o.startswith("--") and o != "--help"]
    assert sorted(documented) == sorted(flags)


DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
# A repository path in a code span: `tests/...`, `kit/...`, `docs/...`, `charts/...`, ... (globs and
# placeholders such as `<name>` are not paths).
REPO_PATH = re.compile(
    r"`((?:tests|kit|docs|charts|common|injection_webhook|scaling_webhook|certs|preflight|\.ci)/[\w./-]+)(?:::[^`]*)?`"
)


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = sorted(
        f"{doc.relative_to(REPO)}: {path}"
        for doc in DOCS
        for path in REPO_PATH.findall(doc.read_text())
        if not (REPO / path.rstrip("/.")).exists() and not (REPO / "kit" / path.rstrip("/.")).exists()
    )
    assert not missing, f"the docs name paths that do not exist: {missing}"


def test_the_docs_install_into_one_namespace() -> None:
    """install.md installs into slime-system; a command or example elsewhere in another namespace drifts."""
    wrong = re.compile(r"(?:-n|--namespace) slime(?![\w-])|(?<![\w/-])slime/mirror-|namespace: slime$", re.M)
    found = sorted(f"{doc.relative_to(REPO)}: {m.group(0)!r}" for doc in DOCS for m in wrong.finditer(doc.read_text()))
    assert not found, f"use the namespace slime-system: {found}"


def test_durations_the_docs_quote_for_a_chart_value_are_its_default() -> None:
    """`value` (N s) in any page is the value's default in values.yaml."""
    values = yaml.safe_load((REPO / "charts" / "slime" / "values.yaml").read_text())

    def default(path: str) -> Any:
        node: Any = values
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    wrong = []
    for doc in DOCS:
        for name, quoted in re.findall(r"`([a-zA-Z][\w.]+)` \((\d+) s\)", doc.read_text()):
            candidates = [default(p) for p in (name, f"injection.{name}", f"scaling.{name}")]
            known = [c for c in candidates if c is not None]
            if known and int(quoted) not in known:
                wrong.append(f"{doc.relative_to(REPO)}: `{name}` ({quoted} s), default {known[0]}")
    assert not wrong, wrong


NAMED_VERSION = re.compile(r"(?:localhost/slime|/hpc/slime|slime-)[:-]?(\d+\.\d+\.\d+)\b|--version (\d+\.\d+\.\d+)")


def test_the_version_is_the_same_everywhere_it_is_written() -> None:
    """docs/release.md, step 1: the product, the kit, the chart, the image tag the chart runs, the Dockerfile's
    VERSION build argument (its label), and every image tag and chart version the pages build or install."""
    import tomllib

    chart = yaml.safe_load((REPO / "charts" / "slime" / "Chart.yaml").read_text())
    versions = {
        "pyproject.toml": tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"],
        "kit/pyproject.toml": tomllib.loads((REPO / "kit" / "pyproject.toml").read_text())["project"]["version"],
        "Chart.yaml version": chart["version"],
        "Chart.yaml appVersion": str(chart["appVersion"]),
    }
    for i, found in enumerate(re.findall(r"^ARG VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)):
        versions[f"Dockerfile ARG VERSION ({i + 1})"] = found
    assert len(versions) == 6 and len(set(versions.values())) == 1, versions
    (version,) = set(versions.values())
    stale = sorted(
        f"{doc.relative_to(REPO)}: {m.group(0)}"
        for doc in [*DOCS, REPO / "Dockerfile"]
        for m in NAMED_VERSION.finditer(doc.read_text())
        if (m.group(1) or m.group(2)) != version and "CHANGELOG" not in doc.name
    )
    assert not stale, f"pages name another version than {version}: {stale}"


def test_every_page_gives_the_readmes_test_command_as_ci_runs_it() -> None:
    """The README's test command is what .ci/run runs; a page quoting another install line has drifted."""
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    command = re.sub(r"python3 -m pip install -q ", "python3 -m pip install ", ci)
    assert command in (REPO / "README.md").read_text()
    quoted = [
        f"{doc.relative_to(REPO)}: {line.strip()}"
        for doc in DOCS
        for line in doc.read_text().splitlines()
        if "pip install" in line and "pytest" in line and command not in line
    ]
    assert not quoted, f"pages quote a test command that is not the README's ({command}): {quoted}"


def table_rows(text: str) -> list[list[tuple[int, int]]]:
    """Each Markdown table of ``text``: its rows as (line number, cell count), outside code blocks.

    A cell boundary is a ``|`` that is not escaped (``\\|``) and not inside a code span."""
    tables: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        stripped = line.strip()
        if not fenced and stripped.startswith("|"):
            bare = re.sub(r"`[^`]*`", "", stripped.replace("\\|", ""))
            current.append((number, len(bare.strip("|").split("|"))))
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def test_every_table_row_has_the_headers_cells() -> None:
    """Review 2026-11-26, doc error 1: configuration.md's `--resync-seconds` row had one cell too many."""
    wrong = []
    for doc in DOCS:
        for rows in table_rows(doc.read_text()):
            (_, header), *rest = rows
            wrong += [
                f"{doc.relative_to(REPO)}:{n}: {cells} cells, header {header}" for n, cells in rest if cells != header
            ]
    assert not wrong, wrong


def test_the_table_check_catches_a_broken_row() -> None:
    broken = "| a | b |\n|---|---|\n| `x|y` | z \\| w |\n| 1 | 2 | 3 |\n"
    assert table_rows(broken) == [[(1, 2), (2, 2), (3, 2), (4, 3)]]
