# Sourced by the install scripts: `as_root CMD...` runs CMD as root (at
# once when already root, else through sudo), or stops the script with a
# message naming it and the command when neither is possible.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "$(basename "$0"): need root (or sudo) to run: $*" >&2
        exit 1
    fi
}

# `apt_install PACKAGE...`: apt-get update, then the packages without
# their recommendations, non-interactively; progress on stderr.
apt_install() {
    {
        as_root apt-get update &&
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
    } >&2
}
