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
    TOO_BIG=2147483648 bad_int bench --gpu -m x.gguf -c
    TOO_BIG=0 bad_int bench --gpu -m x.gguf --ctx-size
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

# llama.cpp's spellings (common/arg.cpp) are the same flags: a bad value through a long form is refused naming it as
# typed, and a run with every long form prints what the short forms print, which differs when one value differs.
test_llama_cpp_spellings() {
    TOO_BIG=1000000001 bad_int generate --n-predict
    TOO_BIG=1000000001 bad_int generate --predict
    TOO_BIG=4097 bad_int generate --threads
    TOO_BIG=2147483648 bad_int generate --ctx-size
    TOO_BIG=0 bad_int generate --batch-size
    TOO_BIG=-1 bad_int generate --n-gpu-layers
    TOO_BIG=-1 bad_int generate --gpu-layers
    TOO_BIG=-2 bad_int generate --repeat-last-n
    TOO_BIG=1e10 bad_num generate --presence-penalty
    TOO_BIG=-1e10 bad_num generate --frequency-penalty
    TOO_BIG=-0.1 bad_num generate --temperature
    TOO_BIG=18446744073709551616 bad_int generate -s
    TOO_BIG=15 bad_int perplexity -m x -f y -c
    TOO_BIG=15 bad_int perplexity -m x -f y --ctx-size
    TOO_BIG=4097 bad_int perplexity -m x -f y --threads
    TOO_BIG=0 bad_int chat -m x --n-predict
    refuses "--n-prompt" bench --model x.gguf --n-prompt 128,abc
    TOO_BIG=1001 bad_int bench --model x.gguf --repetitions
    refuses "--n-gen" bench --model x.gguf --n-gen 2.5
    refuses "--model" chat --model
    refuses "-sys" chat -m x -sys
    refuses "--file" generate --file
    refuses "-r" generate -r
    refuses "no/such/prompt" generate -f "$tmp/no/such/prompt"
    make_models || check "could not make the test models" false
    local short long other
    short=$("$KILN" generate -m "$tmp/m.gguf" -p "the fox" -n 12 -t 1 -c 48 -b 4 --temp 0.9 --top-k 20 --top-p 0.9 --min-p 0.01 \
        --repeat-penalty 1.3 --repeat-last-n 8 --seed 5 2>"$tmp/err")
    check "generate with the short forms failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    long=$("$KILN" generate --model "$tmp/m.gguf" --prompt "the fox" --n-predict 12 --threads 1 --ctx-size 48 --batch-size 4 \
        --temperature 0.9 --top-k 20 --top-p 0.9 --min-p 0.01 --repeat-penalty 1.3 --repeat-last-n 8 -s 5 2>"$tmp/err")
    check "generate with the long forms failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    check "the long forms gave '$long', the short ones '$short'" [ "$long" = "$short" ]
    other=$("$KILN" generate --model "$tmp/m.gguf" --prompt "the fox" --predict 12 --threads 1 --temperature 0.9 -s 6 2>/dev/null)
    check "the seed (-s) changed nothing: '$other'" [ "$other" != "$short" ]
    # -f: the prompt from a file, less one final newline, as llama.cpp's -f
    printf 'the fox\n' >"$tmp/prompt.txt"
    long=$("$KILN" generate -m "$tmp/m.gguf" -f "$tmp/prompt.txt" -n 12 -t 1 -c 48 -b 4 --temp 0.9 --top-k 20 --top-p 0.9 \
        --min-p 0.01 --repeat-penalty 1.3 --repeat-last-n 8 --seed 5 2>"$tmp/err")
    check "generate -f failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    check "-f gave '$long', -p '$short'" [ "$long" = "$short" ]
    printf 'the\0fox' >"$tmp/nul.txt"
    refuses "offset 3" generate -m "$tmp/m.gguf" -f "$tmp/nul.txt"
    refuses "not both" generate -m "$tmp/m.gguf" -f "$tmp/prompt.txt" -p "the fox"
    # tokenize -p is the positional text
    short=$("$KILN" tokenize -m "$tmp/tok.gguf" --ids "the fox" 2>&1)
    long=$("$KILN" tokenize --model "$tmp/tok.gguf" --ids --prompt "the fox" 2>&1)
    check "tokenize --prompt gave '$long', the positional text '$short'" [ -n "$short" ] && [ "$long" = "$short" ]
}

