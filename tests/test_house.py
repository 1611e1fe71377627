"""House rules, checked on every run: ruff (lint + import order), mypy (strict), and the layering of imports.

The layering is the one docs/architecture.md describes: ``common/`` imports no service; neither service
imports the other, nor the preflight check, the emulator, the demo, the benchmark or the test kit;
``preflight/`` (slime-check) may read both services but no tool; nothing but the tests imports ``tests``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "injection_webhook", "scaling_webhook", "certs", "preflight", "lifecycle")
KIT = ("kubemu", "demo", "bench", "testbed")  # the slime-kit distribution, in kit/
SERVICES = ("injection_webhook", "scaling_webhook")
TOOLS = ("kubemu", "demo", "bench", "testbed", "tests")
# package -> the first-party packages it must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "common": (*SERVICES, "preflight", *TOOLS),
    "certs": (*SERVICES, "preflight", *TOOLS),
    "injection_webhook": ("scaling_webhook", "preflight", *TOOLS),
    "scaling_webhook": ("injection_webhook", "preflight", *TOOLS),
    "preflight": TOOLS,  # the preflight check reads both services' models; neither service imports it
    "kubemu": (*SERVICES, "demo", "bench", "testbed", "tests"),
    "testbed": ("demo", "bench", "tests"),
    "demo": ("bench", "tests"),
    "bench": ("demo", "tests"),
}


def imported_packages(source: str) -> set[str]:
    """The top-level packages a module's source imports (absolute imports only; relative ones stay inside)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def violations(package: str, module: str, source: str) -> list[str]:
    bad = sorted(imported_packages(source) & set(FORBIDDEN.get(package, ())))
    return [f"{module} imports {name}" for name in bad]


def package_dir(package: str) -> Path:
    return REPO / "kit" / package if package in KIT else REPO / package


def test_imports_keep_the_layering() -> None:
    found = []
    for package in FORBIDDEN:
        for path in sorted(package_dir(package).rglob("*.py")):
            found += violations(package, str(path.relative_to(REPO)), path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("injection_webhook", "from scaling_webhook.mappings import Mapping\n", "imports scaling_webhook"),
        ("scaling_webhook", "import injection_webhook.decision\n", "imports injection_webhook"),
        ("common", "from kubemu import Emulator\n", "imports kubemu"),
        ("scaling_webhook", "from preflight.checks import Checks\n", "imports preflight"),
        ("preflight", "from testbed.world import b64\n", "imports testbed"),
        ("demo", "from tests.support import audit\n", "imports tests"),
    ],
)
def test_the_layering_check_catches_a_forbidden_import(package: str, source: str, expected: str) -> None:
    assert [v for v in violations(package, "x.py", source) if expected in v]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff() -> None:
    result = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = _run("mypy", "--no-incremental")
    assert result.returncode == 0, result.stdout + result.stderr


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
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
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
