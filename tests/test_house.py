"""House rules, checked on every run: ruff (lint + import order), mypy (strict), and the layering of imports.

The layering is the one docs/architecture.md describes, held the way import-linter contracts hold
kopf's layers (an AST scan of every module; no new dependency):

- **the product and the kit apart**: the product (``common/``, both services, ``preflight/``) imports
  no kit package, and its ``pyproject.toml`` names none; nothing imports ``tests``;
- **the product's packages**: ``common/`` imports no service; neither service imports the other or
  ``preflight/``; ``preflight/`` may read both services;
- **the kit's packages**: ``kubemu`` imports no product and no other kit package; the test bed
  imports neither the demo nor the benchmarks;
- **the test bed's layers**: ``testbed.framework`` < ``testbed.components`` < ``testbed.scenarios``,
  no import pointing up (a component never composes a scenario; the framework knows no component).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "injection_webhook", "scaling_webhook", "preflight", "lifecycle")
KIT = ("kubemu", "demo", "bench", "testbed", "certs")  # the slime-kit distribution, in kit/
SERVICES = ("injection_webhook", "scaling_webhook")
# package -> the first-party packages it must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "common": (*SERVICES, "preflight", "lifecycle", *KIT, "tests"),
    "injection_webhook": ("scaling_webhook", "preflight", "lifecycle", *KIT, "tests"),
    "scaling_webhook": ("injection_webhook", "preflight", "lifecycle", *KIT, "tests"),
    "preflight": (
        "lifecycle",
        *KIT,
        "tests",
    ),  # the preflight check reads both services' models; neither service imports it
    "lifecycle": (
        "preflight",
        *KIT,
        "tests",
    ),  # the chart's hook Jobs (certificates, teardown) read the scaling service
    "kubemu": (*PRODUCT, "demo", "bench", "testbed", "certs", "tests"),
    "certs": (*SERVICES, "preflight", "lifecycle", "kubemu", "demo", "bench", "testbed", "tests"),  # common: --version
    "testbed": ("demo", "bench", "tests"),
    "demo": ("bench", "tests"),
    "bench": ("demo", "tests"),
}
# The test bed's layers, lowest first: a module of a layer imports no module of a layer above it.
LAYERS = ("testbed.framework", "testbed.components", "testbed.scenarios")


def imported_modules(source: str) -> set[str]:
    """The modules a module's source imports, dotted (absolute imports only; relative ones stay inside)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def imported_packages(source: str) -> set[str]:
    """The top-level packages a module's source imports."""
    return {name.split(".")[0] for name in imported_modules(source)}


def violations(package: str, module: str, source: str) -> list[str]:
    bad = sorted(imported_packages(source) & set(FORBIDDEN.get(package, ())))
    return [f"{module} imports {name}" for name in bad]


def layer_of(module: str) -> int | None:
    """The index of the test bed's layer ``module`` belongs to (None: outside the layers)."""
    return next((i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + ".")), None)


def layer_violations(layer: str, module: str, source: str) -> list[str]:
    own = layer_of(layer)
    assert own is not None, layer
    found = sorted(name for name in imported_modules(source) if (above := layer_of(name)) is not None and above > own)
    return [f"{module} ({layer}) imports {name}" for name in found]


def package_dir(package: str) -> Path:
    return REPO / "kit" / package if package in KIT else REPO / package


def test_imports_keep_the_layering() -> None:
    found = []
    for package in FORBIDDEN:
        for path in sorted(package_dir(package).rglob("*.py")):
            found += violations(package, str(path.relative_to(REPO)), path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_the_test_bed_keeps_its_layers() -> None:
    """framework < components < scenarios; every module of the test bed is in one of them."""
    testbed = REPO / "kit" / "testbed"
    found, outside = [], []
    for path in sorted(testbed.rglob("*.py")):
        dotted = ".".join(path.relative_to(REPO / "kit").with_suffix("").parts).removesuffix(".__init__")
        if layer_of(dotted) is None:
            if dotted != "testbed":
                outside.append(dotted)
            continue
        layer = next(layer for layer in LAYERS if dotted == layer or dotted.startswith(layer + "."))
        found += layer_violations(layer, str(path.relative_to(REPO)), path.read_text(encoding="utf-8"))
    assert not outside, f"test bed modules outside framework/components/scenarios: {outside}"
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("injection_webhook", "from scaling_webhook.mappings import Mapping\n", "imports scaling_webhook"),
        ("scaling_webhook", "import injection_webhook.decision\n", "imports injection_webhook"),
        ("common", "from kubemu import Emulator\n", "imports kubemu"),
        ("scaling_webhook", "from preflight.checks import Checks\n", "imports preflight"),
        ("preflight", "from testbed.framework.world import seed_slinky\n", "imports testbed"),
        ("demo", "from tests.support import audit\n", "imports tests"),
        ("common", "from certs.devcerts import create_ca\n", "imports certs"),
        ("kubemu", "import testbed.framework.wait\n", "imports testbed"),
    ],
)
def test_the_layering_check_catches_a_forbidden_import(package: str, source: str, expected: str) -> None:
    assert [v for v in violations(package, "x.py", source) if expected in v]


