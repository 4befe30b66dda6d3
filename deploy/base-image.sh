#!/bin/sh
# A local base image for deploy/Dockerfile when no container registry is reachable: Debian
# bookworm (minbase) with python3, pip and the CA certificates, made by mmdebstrap from the
# Debian mirror and imported into the container engine.  Run as root:
#
#   deploy/base-image.sh podman localhost/hami-trio-base:bookworm
#   podman build --build-arg PYTHON_IMAGE=localhost/hami-trio-base:bookworm ...
#
# ENGINE is podman or docker (both have `import`).  MIRROR (optional) is the Debian mirror
# mmdebstrap downloads from (default: deb.debian.org).  tests/deploy/test_image.py runs this
# script and caches the image under a tag that is a hash of this file.
#
# Debian's EXTERNALLY-MANAGED marker is removed: the image is built to run one pip-installed
# application (the Dockerfile's `pip install` would be refused otherwise, PEP 668), exactly as
# the python:*-slim images ship.  apt's lists and downloaded packages are dropped.
set -eu
if [ "$#" -ne 2 ]; then
  echo "usage: $0 podman|docker TAG" >&2
  exit 2
fi
engine=$1
tag=$2
tarball=$(mktemp /var/tmp/hami-trio-base.XXXXXX.tar)
trap 'rm -f "$tarball"' EXIT INT TERM
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-pip,python-is-python3,ca-certificates \
  --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb' \
  bookworm "$tarball" ${MIRROR:+"$MIRROR"}
"$engine" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  "$tarball" "$tag" >/dev/null
echo "$tag"
