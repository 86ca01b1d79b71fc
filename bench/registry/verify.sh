#!/usr/bin/env bash
# bench/registry/verify.sh — exercise a running registry's Confluent-compatible API with curl, printing each
# command and its output (the transcript in scripts/registry.md comes from here).
#
#   bench/registry/verify.sh BASE_URL [curl options...]
#   e.g. bench/registry/verify.sh "$(scripts/registry url)"
#        bench/registry/verify.sh https://127.0.0.1:18081/apis/ccompat/v7 --cacert cert.pem -u alice:secret
#
# Uses fresh subject names (a per-run suffix) so it can run against a registry that already holds schemas.
set -uo pipefail
B=${1:?usage: verify.sh BASE_URL [curl options...]}
shift
C=(curl -sS "$@")
H='Content-Type: application/vnd.schemaregistry.v1+json'
R=${VERIFY_SUFFIX:-$(date +%s)}
fail=0

shq() { # the args, each shell-quoted only where it needs it: a command line to paste
  local a out=''
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=?@,+-]+$ ]]; then out+=" $a"; else out+=" '${a//\'/\'\\\'\'}'"; fi
  done
  printf '%s' "${out# }"
}

run() { # description; expected substring; curl args...
  local what=$1 want=$2 out
  shift 2
  printf '\n# %s\n$ curl -s %s\n' "$what" "$(shq "$@")"
  out=$("${C[@]}" -w '\nHTTP %{http_code}' "$@" 2>&1)
  printf '%s\n' "$out"
  if [[ $out != *"$want"* ]]; then printf '!! expected: %s\n' "$want"; fail=$((fail + 1)); fi
}

code=$("${C[@]}" -o /dev/null -w '%{http_code}' "$B/schemas/types" 2>/dev/null)
[[ $code == 200 ]] || { echo "verify.sh: $B/schemas/types answers HTTP $code, not 200: is the registry up (and are the" \
  "credentials and CA right)?"; echo "0 passed, 1 failed"; exit 1; }
u="users-$R-value"; p="orders-$R-proto"; j="orders-$R-json"; a="acme$R.Address"; c="customers-$R-value"
V1='{"schema":"{\"type\":\"record\",\"name\":\"User\",\"fields\":[{\"name\":\"id\",\"type\":\"int\"}]}"}'
V2='{"schema":"{\"type\":\"record\",\"name\":\"User\",\"fields\":[{\"name\":\"id\",\"type\":\"int\"},{\"name\":\"email\",\"type\":\"string\",\"default\":\"\"}]}"}'
BAD_TYPE='{"schema":"{\"type\":\"record\",\"name\":\"User\",\"fields\":[{\"name\":\"id\",\"type\":\"string\"}]}"}'
BAD_REQ='{"schema":"{\"type\":\"record\",\"name\":\"User\",\"fields\":[{\"name\":\"id\",\"type\":\"int\"},{\"name\":\"age\",\"type\":\"int\"}]}"}'
PROTO='{"schemaType":"PROTOBUF","schema":"syntax = \"proto3\";\npackage acme;\nmessage Order { int64 id = 1; string sku = 2; }\n"}'
PROTO_BAD='{"schemaType":"PROTOBUF","schema":"syntax = \"proto3\";\npackage acme;\nmessage Order { string id = 1; string sku = 2; }\n"}'
JSON='{"schemaType":"JSON","schema":"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]}"}'