@pytest.mark.parametrize(
    ("layer", "source", "expected"),
    [
        ("testbed.framework", "from testbed.components.controlplane import ControlPlane\n", "testbed.components"),
        ("testbed.framework", "from testbed.scenarios import stack\n", "testbed.scenarios.stack"),
        ("testbed.components", "from testbed.scenarios.site import Site\n", "testbed.scenarios.site"),
        ("testbed.components", "import testbed.scenarios.fixtures\n", "testbed.scenarios.fixtures"),
    ],
)
def test_the_layer_check_catches_an_import_pointing_up(layer: str, source: str, expected: str) -> None:
    assert [v for v in layer_violations(layer, "x.py", source) if expected in v]


def test_an_import_pointing_down_is_allowed() -> None:
    source = "from testbed.framework.wait import wait_for\nfrom testbed.components import slurm\n"
    assert layer_violations("testbed.scenarios", "x.py", source) == []


def test_the_products_pyproject_names_no_kit_package() -> None:
    """The product's build, lint, type and test configuration stands without the kit."""
    text = (REPO / "pyproject.toml").read_text()
    config = tomllib.loads(text)
    tool = config.get("tool", {})
    assert "pytest" not in tool, "the product's pyproject configures no test run: pytest.ini does, for the checkout"
    first_party = tool["ruff"]["lint"]["isort"]["known-first-party"]
    mypy = tool["mypy"]
    included = tool["setuptools"]["packages"]["find"]["include"]
    named = {*first_party, *mypy["files"], *included, mypy.get("mypy_path", ""), *config["project"]["scripts"].values()}
    leaks = sorted(
        n for n in named for kit in (*KIT, "kit") if n == kit or n.startswith((f"{kit}.", f"{kit}/", f"{kit}*"))
    )
    assert not leaks, f"the product's pyproject.toml names the kit: {leaks}"
    assert set(config["project"]["optional-dependencies"]["dev"]) >= {"ruff>=0.6", "mypy>=1.11", "pytest>=8"}


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=900)


def test_ruff() -> None:
    """Each tree with its own configuration: the product, the kit (kit/pyproject.toml), the tests (tests/ruff.toml)."""
    result = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr


@pytest.mark.parametrize("tree", ["product", "kit"])
def test_mypy_strict(tree: str) -> None:
    """The product (pyproject.toml's files) and the kit (kit/pyproject.toml's; strict on the test bed), each with its
    own configuration and its own incremental cache (``.mypy_cache`` beside it)."""
    cwd = REPO if tree == "product" else REPO / "kit"
    result = _run("mypy", cwd=cwd)
    assert result.returncode == 0, f"mypy in {cwd}:\n" + result.stdout + result.stderr


def test_readme_is_short_and_ci_runs_its_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m pip install")]
    assert len(commands) == 2 and commands[0].endswith("slime-demo") and commands[1].endswith("python3 -m pytest")
    assert (
        commands[1].replace("python3 -m pip install", "python3 -m pip install -q") in (REPO / ".ci" / "run").read_text()
    )


def test_the_product_wheel_holds_no_kit_module(tmp_path: Path) -> None:
    import zipfile

    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("slime-*.whl")
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist() if not name.startswith("slime-")}
    assert top == set(PRODUCT), top


def test_the_image_copies_only_the_product() -> None:
    copied = {
        line.split()[1]
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
    }
    assert copied <= {"requirements.lock", "pyproject.toml", "README.md*", *PRODUCT}, copied
    assert set(PRODUCT) <= copied
