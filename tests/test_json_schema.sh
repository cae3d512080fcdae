#!/usr/bin/env bash
# test_json_schema.sh: `kiln generate --json-schema-file` on the bundled model (src/infer/json_schema.c through
# tools/kiln.c). For each schema and 20 seeds at --temp 1, the text generated must parse with python's json and be
# valid under the schema by the jsonschema package; --json-schema inline gives the same text as the file; a bad
# schema and a schema with --grammar are refused with one stderr line. Skips without python3's jsonschema.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
KILN=${KILN_BIN:-build/kiln}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# The schemas, one a line: strings and numbers bounded (maxLength, enums, patterns) so 400 tokens always suffice.
cat >"$tmp/schemas" <<'S'
{"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":10},"age":{"type":"integer","minimum":-5,"exclusiveMaximum":150}},"required":["name","age"]}
{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":4}
{"enum":["red","green",3,null,{"a":[1,2]}]}
{"type":"object","properties":{"ok":{"type":"boolean"},"note":{"type":["string","null"],"maxLength":6}},"additionalProperties":false}
{"type":"string","pattern":"^[A-Z][a-z]{1,5}(-[0-9]{2})?$"}
{"anyOf":[{"type":"integer"},{"type":"object","properties":{"x":{"const":"q\"\\"}},"required":["x"]}]}
{"prefixItems":[{"type":"string","maxLength":4},{"type":"boolean"}],"items":false,"minItems":2}
{"type":"object","properties":{"when":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"}},"required":["when","id"]}
{"$defs":{"leaf":{"type":"object","properties":{"v":{"type":"integer"},"tag":{"enum":["a","b"]}},"required":["v"],"additionalProperties":false}},"type":"array","maxItems":3,"items":{"$ref":"#/$defs/leaf"}}
{"allOf":[{"properties":{"a":{"type":"null"}},"required":["a"]},{"properties":{"b":{"type":"string","pattern":"^x[a-z]{0,2}$"}}}]}
S

test_json_schema_generate() {
    python3 -c 'import jsonschema' 2>/dev/null || skip "python3's jsonschema package is absent (pip install jsonschema)"
    [ -f models/shakespeare.gguf ] || skip "models/shakespeare.gguf is absent"
    local i=0 line seed
    while IFS= read -r line; do
        i=$((i + 1))
        printf '%s' "$line" >"$tmp/s$i.json"
        for seed in $(seq 1 20); do
            "$KILN" generate --json-schema-file "$tmp/s$i.json" -s "$seed" --temp 1 -n 400 -t 1 >"$tmp/out$i.$seed" 2>"$tmp/err"
            local rc=$?
            check "schema $i, seed $seed: exit status $rc ($(head -c 300 "$tmp/err"))" [ "$rc" -eq 0 ]
            check "schema $i, seed $seed: the text stopped early: $(head -c 300 "$tmp/err")" \
                sh -c '! grep -q "stopped before the grammar" "$1"' _ "$tmp/err"
        done
    done <"$tmp/schemas"
    local out
    out=$(python3 - "$tmp" "$i" <<'PY' 2>&1
import json, sys, jsonschema
tmp, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    schema = json.load(open(f"{tmp}/s{i}.json"))
    for seed in range(1, 21):
        text = open(f"{tmp}/out{i}.{seed}", encoding="utf-8").read()
        try:
            jsonschema.validate(json.loads(text), schema)
        except Exception as e:
            print(f"schema {i}, seed {seed}: {text[:200]!r}: {str(e)[:200]}")
            sys.exit(1)
PY
)
    check "$out" [ -z "$out" ]
}

test_json_schema_inline() {
    [ -f models/shakespeare.gguf ] || skip "models/shakespeare.gguf is absent"
    local s='{"type":"object","properties":{"k":{"enum":[1,2,3]}},"required":["k"]}'
    printf '%s' "$s" >"$tmp/inline.json"
    "$KILN" generate --json-schema "$s" -s 5 --temp 1 -n 100 -t 1 >"$tmp/a" 2>/dev/null
    "$KILN" generate --json-schema-file "$tmp/inline.json" -s 5 --temp 1 -n 100 -t 1 >"$tmp/b" 2>/dev/null
    check "inline and file differ: $(cat "$tmp/a") / $(cat "$tmp/b")" cmp -s "$tmp/a" "$tmp/b"
    check "not an object with k: $(cat "$tmp/a")" grep -qF '"k"' "$tmp/a"
}

# refuses WANT ARGS...: exit 1, nothing on stdout, one stderr line holding WANT.
refuses() {
    local want=$1; shift
    "$KILN" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? err; err=$(cat "$tmp/err")
    check "kiln $*: exit status $rc, not 1 (stderr: $err)" [ "$rc" -eq 1 ]
    check "kiln $*: wrote to stdout: $(head -c 300 "$tmp/out")" [ ! -s "$tmp/out" ]
    check "kiln $*: stderr is not one line: $err" [ "$(wc -l <"$tmp/err")" -eq 1 ]
    check "kiln $*: stderr does not name '$want': $err" grep -qF -- "$want" "$tmp/err"
}

test_json_schema_refused() {
    printf '{"type":"object",\n "not":{}}' >"$tmp/bad.json"
    printf '{"type":' >"$tmp/broken.json"
    refuses "json schema /: the keyword 'not' is not supported" generate --json-schema-file "$tmp/bad.json"
    refuses "broken.json: json schema: line 1, column 8" generate --json-schema-file "$tmp/broken.json"
    refuses "'#/\$defs/x' does not resolve" generate --json-schema '{"$ref":"#/$defs/x"}'
    refuses "not both" generate --json-schema '{}' --grammar 'root ::= "a"'
    refuses "not both" generate --json-schema-file "$tmp/bad.json" --grammar-file "$tmp/bad.json"
    refuses "not both" generate --json-schema '{}' --json-schema-file "$tmp/bad.json"
    refuses "--ignore-eos" generate --json-schema '{}' --ignore-eos
    refuses "$tmp/absent.json" generate --json-schema-file "$tmp/absent.json"
}

run test_json_schema_generate
run test_json_schema_inline
run test_json_schema_refused
test_exit
