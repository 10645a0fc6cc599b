#!/bin/sh
# One-time certificates for the gpuflame webhook on a cluster without
# cert-manager. Writes, next to this script:
#   generated/ca.crt              a CA made for this purpose only (its key is deleted)
#   generated/tls.crt, tls.key    the webhook's serving certificate, signed by the CA
#   generated/cabundle-patch.yaml a JSON patch putting ca.crt into the caBundle
# The kustomization in this folder turns tls.* into the Secret gpuflame-webhook-tls
# and applies the patch. Then:  kubectl apply -k <this folder>
#
# Usage: make-certs.sh [namespace]   (default gpuflame-system; DAYS=825 to change validity)
# Needs openssl (1.1.1 or later).
set -eu
NAMESPACE=${1:-gpuflame-system}
SERVICE=gpuflame-webhook
DAYS=${DAYS:-825}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT="$HERE/generated"
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT INT TERM
umask 077

# The CA: its key signs one certificate and is then thrown away.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$WORK/ca.key" -out "$OUT/ca.crt" -days "$DAYS" \
    -subj "/CN=gpuflame-webhook-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# The serving certificate for the Service's DNS names.
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$OUT/tls.key" -out "$WORK/tls.csr" \
    -subj "/CN=$SERVICE.$NAMESPACE.svc" 2>/dev/null
cat > "$WORK/ext.cnf" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$SERVICE.$NAMESPACE.svc,DNS:$SERVICE.$NAMESPACE.svc.cluster.local
EXT
openssl x509 -req -in "$WORK/tls.csr" -CA "$OUT/ca.crt" -CAkey "$WORK/ca.key" \
    -CAcreateserial -CAserial "$WORK/ca.srl" -days "$DAYS" -sha256 \
    -extfile "$WORK/ext.cnf" -out "$OUT/tls.crt" 2>/dev/null
chmod 600 "$OUT/tls.key"
chmod 644 "$OUT/tls.crt" "$OUT/ca.crt"

CA_BUNDLE=$(openssl base64 -A < "$OUT/ca.crt")
cat > "$OUT/cabundle-patch.yaml" <<PATCH
# Written by make-certs.sh: the CA that signed generated/tls.crt.
- op: add
  path: /webhooks/0/clientConfig/caBundle
  value: $CA_BUNDLE
PATCH

openssl verify -CAfile "$OUT/ca.crt" "$OUT/tls.crt" >/dev/null
echo "wrote $OUT/{ca.crt,tls.crt,tls.key,cabundle-patch.yaml}"
echo "next: kubectl apply -k $HERE"