run "global compatibility BACKWARD" 'BACKWARD' -X PUT -H "$H" -d '{"compatibility":"BACKWARD"}' "$B/config"
run "read it back" 'BACKWARD' "$B/config"
run "per-subject compatibility BACKWARD" 'BACKWARD' -X PUT -H "$H" -d '{"compatibility":"BACKWARD"}' "$B/config/$u"
run "register Avro v1" '"id":' -X POST -H "$H" -d "$V1" "$B/subjects/$u/versions"
id=$("${C[@]}" -X POST -H "$H" -d "$V1" "$B/subjects/$u/versions" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
# Confluent leaves "schemaType" out for Avro (Apicurio 3.3 too; 3.0.9 says "schemaType":"AVRO").
run "fetch it by id ($id)" '\"name\":\"id\"' "$B/schemas/ids/$id"
run "compatible change (field added with a default)" '"is_compatible":true' -X POST -H "$H" -d "$V2" "$B/compatibility/subjects/$u/versions/latest"
run "incompatible change (int -> string)" '"is_compatible":false' -X POST -H "$H" -d "$BAD_TYPE" "$B/compatibility/subjects/$u/versions/latest"
run "incompatible change (required field, no default), verbose" '"is_compatible":false' -X POST -H "$H" -d "$BAD_REQ" "$B/compatibility/subjects/$u/versions/latest?verbose=true"
run "register the incompatible schema: refused" 'HTTP 409' -X POST -H "$H" -d "$BAD_TYPE" "$B/subjects/$u/versions"
run "register the compatible v2" '"id":' -X POST -H "$H" -d "$V2" "$B/subjects/$u/versions"
run "versions" '[1,2]' "$B/subjects/$u/versions"
run "latest" '"version":2' "$B/subjects/$u/versions/latest"
run "lookup v1 under the subject" '"version":1' -X POST -H "$H" -d "$V1" "$B/subjects/$u"
run "register Protobuf" '"id":' -X POST -H "$H" -d "$PROTO" "$B/subjects/$p/versions"
pid=$("${C[@]}" -X POST -H "$H" -d "$PROTO" "$B/subjects/$p/versions" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
run "fetch Protobuf by id ($pid)" '"schemaType":"PROTOBUF"' "$B/schemas/ids/$pid"
run "per-subject BACKWARD on the Protobuf subject" 'BACKWARD' -X PUT -H "$H" -d '{"compatibility":"BACKWARD"}' "$B/config/$p"
run "incompatible Protobuf change (int64 -> string): refused" 'HTTP 409' -X POST -H "$H" -d "$PROTO_BAD" "$B/subjects/$p/versions"
run "register JSON Schema" '"id":' -X POST -H "$H" -d "$JSON" "$B/subjects/$j/versions"
jid=$("${C[@]}" -X POST -H "$H" -d "$JSON" "$B/subjects/$j/versions" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
run "fetch JSON Schema by id ($jid)" '"schemaType":"JSON"' "$B/schemas/ids/$jid"
run "Avro referenced type" '"id":' -X POST -H "$H" -d "{\"schema\":\"{\\\"type\\\":\\\"record\\\",\\\"name\\\":\\\"Address\\\",\\\"namespace\\\":\\\"acme$R\\\",\\\"fields\\\":[{\\\"name\\\":\\\"city\\\",\\\"type\\\":\\\"string\\\"}]}\"}" "$B/subjects/$a/versions"
run "Avro schema with a reference" '"id":' -X POST -H "$H" -d "{\"schema\":\"{\\\"type\\\":\\\"record\\\",\\\"name\\\":\\\"Customer\\\",\\\"namespace\\\":\\\"acme$R\\\",\\\"fields\\\":[{\\\"name\\\":\\\"addr\\\",\\\"type\\\":\\\"acme$R.Address\\\"}]}\",\"references\":[{\"name\":\"acme$R.Address\",\"subject\":\"$a\",\"version\":1}]}" "$B/subjects/$c/versions"
run "referenced-by" '[' "$B/subjects/$a/versions/1/referencedby"
run "unknown id" 'HTTP 404' "$B/schemas/ids/999999"
run "unknown subject" 'HTTP 404' "$B/subjects/nosuch-$R/versions"
run "invalid schema" 'HTTP 422' -X POST -H "$H" -d '{"schema":"{not json"}' "$B/subjects/bad-$R/versions"
run "schema types" 'AVRO' "$B/schemas/types"

printf '\n%d passed, %d failed\n' $(( $(grep -c '^run "' "$0") - fail )) "$fail"
[[ $fail -eq 0 ]]
