#!/usr/bin/env bash
# What tests/test_dashboards.py and tests/test_page.py need beside Python: a real Prometheus
# server (the dashboards' PromQL runs against it) and headless Chromium (the page's screenshot
# and DOM). Both are Debian packages; nothing is installed when both are already there.
set -euo pipefail
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-services: need root to apt-get install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: Prometheus's recommends pull in node-exporter and friends, which
# would start as services; the tests start their own server on a free loopback port.
apt-get install -y -qq --no-install-recommends "${missing[@]}" fonts-dejavu-core >/dev/null
# Debian's package starts a prometheus service listening on :9090 where an init system runs
# it; the tests do not need it.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus || true
  systemctl disable prometheus || true
fi
command -v prometheus >/dev/null && command -v chromium >/dev/null
