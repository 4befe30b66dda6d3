"""deploy/Dockerfile and deploy/requirements.lock, read as text (no network, no podman).

The image installs its dependencies from the lock with ``pip install --require-hashes``, so
what it gets is what the lock says, not what PyPI has that day.  The lock is generated from
pyproject.toml by deploy/lock.sh; :func:`disagreements` fails the suite as soon as the two
disagree (a dependency added or given a range its pinned version is outside) or a pin has no
hash.  The Dockerfile's base is one build argument used by both stages, a tag or a tag with
its digest; the labels come from the build.  The build itself: tests/deploy/test_image.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "requirements.lock"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def pins(lock_text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of every requirement in a lock file."""
    found: dict[str, tuple[str, list[str]]] = {}
    for line in lock_text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        assert match is not None, f"not an exact pin: {line}"
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
        found[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return found


def disagreements(pyproject_text: str, lock_text: str) -> list[str]:
    """What makes the lock not the one of this pyproject.toml (empty: they agree)."""
    locked = pins(lock_text)
    problems = []
    for text in tomllib.loads(pyproject_text)["project"]["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name not in locked:
            problems.append(f"{name} is not in the lock")
        elif not requirement.specifier.contains(locked[name][0], prereleases=True):
            problems.append(f"{name}=={locked[name][0]} is outside {requirement.specifier}")
    problems += [f"{name} has no --hash" for name, (_, hashes) in locked.items() if not hashes]
    if "hami-trio" in locked:
        problems.append("hami-trio itself is in the lock (the image installs its own wheel)")
    return problems


def test_the_lock_agrees_with_pyproject() -> None:
    problems = disagreements((ROOT / "pyproject.toml").read_text(), LOCK.read_text())
    assert problems == [], f"{problems}: run deploy/lock.sh"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda deps: [*deps, "attrs-not-locked>=1"], "attrs-not-locked is not in the lock"),
        (lambda deps: [d.replace("trio>=0.27", "trio>=9.0") for d in deps], "trio==0.35.0 is"),
    ],
)
def test_a_pyproject_change_the_lock_lacks_is_a_disagreement(change: object, problem: str) -> None:
    project = (ROOT / "pyproject.toml").read_text()
    deps = tomllib.loads(project)["project"]["dependencies"]
    changed = change(deps)  # type: ignore[operator]
    text = re.sub(
        r"(?ms)^dependencies = \[.*?^\]",
        "dependencies = " + repr(changed).replace("'", '"'),
        project,
    )
    assert any(p.startswith(problem) for p in disagreements(text, LOCK.read_text()))


def test_a_pin_without_its_hash_is_a_disagreement() -> None:
    lock = LOCK.read_text()
    stripped = re.sub(r"(?m)^(trio==\S+) \\\n(    --hash=\S+( \\)?\n)+", r"\1\n", lock)
    assert stripped != lock
    assert "trio has no --hash" in disagreements((ROOT / "pyproject.toml").read_text(), stripped)


def _base_default() -> str:
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), flags=re.M)
    assert match is not None
    return match.group(1)


#: ``name:tag`` or ``name:tag@sha256:<64 hex>`` (the tag beside the digest, for the reader).
BASE = re.compile(r"[a-z0-9./_-]+:[\w.-]+(@sha256:[0-9a-f]{64})?")


def test_both_stages_use_the_one_base_argument_a_tag_or_a_tag_with_its_digest() -> None:
    text = DOCKERFILE.read_text()
    assert re.findall(r"^FROM (\S+)", text, flags=re.M) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert BASE.fullmatch(_base_default())
    assert BASE.fullmatch("python:3.12-slim-bookworm@sha256:" + "ab" * 32)
    assert not BASE.fullmatch("python@sha256:" + "ab" * 32)  # a digest without its tag
    assert not BASE.fullmatch("python:3.12@sha256:abc")  # not a sha256 digest


def test_the_image_installs_from_the_lock_and_mounts_the_wheel() -> None:
    text = DOCKERFILE.read_text()
    assert "--require-hashes --no-deps -r /tmp/requirements.lock" in text
    assert "--mount=type=bind,from=build,source=/wheels,target=/wheels" in text
    assert "COPY --from=build" not in text
    for label in ("version", "revision", "source"):
        assert f'org.opencontainers.image.{label}="${{{label.upper()}}}"' in text
    assert "!deploy/requirements.lock" in (ROOT / ".dockerignore").read_text()
