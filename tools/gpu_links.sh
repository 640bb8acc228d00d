# Sourced (`. tools/gpu_links.sh`) by the scripts that also run from a
# gpu_pack.sh folder (.xfer/NAME/pack): tests/fixtures and conf linked
# from the checkout that folder sits in (the nearest folder above with
# tests/fixtures); in the checkout itself there is nothing to do.
if [ ! -e tests/fixtures ] || [ ! -e conf ]; then
    root=..
    while [ ! -d "$root/tests/fixtures" ] && [ "$(cd "$root" && pwd)" != / ]; do root=$root/..; done
    [ -d "$root/tests/fixtures" ] || { echo "$0: no tests/fixtures here or above" >&2; exit 1; }
    root=$(cd "$root" && pwd)
    [ -e tests/fixtures ] || { mkdir -p tests && ln -s "$root/tests/fixtures" tests/fixtures; }
    [ -e conf ] || ln -s "$root/conf" conf
fi
