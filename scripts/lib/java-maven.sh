# Sourced by the install scripts that resolve jars with Maven from Maven
# Central (install-kafka.sh, install-debezium.sh); they define `log` and
# `die` first.

# require_java_and_maven WHAT: Java 17 runs WHAT, Maven resolves its jars.
# Installs either from Debian when missing, then checks both and
# sha256sum, naming the package to install when one is still missing.
require_java_and_maven() {
    local what="$1" packages=() sudo_cmd=()
    command -v java >/dev/null 2>&1 || packages+=(openjdk-17-jre-headless)
    command -v mvn >/dev/null 2>&1 || packages+=(maven)
    if [ "${#packages[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing ${packages[*]} from Debian"
        [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
        "${sudo_cmd[@]}" apt-get update -qq >&2
        "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${packages[@]}" >&2
    fi
    command -v java >/dev/null 2>&1 || die "java not found: ${what} needs Java 17 or newer (apt-get install openjdk-17-jre-headless)"
    command -v mvn >/dev/null 2>&1 || die "mvn not found: Maven resolves the jars of ${what} from Maven Central (apt-get install maven)"
    command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"
}
