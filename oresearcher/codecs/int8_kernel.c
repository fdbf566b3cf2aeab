/* Fused per-chunk absmax int8 quantize / dequantize for float32 on CPU.
 *
 * Loaded by oresearcher/codecs/native.py (compiled with -O3 -march=native
 * -ffp-contract=off -fno-math-errno, never -ffast-math). It must give the same bits as
 * the eager torch path in quant.py, which stays as the reference and the fallback:
 *   absmax = max |x|;  inv = fl(127 / absmax);  code = round_half_even(fl(x * inv));
 *   chunks where 127/absmax overflows: code = round_half_even(fl(fl(x / absmax) * 127));
 *   decode = fl((float)code * fl(absmax / 127)), clamped to +-FLT_MAX.
 * The loops are plain C that gcc vectorises; there is no intrinsic and no threading. */
#include <stdint.h>
#include <string.h>
#include <float.h>
#include <math.h>

/* max |x| of a chunk, as the bits of a float. For sign-cleared floats the integer order
 * of the bits is the float order, and any inf or NaN has bits >= 0x7f800000, so one
 * vectorised integer max gives both the scale and the finiteness check. */
static uint32_t absmax_bits(const float *restrict xs, int64_t m) {
    const uint32_t *restrict b = (const uint32_t *)xs;
    uint32_t r = 0;
    for (int64_t i = 0; i < m; ++i) {
        uint32_t v = b[i] & 0x7fffffffu;
        r = v > r ? v : r;
    }
    return r;
}

/* Returns 0, or 1 if x holds a non-finite value (outputs are then undefined). */
int orq_int8_quantize(const float *restrict x, int64_t n, int64_t chunk,
                      float *restrict absmax, int8_t *restrict codes) {
    for (int64_t c0 = 0, c = 0; c0 < n; c0 += chunk, ++c) {
        int64_t m = n - c0 < chunk ? n - c0 : chunk;
        const float *restrict xs = x + c0;
        int8_t *restrict q = codes + c0;
        uint32_t bits = absmax_bits(xs, m);
        if (bits >= 0x7f800000u) return 1;
        float a;
        memcpy(&a, &bits, sizeof a);
        absmax[c] = a;
        float inv = 127.0f / a;
        if (a == 0.0f) {
            memset(q, 0, (size_t)m);
        } else if (isinf(inv)) { /* a tiny: divide first, |x/a| <= 1 cannot overflow */
            for (int64_t i = 0; i < m; ++i) q[i] = (int8_t)__builtin_irintf(xs[i] / a * 127.0f);
        } else {
            for (int64_t i = 0; i < m; ++i) q[i] = (int8_t)__builtin_irintf(xs[i] * inv);
        }
    }
    return 0;
}

void orq_int8_dequantize(const float *restrict absmax, const int8_t *restrict codes,
                         int64_t n, int64_t chunk, float *restrict out) {
    for (int64_t c0 = 0, c = 0; c0 < n; c0 += chunk, ++c) {
        int64_t m = n - c0 < chunk ? n - c0 : chunk;
        float s = absmax[c] / 127.0f;
        const int8_t *restrict q = codes + c0;
        float *restrict o = out + c0;
        for (int64_t i = 0; i < m; ++i) o[i] = (float)q[i] * s;
        if (absmax[c] > FLT_MAX * (1.0f - 0x1p-16f)) /* 127 * fl(a/127) can round to inf */
            for (int64_t i = 0; i < m; ++i) o[i] = o[i] > FLT_MAX ? FLT_MAX : o[i] < -FLT_MAX ? -FLT_MAX : o[i];
    }
}
