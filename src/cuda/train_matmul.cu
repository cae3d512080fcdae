/* train_matmul.cu: the training matmuls, a linear layer's forward y = x W^T and its backward dx = dy W,
 * dW += dy^T x, each one cuBLASLt call on the tensor cores: bf16 operands (the weight's bf16 mirror and the bf16
 * activations and gradients the kernels before write), fp32 accumulation (CUBLAS_COMPUTE_32F, fp32 alpha and
 * beta), an fp32 output (beta = 1 folds in the residual add or the gradient accumulation) or a bf16 one (beta = 0).
 * No kernel of kiln's own: a matmul of 16K rows is compute-bound and cuBLASLt's Hopper kernels are the roofline.
 * tests/test_cuda_train_matmul.c checks every output kind against a double-precision host product of the same
 * bf16 values (NMSE ~1e-10 for fp32 outputs, one bf16 rounding for bf16 ones). */
#include "cuda/train_kernels.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

/* cuBLASLt's workspace: 32 MiB is what NVIDIA recommends for Hopper (split-K and stream-K reductions). */
#define BLAS_WS_BYTES ((size_t)32 << 20)
/* Cached plans. A training step of the 124m config uses 5 weight shapes (qkv, o, gate|up, down, the classifier)
 * times 3 matmuls (forward, dx, dW), some with two output kinds, at the full N and at a last shorter chunk of the
 * classifier: about 40. 64 holds them with room; beyond that slots are replaced round-robin. */
#define BLAS_PLANS 64

/* ---------------------------------------------------------------- row-major to column-major
 * cuBLAS is column-major; kiln is row-major. A row-major (R, C) matrix with row stride C is, byte for byte, the
 * column-major (C, R) matrix with leading dimension C: its transpose. cuBLASLt computes D (m, n) = op(A) (m, k)
 * op(B) (k, n) (+ beta C, C = D here), all column-major. With W (O, I), x (N, I), dy (N, O), y (N, O), dx (N, I),
 * dW (O, I) row-major:
 *
 *   forward  y (N, O) = x W^T      D = y  as (O, N) ld O      m = O, n = N, k = I      "TN"
 *            A = W  as (I, O) ld I, op T: (O, I)      B = x  as (I, N) ld I, op N: (I, N)
 *            D[o, n] = sum_i W[o, i] x[n, i]
 *   dx       dx (N, I) = dy W      D = dx as (I, N) ld I      m = I, n = N, k = O      "NN"
 *            A = W  as (I, O) ld I, op N: (I, O)      B = dy as (O, N) ld O, op N: (O, N)
 *            D[i, n] = sum_o W[o, i] dy[n, o]
 *   dW       dW (O, I) += dy^T x   D = dW as (I, O) ld I      m = I, n = O, k = N      "NT"
 *            A = x  as (I, N) ld I, op N: (I, N)      B = dy as (O, N) ld O, op T: (N, O)
 *            D[i, o] = sum_n x[n, i] dy[n, o]
 *
 * All three forms are supported for bf16 on sm_90 (llm.c drives the same three). C is D's pointer and layout;
 * with beta = 0 cuBLASLt does not read C, so a bf16 output or a non-accumulated f32 output may hold anything
 * (NaN) beforehand.
 *
 * Descriptors and layouts are host-only and cheap, but the heuristic query costs tens of microseconds of host
 * time, as much as a small matmul on the GPU, so each (transposes, m, n, k, leading dimensions, D's type, pointer
 * alignments) gets a plan built once and kept in the handle. The alignments are in the key because the heuristic
 * is told the real ones: a matrix that is a column offset into a packed buffer may be aligned to less than
 * cuBLASLt's assumed 256 bytes, and saying so excludes kernels that would fault. beta is not in the key: it is a
 * runtime scalar that no algorithm depends on. The table is not thread-safe and the workspace is shared: one
 * handle per stream. */

typedef struct blas_key {
    cublasOperation_t ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    bool d_f32;                         /* D (and C) is f32; else bf16 */
    uint32_t align_a, align_b, align_c; /* bytes, powers of two up to 256 */
} blas_key;

typedef struct blas_plan {
    bool used;
    blas_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c; /* c describes both C and D */
    cublasLtMatmulAlgo_t algo;
} blas_plan;

