#!/usr/bin/env python3
"""check_blocks_ggml.py: checks tests/test_blocks_ggml.h (the CUDA tests' host dequantizer of Q5_1, Q2_K, Q3_K,
IQ4_NL and IQ4_XS) against the numpy dequantize of the PyPI `gguf` package (llama.cpp's gguf-py), which shares
no code with kiln. It compiles a small C driver against the header, which writes 4096 random blocks of each type
(random bytes, finite f16 scales, tests/test_blocks_ggml.h's test_ggml_fix_scales) and the header's f32 values,
and requires gguf.quants.dequantize of the same bytes to equal them bit for bit.

  python3 tests/ref/check_blocks_ggml.py        # from the repository root; needs cc, numpy and gguf
Prints one line per type and exits 1 on the first difference."""
import os, subprocess, sys, tempfile

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

DRIVER = r'''
#include "test_blocks_ggml.h"
#include <stdio.h>
int main(int argc, char **argv) {
    kiln_type t = (kiln_type)atoi(argv[1]);
    int64_t n = 4096 * kiln_type_block_size(t);
    size_t bytes = kiln_type_row_bytes(t, n);
    uint8_t *buf = malloc(bytes);
    float *y = malloc((size_t)n * 4);
    unsigned long long seed = 0x5eed0000ULL + (unsigned)t;
    for (size_t i = 0; i < bytes; i++) buf[i] = (uint8_t)test_rng_next(&seed);
    test_ggml_fix_scales(t, buf, n, 1.0f, 0.0f, &seed);
    test_ggml_to_float(t, buf, y, n);
    FILE *f = fopen(argv[2], "wb");
    fwrite(buf, 1, bytes, f), fwrite(y, 4, (size_t)n, f);
    return fclose(f) != 0;
}
'''

TYPES = [("q5_1", 7, Q.Q5_1), ("q2_K", 10, Q.Q2_K), ("q3_K", 11, Q.Q3_K), ("iq4_nl", 20, Q.IQ4_NL), ("iq4_xs", 23, Q.IQ4_XS)]
SIZES = {7: (32, 24), 10: (256, 84), 11: (256, 110), 20: (32, 18), 23: (256, 136)}

def main():
    lib = os.environ.get("KILN_BUILD", "build-cpu") + "/libkiln.a"
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "d.c"), os.path.join(tmp, "d")
        open(src, "w").write(DRIVER)
        subprocess.check_call(["cc", "-std=c11", "-D_GNU_SOURCE", "-O1", "-Iinclude", "-Isrc", "-Isrc/core", "-Itests", src,
                               lib, "-lm", "-lpthread", "-o", exe])
        for name, tid, gq in TYPES:
            out = os.path.join(tmp, name)
            subprocess.check_call([exe, str(tid), out])
            blck, bs = SIZES[tid]
            raw = open(out, "rb").read()
            nb = 4096
            blocks = np.frombuffer(raw[: nb * bs], dtype=np.uint8)
            mine = np.frombuffer(raw[nb * bs:], dtype=np.float32)
            ref = dequantize(blocks, gq).astype(np.float32).reshape(-1)
            bad = np.nonzero(mine.view(np.uint32) != ref.view(np.uint32))[0]
            if ref.size != mine.size or bad.size:
                i = int(bad[0]) if bad.size else -1
                print(f"{name}: {bad.size} of {ref.size} values differ; first {i}: header {mine[i]!r} gguf {ref[i]!r}")
                return 1
            print(f"{name}: {ref.size} values equal bit for bit")
    return 0

if __name__ == "__main__":
    sys.exit(main())
