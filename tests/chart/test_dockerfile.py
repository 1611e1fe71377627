"""Static checks of the Dockerfile (no container engine in CI): what we can honestly verify by reading it."""

from __future__ import annotations

import re
import tomllib

import pytest

from testbed.framework.paths import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())  # join continuation lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for op, rest in _instructions():
        if op == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((op, rest))
    return stages


def test_multi_stage_on_python_311_slim():
    stages = _stages()
    assert len(stages) >= 2
    args = {k: v for op, rest in _instructions() if op == "ARG" and "=" in rest for k, v in [rest.split("=", 1)]}
    for stage in stages:
        base = stage[0][1].split()[0]
        base = args.get(base.strip("${}"), base)
        assert base == "python:3.11-slim"
    assert re.search(r"\bAS builder$", stages[0][0][1])


def test_builder_installs_the_hashed_lock_then_the_project_without_deps():
    runs = " ".join(rest for op, rest in _stages()[0] if op == "RUN")
    copies = [rest for op, rest in _stages()[0] if op == "COPY"]
    assert any("requirements.lock" in c for c in copies)
    assert re.search(r"pip install [^&]*--require-hashes[^&]*-r requirements\.lock", runs)
    assert re.search(r"pip install [^&]*--no-deps [^&]*\.", runs)


def test_final_stage_is_venv_only_non_root_and_without_build_tools():
    final = _stages()[-1]
    text = " ".join(f"{op} {rest}" for op, rest in final)
    assert any(op == "COPY" and "--from=builder" in rest and "/opt/venv" in rest for op, rest in final)
    assert not re.search(r"build-essential|\bgcc\b|\bg\+\+|\bmake\b|apt-get install|-dev\b", text)
    assert not any(op == "COPY" and "--from" not in rest for op, rest in final), "final stage copies sources"
    (user,) = [rest for op, rest in final if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid (runAsNonRoot needs it)"
    assert uid == "65532"
    assert ("ENTRYPOINT", "[]") in final
    assert ("CMD", '["injection-webhook"]') in final


def test_both_console_scripts_exist_and_are_documented():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    install_doc = (REPO_ROOT / "docs" / "install.md").read_text()
    for script in ("injection-webhook", "scaling-webhook"):
        assert script in scripts
        assert script in DOCKERFILE.read_text()
        assert script in install_doc


@pytest.mark.parametrize(
    "needed", ["requirements.lock", "pyproject.toml", "common", "injection_webhook", "scaling_webhook"]
)
def test_dockerignore_keeps_the_build_inputs(needed):
    ignored = {
        ln.strip()
        for ln in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert needed not in ignored
    assert {".git", "tests", ".tools"} <= ignored