struct kiln_cuda_blas {
    cublasLtHandle_t lt;
    void *ws; /* (BLAS_WS_BYTES) device, cuBLASLt's workspace */
    blas_plan plan[BLAS_PLANS];
    int next;      /* the slot the next new plan replaces once all are used */
    int sm_target; /* > 0: the plans are chosen for this many SMs (another stream runs beside them) */
};

static kiln_status lt_error(cublasStatus_t s, const char *what) {
    return kiln_fail(KILN_ERR_IO, "cuBLASLt %s failed: %s", what, cublasLtGetStatusString(s));
}

/* The largest power of two (up to 256) dividing the address. */
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    a &= ~a + 1; /* lowest set bit */
    return a == 0 || a > 256 ? 256u : (uint32_t)a;
}

static bool key_equal(const blas_key *x, const blas_key *y) {
    return x->ta == y->ta && x->tb == y->tb && x->m == y->m && x->n == y->n && x->k == y->k && x->lda == y->lda &&
           x->ldb == y->ldb && x->ldc == y->ldc && x->d_f32 == y->d_f32 && x->align_a == y->align_a &&
           x->align_b == y->align_b && x->align_c == y->align_c;
}

static void plan_destroy(blas_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

/* Fills p (zeroed but for its key) with descriptors and the heuristic's first algorithm. what names the matmul
 * for the error message. */
static kiln_status plan_build(blas_plan *p, cublasLtHandle_t lt, int sm_target, const char *what) {
    const blas_key *k = &p->key;
    cublasStatus_t s;
    if ((s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &k->ta, sizeof k->ta)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &k->tb, sizeof k->tb)) != CUBLAS_STATUS_SUCCESS ||
        (sm_target > 0 && (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target,
                                                              sizeof sm_target)) != CUBLAS_STATUS_SUCCESS))
        return lt_error(s, "matmul descriptor");
    /* A layout is the stored matrix, before op: op N stores (m, k) / (k, n), op T stores (k, m) / (n, k). */
    const bool at = k->ta == CUBLAS_OP_T, bt = k->tb == CUBLAS_OP_T;
    const uint64_t a_rows = (uint64_t)(at ? k->k : k->m), a_cols = (uint64_t)(at ? k->m : k->k);
    const uint64_t b_rows = (uint64_t)(bt ? k->n : k->k), b_cols = (uint64_t)(bt ? k->k : k->n);
    const cudaDataType_t d_type = k->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
    if ((s = cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, a_rows, a_cols, k->lda)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, b_rows, b_cols, k->ldb)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->c, d_type, (uint64_t)k->m, (uint64_t)k->n, k->ldc)) != CUBLAS_STATUS_SUCCESS)
        return lt_error(s, "matrix layout");
    cublasLtMatmulPreference_t pref = NULL;
    uint64_t max_ws = BLAS_WS_BYTES;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS) return lt_error(s, "matmul preference");
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int n = 0;
    if ((s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align_a, 4)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align_b, 4)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align_c, 4)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align_c, 4)) == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) return lt_error(s, "heuristic query");
    if (s != CUBLAS_STATUS_SUCCESS || n < 1 || res.state != CUBLAS_STATUS_SUCCESS)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: cuBLASLt has no bf16 algorithm for the %s%s matmul m %lld n %lld k %lld (ld %lld, %lld, %lld) into "
                         "%s (alignments A %u, B %u, C/D %u bytes, %zu-byte workspace)",
                         what, at ? "T" : "N", bt ? "T" : "N", (long long)k->m, (long long)k->n, (long long)k->k,
                         (long long)k->lda, (long long)k->ldb, (long long)k->ldc, k->d_f32 ? "f32" : "bf16", k->align_a,
                         k->align_b, k->align_c, BLAS_WS_BYTES);
    p->algo = res.algo;
    return KILN_OK;
}

