#!/usr/bin/env bash
# Creates the virtualenv the Python consumer package (python/) is tested in,
# with the pinned versions of python/requirements-test.txt (wheels only,
# each checked against its sha256 there), and installs the package into it
# the way a user does: `pip install ./python`, built with the pinned
# setuptools of the venv rather than whatever PyPI serves at the time.
#
#   scripts/install-python-venv.sh        prints the venv's python on stdout
#
# The venv lives in target/tools/python-venv. The pinned requirements are
# installed again only when python/requirements-test.txt or the interpreter
# changed (a stamp file records both); the package itself is reinstalled on
# every run, so the tests always run the working tree's code. Needs Python
# 3.10-3.13 on Linux x86_64 (the wheels hashed in the requirements; run
# scripts/hash-python-requirements.sh after changing a pin) with venv, and
# access to PyPI.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
VENV_DIR="${REPO_ROOT}/target/tools/python-venv"
REQUIREMENTS="${REPO_ROOT}/python/requirements-test.txt"
PYTHON="${PYTHON:-python3}"

log() { echo "install-python-venv.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

command -v "${PYTHON}" >/dev/null 2>&1 || die "${PYTHON} not found; Python >= 3.10 with venv is required"
"${PYTHON}" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' ||
    die "$("${PYTHON}" --version 2>&1) is too old: the package needs Python >= 3.10 (set PYTHON=...)"

stamp_value="$("${PYTHON}" -c 'import sys; print(sys.version)' | tr -d '\n') $(sha256sum "${REQUIREMENTS}" | cut -d' ' -f1)"
stamp_file="${VENV_DIR}/.walrelay-stamp"
PIP=("${VENV_DIR}/bin/python" -m pip --disable-pip-version-check -q)

if [ ! -f "${stamp_file}" ] || [ "$(cat "${stamp_file}")" != "${stamp_value}" ] ||
    ! "${VENV_DIR}/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "${VENV_DIR}"
    mkdir -p "$(dirname "${VENV_DIR}")"
    log "creating ${VENV_DIR} with $("${PYTHON}" --version 2>&1)"
    "${PYTHON}" -m venv "${VENV_DIR}" ||
        die "'${PYTHON} -m venv' failed: install the venv module (Debian: apt-get install python3-venv)"
    log "installing the pinned test requirements (python/requirements-test.txt)"
    "${PIP[@]}" install --no-deps --only-binary=:all: --require-hashes -r "${REQUIREMENTS}" ||
        die "installing python/requirements-test.txt failed: no access to PyPI, or a wheel whose sha256 is not the pinned one (a tampered download, or an interpreter or platform without a hashed wheel: Python 3.10-3.13 on Linux x86_64)"
    # Everything pinned must be all there is: a missing pin would make pip
    # pick a version by itself.
    "${PIP[@]}" check >&2 || die "python/requirements-test.txt is incomplete (pip check failed above)"
    echo "${stamp_value}" >"${stamp_file}"
fi

log "installing the package: pip install ./python"
# setuptools builds in the source tree; a build/ left by an earlier build
# could put modules deleted since into the wheel.
rm -rf "${REPO_ROOT}/python/build" "${REPO_ROOT}"/python/src/*.egg-info
"${PIP[@]}" install --force-reinstall --no-deps --no-build-isolation "${REPO_ROOT}/python"
# Its dependencies must be satisfied by the pins.
"${PIP[@]}" check >&2 || die "the package's dependencies are not satisfied by python/requirements-test.txt"
rm -rf "${REPO_ROOT}/python/build" "${REPO_ROOT}"/python/src/*.egg-info
echo "${VENV_DIR}/bin/python"
