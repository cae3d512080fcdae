#!/usr/bin/env bash
# test_cli.sh: the CLI's flags through $KILN_BIN (tools/cli.c, tools/kiln.c, tools/cmd_plot.c, bench/*.c). A bad value
# (not a number, hex, a fraction for a count, out of range, nan/inf), a missing value or an unknown option must exit 1
# with one stderr line that names the flag and nothing on stdout; "--" ends the options, so tokenize takes text that
# starts with a dash; and what comes from a file or argv (GGUF keys, tensor names, tokenizer pieces, file names) reaches
# the terminal escaped, with no raw ESC byte. Tiny models are made in a temporary folder with `kiln synth`.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
KILN=${KILN_BIN:-build/kiln}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
ESC=$'\x1b'

# refuses WANT ARGS...: `kiln ARGS...` exits 1, prints nothing on stdout and one stderr line that contains WANT (the
# flag, or the argument, as the message must name it) and no raw ESC byte.
refuses() {
    local want=$1; shift
    "$KILN" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? err; err=$(cat "$tmp/err")
    check "kiln $*: exit status $rc, not 1 (stderr: $err)" [ "$rc" -eq 1 ]
    check "kiln $*: wrote to stdout: $(head -c 300 "$tmp/out")" [ ! -s "$tmp/out" ]
    check "kiln $*: stderr is not one line: $err" [ "$(wc -l <"$tmp/err")" -eq 1 ]
    check "kiln $*: stderr does not name '$want': $err" grep -qF -- "$want" "$tmp/err"
    check "kiln $*: a raw ESC on stderr" [ "$(tr -cd '\033' <"$tmp/err" | wc -c)" -eq 0 ]
}

# bad_int CMD... FLAG: FLAG takes an integer; every malformed value of one is refused naming FLAG. TOO_BIG (the
# caller's variable) is past its range; the missing value is tried with FLAG last.
bad_int() {
    local flag=${*: -1} cmd=("${@:1:$#-1}") v
    for v in abc 0x10 2.5 1e3 nan inf -inf "" " 7" 7x "$TOO_BIG" -99999999999; do
        refuses "$flag" "${cmd[@]}" "$flag" "$v"
    done
    refuses "$flag" "${cmd[@]}" "$flag"
}

# bad_num CMD... FLAG: FLAG takes a real number; non-numbers, hex, nan/inf, overflow and TOO_BIG are refused.
bad_num() {
    local flag=${*: -1} cmd=("${@:1:$#-1}") v
    for v in abc 0x10 nan NaN inf -inf 1e999 "" 1.5.2 "$TOO_BIG"; do
        refuses "$flag" "${cmd[@]}" "$flag" "$v"
    done
    refuses "$flag" "${cmd[@]}" "$flag"
}

# A byte-level BPE vocab trained on a small corpus, and a tiny llama with it.
make_models() {
    [ -s "$tmp/tok.gguf" ] && return 0
    local i
    for i in $(seq 1 200); do echo "the quick brown fox jumps over the lazy dog $i -dash --double"; done >"$tmp/corpus.txt"
    "$KILN" tokenizer train "$tmp/corpus.txt" --vocab 300 -o "$tmp/tok.gguf" >/dev/null 2>&1 &&
        "$KILN" synth --vocab "$tmp/tok.gguf" --dim 32 --layers 1 --heads 2 --kv-heads 1 --ff 64 --ctx 64 \
            -o "$tmp/m.gguf" >/dev/null 2>&1
}

test_generate_flags() {
    TOO_BIG=1000000001 bad_int generate -n
    TOO_BIG=4097 bad_int generate -t
    TOO_BIG=2147483648 bad_int generate -c
    TOO_BIG=2147483648 bad_int generate --top-k
    TOO_BIG=2147483648 bad_int generate -ngl
    TOO_BIG=1.5 bad_num generate --top-p
    TOO_BIG=-0.1 bad_num generate --temp
    TOO_BIG=0 bad_num generate --repeat-penalty
    TOO_BIG=18446744073709551616 bad_int generate --seed
    refuses "--bogus" generate --bogus 1
    refuses "-p" generate -n 4 -p
    refuses "stray" generate -n 4 stray
    refuses "after" generate -n 4 -- after
}

