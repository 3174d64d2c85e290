#!/usr/bin/env bash
# What the tests need beside Python: a real Prometheus server (the dashboards' PromQL runs
# against it) and headless Chromium (the page's screenshot and DOM), both Debian packages
# (nothing is installed when both are there), and the machine's PostgreSQL answering on
# 127.0.0.1:5432 (started when it is installed but down; KVSCOPE_TEST_PG names another).
set -euo pipefail
if [ -z "${KVSCOPE_TEST_PG:-}" ] && command -v pg_isready >/dev/null \
    && ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
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
