#!/usr/bin/env bash
# Rewrites the sha256 hashes of python/requirements-test.txt from its
# `name==version` pins, so that scripts/install-python-venv.sh can install
# with `pip install --require-hashes`. Run it after changing a pin:
#
#   scripts/hash-python-requirements.sh
#
# It downloads every pinned wheel for CPython 3.10-3.13 on Linux x86_64
# (the interpreters the package supports on the machines the tests run
# on) and writes one `--hash` per distinct wheel. Comments and blank lines
# are kept; a pin without a wheel for one of those is an error.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQUIREMENTS="${SCRIPT_DIR}/../python/requirements-test.txt"
PYTHON="${PYTHON:-python3}"
PYTHON_VERSIONS=(3.10 3.11 3.12 3.13)

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# The pins alone: `name==version` at the start of a line, hashes dropped.
sed -n 's/^\([A-Za-z0-9_.-]*==[^ \\]*\).*/\1/p' "${REQUIREMENTS}" >"${work}/pins.txt"
for version in "${PYTHON_VERSIONS[@]}"; do
    "${PYTHON}" -m pip download -q --no-deps --only-binary=:all: \
        --python-version "${version}" --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "${work}/wheels" -r "${work}/pins.txt" >&2
done

"${PYTHON}" - "${REQUIREMENTS}" "${work}/wheels" <<'EOF'
import hashlib
import pathlib
import re
import sys

requirements, wheels = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


hashes: dict[tuple[str, str], set[str]] = {}
for wheel in wheels.glob("*.whl"):
    name, version = wheel.name.split("-")[:2]
    hashes.setdefault((norm(name), version), set()).add(hashlib.sha256(wheel.read_bytes()).hexdigest())

out = []
for line in requirements.read_text().splitlines():
    if line.strip().startswith("--hash="):
        continue  # a hash of the previous run
    line = line.rstrip().removesuffix("\\").rstrip()
    m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line)
    if not m:
        out.append(line)
        continue
    found = hashes.get((norm(m.group(1)), m.group(2)))
    if not found:
        sys.exit(f"no wheel of {m.group(1)}=={m.group(2)} was downloaded")
    digests = sorted(found)
    out.append(f"{line} \\")
    out.extend(f"    --hash=sha256:{d}" + (" \\" if i < len(digests) - 1 else "") for i, d in enumerate(digests))
requirements.write_text("\n".join(out) + "\n")
EOF
echo "hashed the pins of ${REQUIREMENTS}" >&2