test_perplexity_flags() {
    TOO_BIG=15 bad_int perplexity -m x -f y --ctx
    TOO_BIG=4097 bad_int perplexity -m x -f y -t
    TOO_BIG=-1 bad_int perplexity -m x -f y -ngl
    refuses "--bogus" perplexity --bogus
    refuses "-f" perplexity -m x -f
    refuses "/no/such\\x1b[2J" perplexity -m x -f "/no/such${ESC}[2J"
}

test_synth_flags() {
    local f
    for f in --dim --layers --heads --kv-heads --ff --ctx --vocab-size; do
        TOO_BIG=0 bad_int synth -o "$tmp/never.gguf" "$f"
    done
    TOO_BIG=4097 bad_int synth -o "$tmp/never.gguf" -t
    TOO_BIG=-1 bad_int synth -o "$tmp/never.gguf" --seed
    refuses "--bogus" synth --bogus -o "$tmp/never.gguf"
    refuses "-o" synth -o
    refuses "--shape" synth --shape
    check "a refused synth left a file" [ ! -e "$tmp/never.gguf" ]
}

test_quantize_flags() {
    TOO_BIG=4097 bad_int quantize in.gguf out.gguf q8_0 -t
    refuses "--bogus" quantize in.gguf out.gguf q8_0 --bogus
    refuses "extra" quantize in.gguf out.gguf q8_0 extra
}

test_tokenizer_train_flags() {
    TOO_BIG=2147483648 bad_int tokenizer train "$tmp/c.txt" -o "$tmp/never.gguf" --vocab
    TOO_BIG=2147483648 bad_int tokenizer train "$tmp/c.txt" -o "$tmp/never.gguf" --vocab 300 --min-frequency
    TOO_BIG=4097 bad_int tokenizer train "$tmp/c.txt" -o "$tmp/never.gguf" --vocab 300 -t
    refuses "--bogus" tokenizer train "$tmp/c.txt" --bogus
    refuses "-o" tokenizer train "$tmp/c.txt" --vocab 300 -o
    check "a refused tokenizer train left a file" [ ! -e "$tmp/never.gguf" ]
}

test_bench_flags() {
    local c
    for c in "" "--gpu"; do
        # each element of a list is read strictly: 128,abc 128,0x10 128,2.5 are refused, naming -p
        for v in 128,abc 128,0x10 128,2.5 128, ,128 128,-1 128,nan "128, 512"; do
            refuses "-p" bench $c -m x.gguf -p "$v"
        done
        TOO_BIG=1001 bad_int bench $c -m x.gguf -r
        TOO_BIG=2147483647 bad_int bench $c -m x.gguf -n
        refuses "--bogus" bench $c -m x.gguf --bogus
        refuses "-m" bench $c -m
    done
    TOO_BIG=4097,1 bad_int bench -m x.gguf -t
    TOO_BIG=4097 bad_int bench quant --big-mib
    refuses "--bogus" bench quant --bogus
    TOO_BIG=1000001 bad_int bench tokenize -m v.gguf --text t.txt --reps
    TOO_BIG=3601 bad_num bench tokenize -m v.gguf --text t.txt --min-time
    TOO_BIG=256 bad_int bench tokenize --train c.txt --vocab
    refuses "--bogus" bench tokenize --bogus
    TOO_BIG=2147483648 bad_int bench train -B
    TOO_BIG=0 bad_int bench train --steps
    TOO_BIG=4097 bad_int bench train --nproc
    refuses "--bogus" bench train --bogus
    refuses "--bogus" bench gpu-kernels --bogus
}

test_file_commands_flags() {
    refuses "--bogus" inspect --bogus x.gguf
    refuses "second" inspect x.gguf second
    refuses "--bogus" plot log.jsonl -o out.svg --bogus
    refuses "-o" plot log.jsonl -o
    refuses "--title" plot log.jsonl -o out.svg --title
    refuses "--bogus" convert llama2c m.bin --bogus
    refuses "--tokenizer" convert llama2c m.bin --tokenizer
    refuses "-m" tokenize -m
    refuses "--bogus" tokenize --bogus x
    refuses "--file" tokenize -m x --file
    refuses "--x\\x1b[2J" tokenize "--x${ESC}[2J"
    refuses "b\\x1b[2J" inspect a "b${ESC}[2J"
    refuses "cmd\\x1b[2J" "cmd${ESC}[2J"
    # "--" ends the options: a file named like one is the file
    refuses "-x.gguf" inspect -- -x.gguf
}