/* The cached plan for key, building it (and evicting round-robin when full) on a miss. */
static kiln_status plan_get(kiln_cuda_blas *b, const blas_key *key, const char *what, blas_plan **out) {
    int free_slot = -1;
    for (int i = 0; i < BLAS_PLANS; i++) {
        blas_plan *p = &b->plan[i];
        if (!p->used) {
            if (free_slot < 0) free_slot = i;
            continue;
        }
        if (key_equal(&p->key, key)) {
            *out = p;
            return KILN_OK;
        }
    }
    int slot = free_slot;
    if (slot < 0) {
        slot = b->next;
        b->next = (b->next + 1) % BLAS_PLANS;
        plan_destroy(&b->plan[slot]);
    }
    blas_plan *p = &b->plan[slot];
    p->key = *key;
    kiln_status st = plan_build(p, b->lt, b->sm_target, what);
    if (st != KILN_OK) {
        plan_destroy(p);
        return st;
    }
    p->used = true;
    *out = p;
    return KILN_OK;
}

/* One D (m, n) = op(A) op(B) + beta D, everything column-major as in the table above; d_f32 picks D's type. */
static kiln_status matmul(kiln_cuda_blas *b, const char *what, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                          int64_t k, const kiln_bf16_t *A, int64_t lda, const kiln_bf16_t *B, int64_t ldb, void *D, int64_t ldc,
                          bool d_f32, float beta, cudaStream_t stream) {
    blas_key key;
    memset(&key, 0, sizeof key);
    key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc, key.d_f32 = d_f32;
    key.align_a = ptr_align(A), key.align_b = ptr_align(B), key.align_c = ptr_align(D);
    blas_plan *p;
    kiln_status st = plan_get(b, &key, what, &p);
    if (st != KILN_OK) return st;
    const float alpha = 1.0f;
    cublasStatus_t s = cublasLtMatmul(b->lt, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c, &p->algo, b->ws,
                                      BLAS_WS_BYTES, stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return kiln_fail(KILN_ERR_IO, "%s: cuBLASLt matmul (m %lld, n %lld, k %lld) failed: %s", what, (long long)m, (long long)n,
                         (long long)k, cublasLtGetStatusString(s));
    return KILN_OK;
}

/* ---------------------------------------------------------------- the handle */

extern "C" size_t kiln_cuda_blas_bytes(void) { return BLAS_WS_BYTES; }

extern "C" void kiln_cuda_blas_free(kiln_cuda_blas *b) {
    if (!b) return;
    for (int i = 0; i < BLAS_PLANS; i++)
        if (b->plan[i].used) plan_destroy(&b->plan[i]);
    if (b->lt) cublasLtDestroy(b->lt);
    if (b->ws) cudaFree(b->ws);
    free(b);
}

/* Device memory: exactly kiln_cuda_blas_bytes (the workspace); the cuBLASLt handle takes only host memory. */
extern "C" kiln_status kiln_cuda_blas_new(kiln_cuda_blas **out) {
    *out = NULL;
    kiln_cuda_blas *b = (kiln_cuda_blas *)calloc(1, sizeof *b);
    if (!b) return kiln_fail(KILN_ERR_NOMEM, "cuda blas: out of host memory");
    cublasStatus_t s = cublasLtCreate(&b->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        b->lt = NULL;
        kiln_cuda_blas_free(b);
        return lt_error(s, "cublasLtCreate");
    }
    cudaError_t e = cudaMalloc(&b->ws, BLAS_WS_BYTES);
    if (e != cudaSuccess) {
        b->ws = NULL;
        kiln_cuda_blas_free(b);
        return kiln_fail(KILN_ERR_NOMEM, "cuda blas: cudaMalloc of the %zu-byte cuBLASLt workspace failed: %s", BLAS_WS_BYTES,
                         cudaGetErrorString(e));
    }
    *out = b;
    return KILN_OK;
}

/* Plans built from now on are chosen for sms SMs (0: the whole GPU); the ones already built are dropped. */
extern "C" void kiln_cuda_blas_sm_target(kiln_cuda_blas *b, int sms) {
    if (!b) return;
    for (int i = 0; i < BLAS_PLANS; i++)
        if (b->plan[i].used) plan_destroy(&b->plan[i]);
    b->next = 0;
    b->sm_target = sms > 0 ? sms : 0;
}

/* ---------------------------------------------------------------- the linear layer */

/* Shapes of at least 1 and below 2^31 (cuBLASLt's kernels index with 32-bit ints per dimension; the largest
 * product, 16K x 32000 logits, is 2^29). */
static kiln_status check_shape(const char *who, const kiln_cuda_blas *b, int64_t N, int64_t I, int64_t O) {
    if (!b || !b->lt || !b->ws) return kiln_fail(KILN_ERR_INVALID, "%s: the handle was not made by kiln_cuda_blas_new", who);
    if (N < 1 || I < 1 || O < 1 || N > INT32_MAX || I > INT32_MAX || O > INT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "%s: shape N %lld, I %lld, O %lld out of range", who, (long long)N, (long long)I,
                         (long long)O);
    return KILN_OK;
}

/* A pointer must hold at least its element's alignment (cuBLASLt's minimum). */
static kiln_status check_ptr(const char *who, const char *name, const void *p, uint32_t elem_bytes) {
    if (!p) return kiln_fail(KILN_ERR_INVALID, "%s: %s is NULL", who, name);
    if (ptr_align(p) < elem_bytes)
        return kiln_fail(KILN_ERR_INVALID, "%s: %s at %p is not %u-byte aligned", who, name, p, elem_bytes);
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_linear_forward_train(kiln_cuda_blas *b, void *y, bool y_f32, bool accumulate, const kiln_bf16_t *x,
                                                const kiln_bf16_t *W, int64_t N, int64_t I, int64_t O, void *stream) {
    const char *who = "cuda linear forward";
    kiln_status st;
    if ((st = check_shape(who, b, N, I, O)) != KILN_OK) return st;
    if (accumulate && !y_f32) return kiln_fail(KILN_ERR_INVALID, "%s: accumulate needs an f32 output", who);
    if ((st = check_ptr(who, "y", y, y_f32 ? 4 : 2)) != KILN_OK || (st = check_ptr(who, "x", x, 2)) != KILN_OK ||
        (st = check_ptr(who, "W", W, 2)) != KILN_OK)
        return st;
    /* "TN": D = y (O, N) ld O = W (I, O) ld I, op T  times  x (I, N) ld I, op N */
    return matmul(b, who, CUBLAS_OP_T, CUBLAS_OP_N, O, N, I, W, I, x, I, y, O, y_f32, accumulate ? 1.0f : 0.0f,
                  (cudaStream_t)stream);
}

extern "C" kiln_status kiln_cuda_linear_backward(kiln_cuda_blas *b, void *dx, bool dx_f32, bool accumulate, float *dW,
                                                 const kiln_bf16_t *dy, const kiln_bf16_t *x, const kiln_bf16_t *W, int64_t N,
                                                 int64_t I, int64_t O, void *stream) {
    const char *who = "cuda linear backward";
    kiln_status st;
    if ((st = check_shape(who, b, N, I, O)) != KILN_OK) return st;
    if (dx && accumulate && !dx_f32) return kiln_fail(KILN_ERR_INVALID, "%s: accumulate needs an f32 dx", who);
    if (!dx && !dW) return KILN_OK; /* both skipped */
    /* every argument checked before the first launch, so a refused argument changes nothing */
    if ((st = check_ptr(who, "dy", dy, 2)) != KILN_OK) return st;
    if (dx && ((st = check_ptr(who, "dx", dx, dx_f32 ? 4 : 2)) != KILN_OK || (st = check_ptr(who, "W", W, 2)) != KILN_OK)) return st;
    if (dW && ((st = check_ptr(who, "dW", dW, 4)) != KILN_OK || (st = check_ptr(who, "x", x, 2)) != KILN_OK)) return st;
    /* "NN": D = dx (I, N) ld I = W (I, O) ld I, op N  times  dy (O, N) ld O, op N */
    if (dx && (st = matmul(b, "cuda linear backward dx", CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, W, I, dy, O, dx, I, dx_f32,
                           accumulate ? 1.0f : 0.0f, (cudaStream_t)stream)) != KILN_OK)
        return st;
    /* "NT": D = dW (I, O) ld I = x (I, N) ld I, op N  times  dy (O, N) ld O, op T; beta 1: dW accumulates */
    if (dW && (st = matmul(b, "cuda linear backward dW", CUBLAS_OP_N, CUBLAS_OP_T, I, O, N, x, I, dy, O, dW, I, true, 1.0f,
                           (cudaStream_t)stream)) != KILN_OK)
        return st;
    return KILN_OK;
}
