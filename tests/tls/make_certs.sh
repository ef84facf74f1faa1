#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes the throwaway TLS files the tests use (see README.md). Run from anywhere; writes here.
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
days=36500  # the tests must not start failing when a certificate expires

ec_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
self_signed_ca() {  # KEY CERT NAME
  openssl req -x509 -new -key "$1" -out "$2" -days $days -subj "/CN=$3" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
}

ec_key "$work/ca.key"
self_signed_ca "$work/ca.key" ca.pem "psched test CA"
ec_key "$work/other_ca.key"
self_signed_ca "$work/other_ca.key" other_ca.pem "psched unrelated test CA"

# kj 0.9.2 checks the expected name as a DNS name only, so 127.0.0.1 is also listed as one.
ec_key server.key
openssl req -new -key server.key -out "$work/server.csr" -subj "/CN=localhost"
printf 'subjectAltName=DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' \
  > "$work/ext.cnf"
openssl x509 -req -in "$work/server.csr" -CA ca.pem -CAkey "$work/ca.key" -CAcreateserial \
  -CAserial "$work/ca.srl" -out server.pem -days $days -extfile "$work/ext.cnf"
chmod 600 server.key