# `kiln tokenize -m M -- -TEXT` tokenizes -TEXT; its ids are those of the same bytes read with --file.
test_tokenize_dash_text() {
    make_models || check "could not make the test models" false
    local text="-dash --double the fox"
    printf '%s' "$text" >"$tmp/dash.txt"
    local got want
    got=$("$KILN" tokenize -m "$tmp/tok.gguf" --ids -- "$text" 2>"$tmp/err")
    check "tokenize -- failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    want=$("$KILN" tokenize -m "$tmp/tok.gguf" --ids --file "$tmp/dash.txt" 2>"$tmp/err")
    check "tokenize --file failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    check "no ids for '$text'" [ -n "$got" ]
    check "'-- $text' gives '$got', the file '$want'" [ "$got" = "$want" ]
    # ids for text that starts with a dash are more than one (the text is not taken for a flag and dropped)
    check "'$text' is $got" [ "$(echo "$got" | wc -w)" -gt 1 ]
    # without "--" the text is an unknown option, named
    refuses "$text" tokenize -m "$tmp/tok.gguf" "$text"
}

# The pieces of `kiln tokenize` come from the vocab: a byte token for ESC prints escaped.
test_tokenize_pieces_escaped() {
    make_models || check "could not make the test models" false
    "$KILN" tokenize -m "$tmp/tok.gguf" "a${ESC}[2Jb" >"$tmp/out" 2>"$tmp/err"
    check "tokenize failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    check "a raw ESC in tokenize's pieces: $(od -c "$tmp/out" | head -5)" [ "$(tr -cd '\033' <"$tmp/out" | wc -c)" -eq 0 ]
    check "the ESC piece is not shown as \\x1b: $(cat "$tmp/out")" grep -qF '\x1b' "$tmp/out"
}

# A GGUF whose metadata key, string value and tensor name hold ESC[2J (clear the screen): kiln inspect shows them
# escaped. Written by hand (GGUF v3: header, one KV, one tensor info, data aligned to 32).
test_inspect_escapes() {
    command -v python3 >/dev/null || skip "no python3 to write the GGUF"
    python3 - "$tmp/evil.gguf" <<'EOF' || check "could not write the GGUF" false
import struct, sys
def s(b): return struct.pack('<Q', len(b)) + b
key, val, name = b'general.evil\x1b[2Jkey', b'value\x1b[2J\xc2\x9b2J', b'tensor\x1b[2J.weight'
out = b'GGUF' + struct.pack('<IQQ', 3, 1, 1)
out += s(key) + struct.pack('<I', 8) + s(val)
out += s(name) + struct.pack('<I', 1) + struct.pack('<Q', 4) + struct.pack('<I', 0) + struct.pack('<Q', 0)
out += b'\0' * (-len(out) % 32) + struct.pack('<4f', 1, 2, 3, 4)
open(sys.argv[1], 'wb').write(out)
EOF
    local file=$tmp/evil.gguf
    "$KILN" inspect "$file" >"$tmp/out" 2>"$tmp/err"
    check "inspect failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    check "a raw ESC in inspect's output: $(od -c "$tmp/out" | grep -m3 033)" [ "$(tr -cd '\033' <"$tmp/out" | wc -c)" -eq 0 ]
    check "a raw C1 CSI in inspect's output" [ "$(grep -c $'\xc2\x9b' "$tmp/out")" -eq 0 ]
    check "the key is not shown escaped: $(cat "$tmp/out")" grep -qF 'general.evil\x1b[2Jkey' "$tmp/out"
    check "the tensor name is not shown escaped: $(cat "$tmp/out")" grep -qF 'tensor\x1b[2J.weight' "$tmp/out"
    check "the value is not shown escaped: $(cat "$tmp/out")" grep -qF '"value\x1b[2J\xc2\x9b2J"' "$tmp/out"
    # the file name too, in inspect's header line
    cp "$file" "$tmp/evil${ESC}[2J.gguf"
    "$KILN" inspect "$tmp/evil${ESC}[2J.gguf" >"$tmp/out" 2>&1
    check "a raw ESC in inspect's header for an escaped file name" [ "$(tr -cd '\033' <"$tmp/out" | wc -c)" -eq 0 ]
}

run test_generate_flags
run test_perplexity_flags
run test_synth_flags
run test_quantize_flags
run test_tokenizer_train_flags
run test_bench_flags
run test_file_commands_flags
run test_tokenize_dash_text
run test_tokenize_pieces_escaped
run test_inspect_escapes
test_exit
