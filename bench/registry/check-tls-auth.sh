#!/usr/bin/env bash
# bench/registry/check-tls-auth.sh — start scripts/registry with TLS (a throwaway CA and a leaf for 127.0.0.1, one
# PEM holding key + chain) and Basic authentication, check both with curl, run verify.sh through them, stop it.
# Uses the registry's usual env (ONCEFLOW_REGISTRY_PORT, ONCEFLOW_CACHE, ...); stops a registry it started only.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
reg="$root/scripts/registry"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=onceflow-test-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout leaf.key -out leaf.csr -subj /CN=127.0.0.1 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 2 -extfile ext 2>/dev/null
cat leaf.key leaf.pem ca.pem >server.pem   # key, then the chain, leaf first
pw=$(head -c 12 /dev/urandom | base64 | tr -d '/+=')
fail=0
check() { # what expected-status curl-args...
  local what=$1 want=$2 got; shift 2
  got=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$@" || true)
  printf '%-58s HTTP %s (want %s)\n' "$what" "$got" "$want"
  [[ $got == "$want" ]] || fail=$((fail + 1))
}
url=$("$reg" up --tls-cert server.pem --basic-user "alice=$pw" --basic-user "bob=other-$pw")
trap '"$reg" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
echo "up: $url"
base=${url%/apis/ccompat/v7}
port=${base##*:}
printf 'user = "alice:%s"\n' "$pw" >alice.curl   # curl -K: the password stays off the command line
check "https, no credentials" 401 --cacert ca.pem "$url/subjects"
check "https, wrong password" 401 --cacert ca.pem -u alice:nope "$url/subjects"
check "https, alice" 200 --cacert ca.pem -K alice.curl "$url/subjects"
check "https, bob" 200 --cacert ca.pem -u "bob:other-$pw" "$url/subjects"
check "https, health through the API port, no credentials" 401 --cacert ca.pem "$base/health/ready"
check "plain http on the same port (refused)" 000 "http://127.0.0.1:$port/apis/ccompat/v7/subjects"
check "https without the CA (certificate not trusted)" 000 "$url/subjects"
echo "certificate served:"
openssl s_client -connect "127.0.0.1:$port" -showcerts </dev/null 2>/dev/null | grep -E '^ *[0-9] s:|^ +i:' | sed 's/^/  /'
if "$root/bench/registry/verify.sh" "$url" --cacert ca.pem -K alice.curl >verify.out 2>&1; then
  echo "verify.sh over TLS + Basic: $(tail -n1 verify.out)"
else
  echo "verify.sh over TLS + Basic FAILED:"; grep -B6 '^!!' verify.out || tail -n 20 verify.out; fail=$((fail + 1))
fi
"$reg" status || fail=$((fail + 1))
"$reg" down
trap 'rm -rf "$work"' EXIT
echo "$((9 - fail)) passed, $fail failed"
[[ $fail -eq 0 ]]
