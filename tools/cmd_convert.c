/* cmd_convert.c: `kiln convert`, other formats into GGUF.
 *   kiln convert llama2c MODEL.bin --tokenizer TOK.bin -o OUT.gguf   a llama2.c checkpoint (src/model/convert_llama2c.c)
 *   kiln convert hf DIR -o OUT.gguf [--type T] [-t THREADS]        a Hugging Face folder (src/model/convert_hf.c)
 * tests/test_cli.sh and tests/test_hf_oracle.c run both. */
#include "tools/cmd.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int convert_llama2c(int argc, char **argv) {
    const char *in = NULL, *tok = NULL, *out = NULL;
    const kiln_cli_opt opts[] = {{"--tokenizer", KILN_CLI_STR, &tok, 0, 0}, {"-o", KILN_CLI_STR, &out, 0, 0}};
    int n_pos = 0;
    if (!kiln_cli_parse_args("convert", argc, argv, opts, 2, &in, 1, &n_pos)) return 1;
    if (!in || !tok || !out) {
        fprintf(stderr, "kiln: usage: kiln convert llama2c MODEL.bin --tokenizer TOK.bin -o OUT.gguf\n");
        return 1;
    }
    kiln_status s = kiln_convert_llama2c(in, tok, out);
    if (s) return kiln_cli_die(s);
    kiln_cli_note("wrote %s", out);
    return 0;
}

static int convert_hf(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *type = "f16";
    int threads = 0, n_pos = 0;
    const kiln_cli_opt opts[] = {{"-o", KILN_CLI_STR, &out, 0, 0}, {"--type", KILN_CLI_STR, &type, 0, 0}, {"-t", KILN_CLI_INT, &threads, 0, 4096}};
    if (!kiln_cli_parse_args("convert", argc, argv, opts, 3, &dir, 1, &n_pos)) return 1;
    if (!dir || !out) {
        fprintf(stderr, "kiln: usage: kiln convert hf DIR -o OUT.gguf [--type f32|f16|bf16|q8_0|q4_k_m|...] [-t THREADS]\n");
        return 1;
    }
    kiln_ftype ftype;
    kiln_status s = kiln_ftype_from_name(type, &ftype);
    if (s) return kiln_cli_die(s);
    bool plain = ftype == KILN_FTYPE_ALL_F32 || ftype == KILN_FTYPE_MOSTLY_F16 || ftype == KILN_FTYPE_MOSTLY_BF16;
    if (plain) s = kiln_convert_hf(dir, out, &(kiln_convert_hf_params){ftype});
    else {
        /* a quantized mix: F32 first (no rounding before the quantizer's), then kiln quantize's rules */
        char tmp[4200];
        if (snprintf(tmp, sizeof tmp, "%s.f32.%ld", out, (long)getpid()) >= (int)sizeof tmp) {
            fprintf(stderr, "kiln: convert: -o path too long\n");
            return 1;
        }
        kiln_quantize_params q = {.ftype = ftype, .n_threads = threads};
        s = kiln_convert_hf(dir, tmp, &(kiln_convert_hf_params){KILN_FTYPE_ALL_F32});
        if (!s) s = kiln_quantize_file(tmp, out, &q);
        unlink(tmp);
    }
    if (s) return kiln_cli_die(s);
    kiln_cli_note("wrote %s (%s)", out, kiln_ftype_name(ftype));
    return 0;
}

int kiln_cmd_convert(int argc, char **argv) {
    if (argc >= 1 && strcmp(argv[0], "llama2c") == 0) return convert_llama2c(argc - 1, argv + 1);
    if (argc >= 1 && strcmp(argv[0], "hf") == 0) return convert_hf(argc - 1, argv + 1);
    fprintf(stderr, "kiln: usage: kiln convert llama2c MODEL.bin --tokenizer TOK.bin -o OUT.gguf\n"
                    "       kiln convert hf DIR -o OUT.gguf [--type f32|f16|bf16|q8_0|q4_k_m|...] [-t THREADS]\n");
    return 1;
}
