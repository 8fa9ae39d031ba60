#!/usr/bin/env bash
# make-certs.sh DIR: a private CA and the certificates for TLS between the
# gateway (Envoy) and its side services (collector ingest, limiter), in DIR:
#   ca.pem                    the CA that signed both sides (trust it)
#   server.pem, server-key.pem  the services' certificate (names: localhost,
#                             collector, limiter, 127.0.0.1)
#   client.pem, client-key.pem  the gateway's client certificate
# For demos and tests: a real deployment uses its own PKI (or Istio's mTLS).
# Existing files are kept (delete DIR to renew). Needs openssl (Debian's
# package; `make openssl` installs it).
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
if [[ -s ca.pem && -s server.pem && -s client.pem ]]; then
  exit 0
fi
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca-key.pem
openssl req -x509 -new -key ca-key.pem -days 825 -subj "/CN=portcullis demo CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem 2>/dev/null
sign() { # name subject extensions
  key "$1-key.pem"
  openssl req -new -key "$1-key.pem" -subj "$2" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sign server "/CN=portcullis side services" \
  "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,DNS:collector,DNS:limiter,DNS:control,IP:127.0.0.1"
sign client "/CN=portcullis gateway" \
  "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
rm -f ca.srl
# Readable by the services' users in containers; the CA's key is not needed
# again.
rm -f ca-key.pem
chmod a+r ./*.pem