# An unknown flag is named as unknown wherever it stands (at the end of chat's line it read "-i needs a value"),
# with the nearest flag when one is close.
test_unknown_option() {
    local c
    for c in generate chat perplexity tokenize; do
        refuses "kiln: $c: unknown option '--foo'" $c -m x --foo
        refuses "kiln: $c: unknown option '-i'" $c -m x -i
    done
    refuses "kiln: bench: unknown option '-i'" bench -m x -i
    refuses "unknown option '--tmp' (did you mean --temp?)" generate --tmp 0.5
    refuses "unknown option '--ctx-sise' (did you mean --ctx-size?)" perplexity --ctx-sise 64
    refuses "unknown option '--presense-penalty' (did you mean --presence-penalty?)" chat --presense-penalty 1
    refuses "unknown option '--zzzzzz'" generate --zzzzzz
    check "a suggestion for a far-off flag: $(cat "$tmp/err")" [ "$(grep -c "did you mean" "$tmp/err")" -eq 0 ]
}

# kiln --version and each command's print include/kiln.h's KILN_VERSION on stdout and exit 0.
test_version() {
    local want got c
    want="kiln $(sed -n 's/^#define KILN_VERSION "\(.*\)"$/\1/p' include/kiln.h)"
    check "no KILN_VERSION in include/kiln.h" [ "$want" != "kiln " ]
    for c in "" version generate chat perplexity tokenize bench "generate -m x.gguf" "bench -m x.gguf"; do
        got=$("$KILN" $c --version 2>"$tmp/err")
        check "kiln $c --version: exit $?, '$got' (stderr: $(cat "$tmp/err")), not '$want'" [ "$got" = "$want" ]
    done
}

