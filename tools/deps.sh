#!/bin/sh
# Install the Debian packages the project needs, only when one is missing.
# Idempotent and quiet: when everything is present it costs one dpkg-query.
set -e
PKGS="nginx nginx-dev libyajl-dev libyaml-dev libpcre2-dev libcurl4-openssl-dev curl
      perl make gcc python3"
missing=""
for p in $PKGS; do
    s=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$s" in *"install ok installed"*) ;; *) missing="$missing $p" ;; esac
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have empty package lists; refresh them once.
if ! $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# Debian's nginx package starts a server on port 80 where systemd/invoke-rc.d
# can; the project never uses it, so leave whatever the package did alone.
