# Shared by the scripts in this folder: where the cache lives and how to make a Python venv.
# Sourced, not run.

# Everything downloaded or built for Tessera lives here, outside the repository.
TESSERA_CACHE_DIR="${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}"
export TESSERA_CACHE_DIR

# make_venv DIR PACKAGE...: a virtualenv at DIR with the packages installed (once).
make_venv() {
    local dir="$1"; shift
    local stamp="$dir/.installed"
    local want="$*"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    python3 -m venv "$dir" >&2
    "$dir/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
    echo "$want" > "$stamp"
}
