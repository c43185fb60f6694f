# Sourced by the scripts/*_venv.sh builders, after they set ROOT (the repository) and PY (the environment's python):
# what every side environment does the same way.

# pip install into the environment, quietly; pip names every extra local index that lacks a package: keep the real
# messages only
venv_pip() {
    { "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1; } \
        | { grep -v "is neither a file nor a directory" || true; }
}

# Files that are byte for byte the same in this and the repository's other environments (torch, triton, the model
# packages ...) become one file with several names (util-linux `hardlink`, same mode required). With .venv and the
# oracle, vLLM and TransformerLens 4 environments that is about 3.9 GB less on disk. pip and Python replace files
# rather than write into them, so an upgrade in one environment leaves the others as they were.
venv_share_files() {
    command -v hardlink >/dev/null 2>&1 || return 0
    local dirs=() d
    for d in "$ROOT/.venv" "$ROOT"/.*-venv; do
        [ -d "$d" ] && dirs+=("$d")
    done
    [ "${#dirs[@]}" -gt 1 ] || return 0
    hardlink -q -o -t -s 64K "${dirs[@]}" || echo "hardlink failed; the environments keep their own copies" >&2
}
