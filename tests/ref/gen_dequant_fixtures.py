#!/usr/bin/env python3
"""gen_dequant_fixtures.py: independent-oracle fixtures for kiln's block formats, made with the numpy code of
the PyPI `gguf` package (llama.cpp's gguf-py), which shares no code with kiln.

Writes two files next to this script:
  dequant_fixtures.gguf  for each type T (kiln's lower-case name, e.g. "q4_K"):
                           T.raw        random raw blocks, stored with their real type, 2 rows x 3 blocks
                                        (F16/BF16: 2 x 64 elements)
                           T.expected   F32, gguf.quants.dequantize(T.raw)
                         and for each type gguf.quants can quantize:
                           T.quant_in   F32, normal random floats (plus a zero block, a constant block and,
                                        for F16/BF16, special values)
                           T.quant_out  T, gguf.quants.quantize(T.quant_in)
                         metadata: kiln.fixture.gguf_version, kiln.fixture.numpy_version, kiln.fixture.seed
  type_sizes.txt         "NAME ID BLCK BYTES" for every GGMLQuantizationType in gguf.constants.GGML_QUANT_SIZES

tests/test_fixtures.c reads both. Regenerate (the outputs are committed; rerunning with the same gguf and
numpy versions reproduces them byte for byte):

  python3 -m venv /tmp/ggvenv && /tmp/ggvenv/bin/pip install 'gguf>=0.17' numpy   # requirements: gguf, numpy
  LLAMA_CPP=/path/to/llama.cpp /tmp/ggvenv/bin/python tests/ref/gen_dequant_fixtures.py   # and a C compiler

(the committed file was made from llama.cpp's tree as vendored in llama-cpp-python 0.3.36.)

Coverage (gguf 0.19.0): dequantize covers every type kiln computes (Q5_0 included, written last) except Q8_1 and Q8_K, which gguf.quants
does not implement (they are activation-only formats), so they are skipped here. quantize covers F16, BF16,
Q4_0, Q4_1, Q8_0 and Q5_1 of kiln's types (also Q5_0/TQ*/MXFP4, which kiln does not produce); the K-quants
and IQ4 have no numpy quantizer. Q2_K, Q3_K, IQ4_NL and IQ4_XS quant_out come from llama.cpp's C quantizers
instead (ggml_quant_oracle.c, with quantize_<type>(..., imatrix = NULL) as llama-quantize calls them).

Choices that keep the oracle unambiguous:
- Raw blocks are random bytes; every f16 scale (d, dmin, m) is overwritten with a finite half of random sign
  and magnitude 2^-10..2^1, except one block with d = 0 and one with a subnormal d, per type.
- F16/BF16 raw values include +-0, subnormals, the largest finite, +-inf and NaNs (quiet and signalling).
  The test compares NaN-aware: any NaN matches any NaN, since F16C conversion quiets signalling NaNs.
- quant_in values are normal(0, 1) floats at a few scales. ggml rounds with roundf (ties away from zero) and
  numpy's port does too, but to rule out a tie ever deciding a byte, the script asserts that no x * (1/d) in
  Q8_0 is an exact half. F16/BF16 quant_in adds ties (round-to-nearest-even), overflow to inf, subnormal and
  underflow cases, and only quiet NaNs (signalling-NaN narrowing differs between numpy and hardware).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240531
ROWS, BLOCKS_PER_ROW, FLOAT_COLS = 2, 3, 64
HERE = os.path.dirname(os.path.abspath(__file__))

# kiln's names (src/core/types.c) for the types fixtured here.
KILN_NAME = {QT.F16: "f16", QT.BF16: "bf16", QT.Q4_0: "q4_0", QT.Q4_1: "q4_1", QT.Q8_0: "q8_0",
             QT.Q8_1: "q8_1", QT.Q4_K: "q4_K", QT.Q5_K: "q5_K", QT.Q6_K: "q6_K", QT.Q8_K: "q8_K", QT.Q5_0: "q5_0",
             QT.Q5_1: "q5_1", QT.Q2_K: "q2_K", QT.Q3_K: "q3_K", QT.IQ4_NL: "iq4_nl", QT.IQ4_XS: "iq4_xs"}
DEQUANT_TYPES = [QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_K, QT.Q8_1]
# Dequantize-only fixtures added later (Q5_0: kiln computes it, never writes it). Drawn after everything above
# from the same generator, so the earlier tensors stay byte for byte what they were.
LATE_DEQUANT_TYPES = [QT.Q5_0]
# The low-bit types kiln computes and writes since, drawn after those (same reason): dequantized by gguf.quants,
# quantized by gguf.quants where it can (Q5_1) and otherwise by llama.cpp's own ggml-quants.c through
# ggml_quant_oracle.c, the path llama-quantize takes without an importance matrix.
LOW_BIT_TYPES = [QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS]
QUANT_TYPES = [QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_K, QT.Q8_1]

# Byte offsets of the f16 scale fields in one block: (offset of d, offsets of other f16 fields).
F16_FIELDS = {
    QT.Q4_0: (0, []), QT.Q4_1: (0, [2]), QT.Q5_0: (0, []), QT.Q8_0: (0, []),
    QT.Q4_K: (0, [2]), QT.Q5_K: (0, [2]), QT.Q6_K: (208, []),
    QT.Q5_1: (0, [2]), QT.Q2_K: (80, [82]), QT.Q3_K: (108, []), QT.IQ4_NL: (0, []), QT.IQ4_XS: (0, []),
}


def supports(fn, qtype):
    """True if gguf.quants implements fn (quantize/dequantize) for qtype."""
    block, size = GGML_QUANT_SIZES[qtype]
    try:
        if fn == "dequantize":
            gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
        else:
            gguf.quants.quantize(np.zeros((1, block), dtype=np.float32), qtype)
        return True
    except NotImplementedError:
        return False


def random_halves(rng, n):
    """n finite halves, random sign, magnitude 2^-10 .. 2^1."""
    mag = np.exp2(rng.uniform(-10, 1, n)).astype(np.float32)
    sign = np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32)
    h = (mag * sign).astype(np.float16)
    assert np.all(np.isfinite(h))
    return h


def raw_blocks(rng, qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    nb = ROWS * BLOCKS_PER_ROW
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    d_off, other = F16_FIELDS[qtype]
    d = random_halves(rng, nb)
    d[1] = 0.0                              # a block with d = 0
    d[4] = np.float16(-3 * 2.0**-24)        # a negative subnormal d
    raw[:, d_off:d_off + 2] = d.view(np.uint8).reshape(nb, 2)
    for off in other:                       # dmin / m
        raw[:, off:off + 2] = random_halves(rng, nb).view(np.uint8).reshape(nb, 2)
    return raw.reshape(ROWS, BLOCKS_PER_ROW * size)


F16_SPECIALS = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
                0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7E55, 0x7C01]
BF16_SPECIALS = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x8080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F,
                 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7FD5, 0x7F81]


def raw_floats(rng, qtype):
    n = ROWS * FLOAT_COLS
    specials = np.array(F16_SPECIALS if qtype == QT.F16 else BF16_SPECIALS, dtype=np.uint16)
    if qtype == QT.F16:
        bits = (rng.standard_normal(n) * 100).astype(np.float16).view(np.uint16)
    else:
        bits = (rng.standard_normal(n).astype(np.float32) * np.float32(1e20)).view(np.uint32) >> 16
        bits = bits.astype(np.uint16)
    bits[rng.permutation(n)[:len(specials)]] = specials
    return bits.reshape(ROWS, FLOAT_COLS).view(np.uint8)


def quant_input(rng, qtype):
    block, _ = GGML_QUANT_SIZES[qtype]
    if block == 1:
        x = (rng.standard_normal(ROWS * FLOAT_COLS) * 10).astype(np.float32)
        if qtype == QT.F16:  # ties (RNE), overflow, subnormal, underflow
            sp = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 65504, 65519.99, 65520, -1e6, 2.0**-24, 2.0**-25,
                  3 * 2.0**-26, 1e-9, -0.0, np.inf, -np.inf]
            sp_bits = [0x7FC00000, 0xFFC12000]
        else:
            sp = [1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.4e38, -3.4e38, 1e-40, -1e-45, -0.0, np.inf, -np.inf]
            sp_bits = [0x7FC00000, 0xFFC12345]
        sp = np.concatenate([np.array(sp, dtype=np.float32), np.array(sp_bits, dtype=np.uint32).view(np.float32)])
        x[rng.permutation(x.size)[:sp.size]] = sp
        return x.reshape(ROWS, FLOAT_COLS)
    nb = ROWS * (BLOCKS_PER_ROW + 1)
    scale = np.exp2(rng.uniform(-6, 4, nb)).astype(np.float32)[:, None]
    x = rng.standard_normal((nb, block)).astype(np.float32) * scale
    x[2] = 0.0                             # all-zero block: d = 0
    x[5] = np.float32(0.375)               # constant block
    if qtype == QT.Q8_0:                   # no roundf tie may decide a byte
        d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide="ignore"):
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        v = np.abs(x * inv)
        assert not np.any(v - np.floor(v) == 0.5), "Q8_0 quant_in has an exact tie; change SEED"
    return x.reshape(ROWS, -1)


def add_dequant(w, rng, qt, done_d, skipped):
    """Writes NAME.raw and gguf's dequantization NAME.expected for qtype qt."""
    name = KILN_NAME[qt]
    if not supports("dequantize", qt):
        skipped.append(f"dequantize {qt.name}")
        return
    raw = raw_floats(rng, qt) if qt in (QT.F16, QT.BF16) else raw_blocks(rng, qt)
    exp = gguf.quants.dequantize(raw, qt).astype(np.float32, copy=False)
    w.add_tensor(f"{name}.raw", raw, raw_dtype=qt)
    w.add_tensor(f"{name}.expected", np.ascontiguousarray(exp))
    done_d.append(qt.name)


