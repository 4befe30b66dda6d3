"""deploy/Dockerfile, checked without a container engine.

These checks need no container engine (tests/deploy/test_image.py builds and runs the image
with podman).  What can go wrong without noticing is checked here: the entrypoint is the
console script ``hami-trio run`` that pyproject declares; the package is installed from a
built wheel, never editable; every ``COPY`` source exists and survives ``.dockerignore``; and
the wheel really builds from only what the Dockerfile copies (the README that pyproject names
as readme included).
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    result = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, rest))
    return found


def context_copies() -> list[str]:
    """Sources of every COPY that reads the build context (not ``--from=`` a stage)."""
    sources: list[str] = []
    for keyword, rest in instructions():
        if keyword != "COPY":
            continue
        words = shlex.split(rest)
        if any(w.startswith("--from") for w in words):
            continue
        sources.extend(w for w in words[:-1] if not w.startswith("--"))
    return sources


def ignored(path: str) -> bool:
    """Docker's .dockerignore rule for our patterns: the last matching line wins."""
    verdict = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/").replace("**/", "*")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            verdict = not negate
    return verdict


def test_final_stage_is_a_python_slim_image_running_hami_trio_run() -> None:
    args = dict(
        rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest
    )
    final = stages()[-1]
    base = final[0][1].split()[0]
    base = args.get(base.strip("${}"), base)
    assert base.startswith("python:3.1"), base
    assert "-slim" in base, base
    (entrypoint,) = [rest for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["hami-trio", "run"]  # exec form: signals reach the agent
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["hami-trio"] == "hami_trio.cli.main:main"


def test_package_is_installed_from_a_wheel_not_editable() -> None:
    runs = [rest for keyword, rest in instructions() if keyword == "RUN"]
    pip_runs = [r for r in runs if "pip" in r]
    assert any("pip wheel" in r for r in pip_runs)
    assert any("pip install" in r and ".whl" in r for r in pip_runs)
    for run in pip_runs:
        words = shlex.split(run)
        assert not {"-e", "--editable"} & set(words), run


def test_exposed_port_is_the_charts_metrics_port() -> None:
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "hami-trio" / "values.yaml").read_text())
    exposed = [rest for keyword, rest in instructions() if keyword == "EXPOSE"]
    assert exposed == [str(values["metrics"]["port"])]


def test_copied_sources_exist_and_are_not_ignored() -> None:
    sources = context_copies()
    assert "pyproject.toml" in sources
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert readme in sources, "hatchling needs the readme pyproject names"
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source), f"{source} is excluded by .dockerignore"
    assert not ignored("hami_trio/cli/main.py")
    assert ignored("hami_trio/__pycache__/cli.cpython-311.pyc")
    assert ignored(".venv/bin/python")
    assert ignored("tests/cli/test_main.py")


@pytest.mark.slow
def test_the_wheel_builds_from_only_what_the_dockerfile_copies(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    for source in context_copies():
        origin = ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, context / source)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", wheels, context],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("hami_trio-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "hami_trio/cli/main.py" in names
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "hami-trio = hami_trio.cli.main:main" in archive.read(entry_points).decode()
