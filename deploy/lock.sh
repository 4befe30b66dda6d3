#!/usr/bin/env bash
# Regenerate deploy/requirements.lock: every runtime dependency of pyproject.toml, resolved
# once for every Python and platform the package supports, pinned exactly with the sha256
# of every distribution file, for `pip install --require-hashes` in deploy/Dockerfile.
# Needs uv (pip install uv) and PyPI. Run it after changing [project] dependencies in
# pyproject.toml or to take newer releases; tests/deploy/test_lock.py fails while the lock
# and pyproject.toml disagree.
set -euo pipefail
cd "$(dirname "$0")/.."
uv pip compile pyproject.toml --universal --generate-hashes --no-emit-package hami-trio \
  --custom-compile-command "deploy/lock.sh" -o deploy/requirements.lock "$@"