def ggml_oracle():
    """Builds ggml_quant_oracle (this folder's driver, linked with llama.cpp's unmodified ggml-quants.c from the
    source tree named by $LLAMA_CPP) once; returns its path. ISO C11 without FMA contraction, as kiln builds."""
    root = os.environ.get("LLAMA_CPP")
    if not root:
        sys.exit("set LLAMA_CPP to a llama.cpp source tree (its ggml/src/ggml-quants.c is the Q2_K/Q3_K/IQ4 oracle)")
    ggml = os.path.join(root, "ggml")
    exe = os.path.join(tempfile.mkdtemp(), "ggml_quant_oracle")
    subprocess.run(["cc", "-std=c11", "-O1", "-DNDEBUG", "-D_GNU_SOURCE", "-I", os.path.join(ggml, "include"),
                    "-I", os.path.join(ggml, "src"), os.path.join(HERE, "ggml_quant_oracle.c"),
                    os.path.join(ggml, "src", "ggml-quants.c"), "-lm", "-o", exe], check=True)
    return exe


def oracle_quantize(exe, x, qt):
    """llama.cpp's quantization of x (rows of floats) to qt, as uint8 rows."""
    out = subprocess.run([exe, KILN_NAME[qt], str(x.shape[1])], input=np.ascontiguousarray(x).tobytes(),
                         stdout=subprocess.PIPE, check=True).stdout
    return np.frombuffer(out, dtype=np.uint8).reshape(x.shape[0], -1)