# pick_stop TEXT: a 6-byte stop string around the first space after byte 20 of TEXT (a word's end, the space, the
# next word's start: at least two tokens of a vocab whose words carry their leading space), or nothing.
pick_stop() {
    local t=$1 i stop
    for ((i = 20; i < ${#t} - 4; i++)); do
        stop=${t:i-2:6}
        if [ "${t:i:1}" = " " ] && [[ $stop != *$'\n'* ]] && [[ ${stop:0:2} != *" "* ]] && [[ ${stop:3:3} != *" "* ]]; then
            printf '%s' "$stop"
            return
        fi
    done
}

# -r: the text stops before the first stop string the generated text holds, even one split across tokens, and the
# stop string is never printed. The cut is checked against the same greedy run without -r: its text up to that
# string's first occurrence after the prompt. Chat's reply is cut the same way.
test_stop_strings() {
    local model=models/shakespeare.gguf full stop want got
    [ -s "$model" ] || skip "$model not found"
    full=$("$KILN" generate -m "$model" -p "ROMEO:" -n 60 --temp 0 -t 1 2>"$tmp/err")
    check "generate failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    stop=$(pick_stop "$full")
    check "no stop string candidate in '$full'" [ -n "$stop" ]
    want=${full#ROMEO:}
    want="ROMEO:${want%%"$stop"*}"
    got=$("$KILN" generate -m "$model" -p "ROMEO:" -n 60 --temp 0 -t 1 -r "zzqq" -r "$stop" 2>"$tmp/err")
    check "generate -r failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    check "-r '$stop' gave '$got', not '$want' (the run without it: '$full')" [ "$got" = "$want" ]
    check "-r did not say it stopped: $(cat "$tmp/err")" grep -q "stopped at a stop string" "$tmp/err"
    # a stop string that never comes holds nothing back for good: the whole text is printed
    got=$("$KILN" generate -m "$model" -p "ROMEO:" -n 60 --temp 0 -t 1 --reverse-prompt "zzqq" 2>"$tmp/err")
    check "-r zzqq gave '$got', not '$full'" [ "$got" = "$full" ]
    full=$(echo Hail | "$KILN" chat -m "$model" --chat-template llama2 --temp 0 -n 40 -t 1 2>"$tmp/err")
    check "chat failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    stop=$(pick_stop "$full")
    check "no stop string candidate in the reply '$full'" [ -n "$stop" ]
    got=$(echo Hail | "$KILN" chat -m "$model" --chat-template llama2 --temp 0 -n 40 -t 1 -r "$stop" 2>"$tmp/err")
    check "chat -r '$stop' gave '$got', not '${full%%"$stop"*}' (without it: '$full')" [ "$got" = "${full%%"$stop"*}" ]
}

# --ignore-eos: stories260K ends its greedy story with BOS/EOS before 400 tokens; with the flag it writes all 400.
test_ignore_eos() {
    local d=${KILN_DATA:-../shared/data}/models/stories260K
    [ -s "$d/stories260K.bin" ] || skip "$d/stories260K.bin not found (needs ../shared/data)"
    "$KILN" convert llama2c "$d/stories260K.bin" --tokenizer "$d/tok512.bin" -o "$tmp/s260.gguf" 2>/dev/null
    check "convert llama2c failed" [ -s "$tmp/s260.gguf" ]
    "$KILN" generate -m "$tmp/s260.gguf" -n 400 --temp 0 -t 1 >/dev/null 2>"$tmp/err"
    check "without --ignore-eos the story did not end early: $(cat "$tmp/err")" grep -qE "generated ([0-9]|[0-9][0-9]|[0-3][0-9][0-9]) tokens" "$tmp/err"
    "$KILN" generate -m "$tmp/s260.gguf" -n 400 --temp 0 -t 1 --ignore-eos >/dev/null 2>"$tmp/err"
    check "--ignore-eos did not write 400 tokens: $(cat "$tmp/err")" grep -q "generated 400 tokens" "$tmp/err"
}

# Progress without a terminal: whole lines, no \r (a log stays readable).
test_progress_plain() {
    local model=models/shakespeare.gguf text=${KILN_DATA:-../shared/data}/corpora/english/tinyshakespeare.txt
    [ -s "$model" ] || skip "$model not found"
    [ -s "$text" ] || skip "$text not found (needs ../shared/data)"
    head -c 6000 "$text" >"$tmp/ppl.txt"
    "$KILN" perplexity -m "$model" -f "$tmp/ppl.txt" -c 64 -t 1 >"$tmp/out" 2>"$tmp/err"
    check "perplexity failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    check "a \\r in perplexity's progress off a terminal: $(od -c "$tmp/err" | head -3)" [ "$(tr -cd '\r' <"$tmp/err" | wc -c)" -eq 0 ]
    check "no progress lines: $(head -3 "$tmp/err")" [ "$(grep -c '^\[[0-9]*/[0-9]*\] ppl' "$tmp/err")" -gt 1 ]
}

# -ctk/-ctv (llama.cpp's KV-cache types): an unknown type is one line naming the flag and listing the five; each
# type runs generate and bench on the bundled model, and bench reports the cache's bytes and what they save.
test_cache_types() {
    local cmd f
    for cmd in generate chat perplexity bench; do
        for f in -ctk --cache-type-k -ctv --cache-type-v; do
            refuses "$f: unknown KV cache type 'q8' (f16, f32, bf16, q8_0, q4_0)" $cmd -m x.gguf "$f" q8
        done
        refuses "-ctk" $cmd -m x.gguf -ctk
    done
    for f in -ctk --cache-type-k -ctv --cache-type-v; do # bench --gpu refuses before it looks for a device
        refuses "$f: unknown KV cache type 'q8' (f16, f32, bf16, q8_0, q4_0)" bench --gpu -m x.gguf "$f" q8
    done
    refuses "-ctv: unknown KV cache type 'F16'" generate -ctv F16
    local model=models/shakespeare.gguf t
    [ -s "$model" ] || skip "$model not found"
    for t in f16 f32 bf16 q8_0 q4_0; do
        "$KILN" generate -m "$model" -p "ROMEO:" -n 8 --temp 0 -ctk "$t" -ctv "$t" -t 1 >"$tmp/out" 2>"$tmp/err"
        check "generate -ctk $t failed: $(cat "$tmp/err")" [ $? -eq 0 ]
        check "generate -ctk $t: no text" grep -q "^ROMEO:." "$tmp/out"
    done
    "$KILN" bench -m "$model" -p 16 -n 4 -r 1 -t 1 -ctk q8_0 -ctv q4_0 --json-only >"$tmp/out" 2>"$tmp/err"
    check "bench -ctk q8_0 -ctv q4_0 failed: $(cat "$tmp/err")" [ $? -eq 0 ]
    # 6 layers x 4 KV heads x 32 dims = 768 values a position per cache, 24 blocks of 32; a context of 16 positions:
    # f16 2 x 16 x 768 x 2 bytes, q8_0 keys 34 and q4_0 values 18 bytes a block: 16 x 24 x (34 + 18)
    check "bench: kv types not reported: $(head -c 600 "$tmp/out")" grep -q '"type_k":"q8_0","type_v":"q4_0"' "$tmp/out"
    check "bench: kv_bytes not 16 x 24 x (34 + 18): $(head -c 600 "$tmp/out")" grep -q '"kv_bytes":19968,"kv_bytes_f16":49152,"kv_saved_bytes":29184' "$tmp/out"
}

run test_generate_flags
run test_cache_types
run test_perplexity_flags
run test_synth_flags
run test_quantize_flags
run test_tokenizer_train_flags
run test_bench_flags
run test_file_commands_flags
run test_tokenize_dash_text
run test_tokenize_pieces_escaped
run test_inspect_escapes
run test_llama_cpp_spellings
run test_unknown_option
run test_version
run test_stop_strings
run test_ignore_eos
run test_progress_plain
test_exit