def main():
    rng = np.random.default_rng(SEED)
    path = os.path.join(HERE, "dequant_fixtures.gguf")
    w = gguf.GGUFWriter(path, "kiln-fixture")
    w.add_string("kiln.fixture.gguf_version", gguf.__version__ if hasattr(gguf, "__version__") else
                 __import__("importlib.metadata").metadata.version("gguf"))
    w.add_string("kiln.fixture.numpy_version", np.__version__)
    w.add_uint32("kiln.fixture.seed", SEED)
    done_d, done_q, skipped = [], [], []

    for qt in DEQUANT_TYPES:
        add_dequant(w, rng, qt, done_d, skipped)

    for qt in QUANT_TYPES:
        name = KILN_NAME[qt]
        if not supports("quantize", qt):
            skipped.append(f"quantize {qt.name}")
            continue
        x = quant_input(rng, qt)
        with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN inputs to F16/BF16 are intended
            q = gguf.quants.quantize(x, qt)
        w.add_tensor(f"{name}.quant_in", x)
        w.add_tensor(f"{name}.quant_out", np.ascontiguousarray(q).view(np.uint8), raw_dtype=qt)
        done_q.append(qt.name)

    for qt in LATE_DEQUANT_TYPES:
        add_dequant(w, rng, qt, done_d, skipped)

    exe = ggml_oracle()
    for qt in LOW_BIT_TYPES:
        add_dequant(w, rng, qt, done_d, skipped)
        x = quant_input(rng, qt)
        if supports("quantize", qt):
            q = np.ascontiguousarray(gguf.quants.quantize(x, qt)).view(np.uint8)
            done_q.append(qt.name)
        else:
            q = oracle_quantize(exe, x, qt)
            done_q.append(qt.name + "(ggml-quants.c)")
        w.add_tensor(f"{KILN_NAME[qt]}.quant_in", x)
        w.add_tensor(f"{KILN_NAME[qt]}.quant_out", q, raw_dtype=qt)

    w.add_array("kiln.fixture.dequantize_types", done_d)
    w.add_array("kiln.fixture.quantize_types", done_q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    with open(os.path.join(HERE, "type_sizes.txt"), "w") as f:
        for qt, (blck, size) in sorted(GGML_QUANT_SIZES.items(), key=lambda kv: int(kv[0])):
            f.write(f"{qt.name} {int(qt)} {blck} {size}\n")

    print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)
    print(f"dequantize: {' '.join(done_d)}", file=sys.stderr)
    print(f"quantize:   {' '.join(done_q)}", file=sys.stderr)
    print(f"skipped (not implemented in gguf.quants): {', '.join(skipped)}", file=sys.stderr)


if __name__ == "__main__":
    main()
