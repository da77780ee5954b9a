/* af_math.h -- vectorisable fp32 math for autofusion's generated CPU kernels.
 *
 * Why this header exists
 * ----------------------
 * Generated kernels are built with `-O3 -march=native -fopenmp -fno-math-errno -fno-trapping-math
 * -ffp-contract=off` (fused multiply-adds only where this header writes AF__FMA) but
 * deliberately without -ffast-math (it would change NaN/inf/signed-zero behaviour and allow reassociation,
 * so results would stop matching eager PyTorch).  Without -ffast-math GCC does not map expf/logf/tanhf/erff/
 * sinf... onto a vector math library (libmvec): every element becomes a scalar call into libm, and a loop
 * that calls libm cannot be vectorised.  So every function here is a `static inline` scalar function made
 * only of +, -, *, /, sqrt, compares, selects (ternaries on values that are both computed) and 32-bit
 * integer bit manipulation (bit casts through memcpy).  No libm call, no lookup table but one (tables turn into
 * gathers; sin/cos need one for huge arguments), no data-dependent branch.  Inlined into a `#pragma omp simd` loop, GCC vectorises all of them
 * (tests/codegen/test_af_math.py compiles such loops with -fopt-info-vec-optimized and checks that each
 * one is reported "loop vectorized", and that the library has no undefined libm symbol).
 *
 * Approach
 * --------
 * exp/exp2/expm1: Cody-Waite reduction x = n*ln2 + r (n from the 1.5*2^23 "magic number" rounding trick,
 *   ln2 split so n*ln2_hi is exact), a near-minimax polynomial for e^r on |r| <= ln2/2 (degree 6 in Horner
 *   form where e^r is wanted, degree 7 as r + r^2 P(r) where e^r - 1 is), and scaling by 2^n in two exact
 *   steps (2^(n/2) * 2^(n-n/2)) so that overflow gives inf and underflow rounds once, correctly, into the
 *   subnormal range (exp_nonpos, sigmoid, silu: one exact step to 2^(n+64), one rounding by 2^-64).
 * log/log2/log1p: x = 2^k * m with m in [sqrt(1/2), sqrt(2)) by integer arithmetic on the bits (subnormals
 *   are pre-scaled by 2^23), log(m) = f - f^2/2 + f^3 P(f) with f = m - 1 exact; log1p uses Goldberg's
 *   log(u) * x / (u - 1) correction, u = 1 + x.
 * tanh = expm1(2|x|) / (expm1(2|x|) + 2) with the sign put back; sigmoid = {1 or e}/(1 + e), e = exp(-|x|),
 *   so neither cancels nor overflows; silu = x * sigmoid(x) in the same form;
 *   gelu_tanh = x * sigmoid(2*inner) (equal to 0.5*x*(1 + tanh(inner)), without the cancellation at x < 0).
 * erf: |x| < 0.875: x + x*H(x^2); otherwise 1 - erfc(|x|), erfc(t) = u * exp(-t^2 + P(u)), u = 1/(1 + t),
 *   with -t^2 carried as an exact hi + lo pair (Dekker split) into the exp reduction, so erfc keeps its
 *   relative accuracy even where t^2 is large.  gelu (erf form) has one path for every |x|: 0.5 |x| erfc as
 *   exp(-x^2/2) q R(q), q = |x|/(1 + 0.34|x|), hi + lo from x*x and its fused residual; x - 0.5 x erfc for
 *   x >= 0, 0.5 x erfc for x < 0, so its tail keeps full relative accuracy instead of the cancellation in
 *   1 + erf(x/sqrt(2)).
 *   gelu_tanh forms -|2*inner| as a float pair hi + lo (Dekker products) for the same reason.
 *   af_erfc (erfc computed as 1 - erf loses all accuracy for x > 1) shares the erfc core.
 * sin/cos: Cody-Waite reduction by pi/2 in four parts (three of <= 8 bits, so j*part is exact for
 *   |j| < 2^16) below 2^16, a table-driven (Payne-Hanek) reduction in double above, minimax polynomials for
 *   sin and cos on [-pi/4, pi/4], quadrant fixed with selects and a sign-bit xor.  The table is the one
 *   lookup in this header (a gather): without it sin(3e38) would be meaningless.
 * pow: x^n for a literal integer n and x^(n/2) (kernel lowering passes the literal) by binary powering in
 *   double, unrolled into selects that fold away (and one sqrt), one rounding to float; any other exponent
 *   as 2^(y log2|x|) with log2 (atanh series) and exp2 (Taylor) in double, C99's special values by selects.
 *   Double vectors are half as wide, but these need no table and no libm: the loops stay vectorised.
 * Half types: fp16 rounding by one float add of a power of two that puts the fp16 spacing at the float's
 *   last bit, bf16 rounding and both decodings by integer bit manipulation; round to nearest even.
 *   af_round_f16/af_round_bf16 round a float to the half type and back (casts that stay in registers);
 *   af_f16_bits/af_bf16_bits encode a value that is already of the half type (no rounding left).
 * float -> int: truncation with x86's result for NaN and out-of-range values, without undefined behaviour.
 *
 * Polynomial coefficients are near-minimax fits (Lawson's iteration in float64 against mpmath) rounded to
 * float32; they are written as hex floats so the value in the binary is exactly the one that was measured.
 *
 * Error bounds: each function's comment gives the largest error measured against float64 references
 * (torch/numpy): by tests/codegen/test_af_math.py over ~1M points per function plus special values, and
 * once over every float32 input in the function's non-trivial range (all positive floats for log, log2,
 * rsqrt); the test asserts the "asserted" bound.  "ulp": distance in float32 bit patterns from the
 * correctly rounded result.  "rel": |y - ref| / |ref|, for every normal result, including the ones near
 * zeros and in tails that decay to 0 (those are computed without cancellation); subnormal results are
 * within one subnormal step (2^-149) of the reference.  "abs": |y - ref|.  The measured figures were taken
 * with GCC 12 -O3 -march=native, both with FMA contraction everywhere and with none (the larger of the two
 * is given; they differ by < 10%): the exactness arguments below do not depend on FMA.  Kernels are built
 * with -ffp-contract=off, and this header fuses exactly where it writes AF__FMA (Horner steps, reductions);
 * the test checks the asserted bounds with those flags.
 *
 * Special values: NaN in -> NaN out everywhere (the payload is not guaranteed); exp(+inf)=inf, exp(-inf)=0,
 * overflow -> inf, underflow -> 0 via correctly rounded subnormals; log(0)=-inf, log(x<0)=NaN, log(inf)=inf;
 * tanh and erf saturate to exactly +-1, sigmoid to exactly 0 and 1; odd functions keep the sign of zero.
 * gelu/gelu_tanh/silu of -inf are NaN, as in PyTorch (they are x * (something that is 0 at -inf)).
 *
 * Valid C99 and C++ for GCC (Clang has the same builtins; not tested here); includes only <stdint.h>, and
 * <immintrin.h> where the build may use F16C (the staged fp16 loads and stores).
 */
#ifndef AUTOFUSION_AF_MATH_H
#define AUTOFUSION_AF_MATH_H

#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define AF_INLINE static inline __attribute__((always_inline))
#else
#define AF_INLINE static inline
#endif

/* ---------------------------------------------------------------- bit casts and small helpers */

AF_INLINE uint32_t af__f2u(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    return u;
}

AF_INLINE float af__u2f(uint32_t u) {
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

/* a * b + c with one rounding where the target has FMA (every x86-64 since Haswell).  Kernels are built
 * with -ffp-contract=off, so that the arithmetic of the IR ops rounds after every op as eager does; the
 * polynomials here ask for the fused multiply-add explicitly instead (their error bounds hold either way). */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define AF__FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#define AF__FMAD(a, b, c) __builtin_fma((a), (b), (c))
#else
#define AF__FMA(a, b, c) ((a) * (b) + (c))
#define AF__FMAD(a, b, c) ((a) * (b) + (c))
#endif

#define AF__INF (__builtin_inff())
#define AF__NAN (__builtin_nanf(""))
/* 1.5 * 2^23: (v + AF__MAGIC) - AF__MAGIC rounds v (|v| < 2^22) to the nearest integer, and the low bits of
 * v + AF__MAGIC hold that integer, so no float->int conversion (undefined for NaN) is ever needed. */
#define AF__MAGIC 0x1.8p23f
#define AF__MAGIC_BITS 0x4B400000u
#define AF__LOG2E 0x1.715476p+0f
/* ln2 = AF__LN2_HI + AF__LN2_LO; AF__LN2_HI has 15 significant bits: n * AF__LN2_HI is exact for |n| < 512 */
#define AF__LN2_HI 0x1.62e4p-1f
#define AF__LN2_LO 0x1.7f7d1cp-20f

/* a with the sign bit of s */
AF_INLINE float af__copysign(float a, float s) {
    return af__u2f((af__f2u(a) & 0x7fffffffu) | (af__f2u(s) & 0x80000000u));
}

/* 2^n for n in [-126, 127] */
AF_INLINE float af__pow2i(int32_t n) { return af__u2f((uint32_t)(n + 127) << 23); }

/* p * 2^n for n in [-252, 254], rounding once (into the subnormal range or to inf where the result goes) */
AF_INLINE float af__scale(float p, int32_t n) {
    int32_t n1 = n >> 1; /* arithmetic shift: floor(n/2) */
    int32_t n2 = n - n1;
    return (p * af__pow2i(n1)) * af__pow2i(n2);
}

/* e^r - 1 - r = r^2 * P(r) on |r| <= 0.3466 (ln2/2 plus margin); relative error of 1 + r + r^2 P(r)
 * against e^r: 5.3e-11 before rounding. */
AF_INLINE float af__expm1_poly(float r) {
    float p = 0x1.9f077cp-13f;
    p = AF__FMA(p, r, 0x1.6d8e6ep-10f);
    p = AF__FMA(p, r, 0x1.111274p-7f);
    p = AF__FMA(p, r, 0x1.55548cp-5f);
    p = AF__FMA(p, r, 0x1.555554p-3f);
    p = AF__FMA(p, r, 0x1p-1f);
    return AF__FMA(p, r * r, r);
}

/* e^r on |r| <= 0.3466 in Horner form, 1 + r (c1 + r (c2 + ...)), degree 6: six fused multiply-adds against
 * af__expm1_poly's eight operations (for callers that want e^r, not e^r - 1).  Relative error 2.0e-9 before
 * rounding; evaluated in float, 0.87 ulp at most (every float r in the interval). */
AF_INLINE float af__exp_poly(float r) {
    float p = 0x1.6af7dcp-10f;
    p = AF__FMA(p, r, 0x1.126740p-7f);
    p = AF__FMA(p, r, 0x1.55580cp-5f);
    p = AF__FMA(p, r, 0x1.55541ap-3f);
    p = AF__FMA(p, r, 0x1.fffffcp-2f);
    p = AF__FMA(p, r, 1.0f);
    return AF__FMA(p, r, 1.0f);
}

/* 2^-64 * af__exp_poly(r), bit for bit: every coefficient is scaled by 2^-64, and each Horner value stays
 * within [2^-74, 2^-63] (far above the normal minimum), where scaling by a power of two commutes with the
 * rounding of each multiply-add.  A caller that forms p * 2^(n+64) * 2^-64 then needs one multiplication, not
 * two (af_exp_nonpos: the multiplies and multiply-adds share two of the four vector pipes on Zen 4/5). */
AF_INLINE float af__exp_poly_s64(float r) {
    float p = 0x1.6af7dcp-74f;
    p = AF__FMA(p, r, 0x1.126740p-71f);
    p = AF__FMA(p, r, 0x1.55580cp-69f);
    p = AF__FMA(p, r, 0x1.55541ap-67f);
    p = AF__FMA(p, r, 0x1.fffffcp-66f);
    p = AF__FMA(p, r, 0x1p-64f);
    return AF__FMA(p, r, 0x1p-64f);
}

/* 1.5 * 2^23 + 191: rounding with this magic number leaves n + 191 in the low 9 bits of t (the bits of
 * 1.5 * 2^23 have none there), so t's bits shifted left by 23 are the float 2^(n + 64) for n in [-191, 0]:
 * one shift instead of a subtract, an add and a shift. */
#define AF__MAGIC_S64 0x1.80017ep23f

/* exp(hi + lo) = p * 2^n, p in [0.7, 1.42], for hi in [-110, 89] (clamped here) and |lo| <= 2.
 * hi - n*ln2_hi is exact for any float hi in that range, and lo joins the reduced argument without losing its
 * low bits, so the result is as accurate as hi + lo is, not as accurate as its float32 rounding: erfc gets
 * exp(-t^2) this way with -t^2 = hi + lo, and gelu_tanh its exp(-2 * inner).  Returning p and n separately
 * lets callers form m * exp(...) as af__scale(p * m, n): one rounding, even when the result is subnormal. */
AF_INLINE float af__exp_hilo_parts(float hi, float lo, int32_t *n) {
    hi = hi > 89.0f ? 89.0f : hi;
    hi = hi < -110.0f ? -110.0f : hi;
    float t = AF__FMA((hi + lo), AF__LOG2E, AF__MAGIC);
    float nf = t - AF__MAGIC;
    *n = (int32_t)(af__f2u(t) - AF__MAGIC_BITS);
    float r = AF__FMA(-nf, AF__LN2_HI, hi);
    r = r + lo;
    r = AF__FMA(-nf, AF__LN2_LO, r);
    return af__exp_poly(r);
}

/* e^x = p * 2^n for x in [-110, 89] (clamped here; a NaN fails both compares and flows through as NaN).
 * exp(-110) * 2 still rounds to 0, so callers may multiply by m with |m| <= 2 before scaling. */
AF_INLINE float af__exp_parts(float x, int32_t *n) {
    float xc = x > 89.0f ? 89.0f : x;
    xc = xc < -110.0f ? -110.0f : xc;
    float t = AF__FMA(xc, AF__LOG2E, AF__MAGIC);
    float nf = t - AF__MAGIC;
    *n = (int32_t)(af__f2u(t) - AF__MAGIC_BITS);
    float r = AF__FMA(-nf, AF__LN2_HI, xc); /* exact */
    r = AF__FMA(-nf, AF__LN2_LO, r);
    return af__exp_poly(r);
}

/* ---------------------------------------------------------------- exponentials */

/* e^x.  Max error measured: 1 ulp (every float in [-104, 89], subnormal results included); asserted <= 2 ulp.
 * exp(x > 88.7228) = inf, exp(x < -103.98) = 0, exp(-inf) = 0, exp(+inf) = inf, exp(NaN) = NaN. */
AF_INLINE float af_exp(float x) {
    int32_t n;
    float p = af__exp_parts(x, &n);
    return af__scale(p, n);
}

/* e^x for x <= 0 or NaN only (callers guarantee it: softmax's exp(x - max(x)), where the planner proves the
 * sign).  Same reduction and polynomial as af_exp, but one clamp instead of two and a cheaper scaling:
 * n + 64 stays in the normal exponent range for every n this domain gives (n >= -150), so p * 2^(n+64) is
 * exact and the one multiplication by 2^-64 rounds once, into the subnormal range where the result goes.
 * About 13 vector operations (six multiply-adds, one shift for 2^(n+64) through AF__MAGIC_S64, one
 * multiplication) against af_exp's 24.  Max error measured: 1 ulp (every float in [-104, 0], subnormal results
 * included); asserted <= 2 ulp.  exp(x < -103.98) = 0, exp(-inf) = 0, exp(+-0) = 1, exp(NaN) = NaN. */
AF_INLINE float af_exp_nonpos(float x) {
    /* No clamp: below -104 (and at -inf) the lanes compute garbage that the final select replaces by the
     * exact answer, 0 (one compare and a masked result instead of a clamp before the chain). */
    float t = AF__FMA(x, AF__LOG2E, AF__MAGIC_S64);
    float nf = t - AF__MAGIC_S64;
    uint32_t scale = af__f2u(t) << 23; /* 2^(n+64) */
    float r = AF__FMA(-nf, AF__LN2_HI, x); /* exact */
    r = AF__FMA(-nf, AF__LN2_LO, r);
    /* (p * 2^-64) * 2^(n+64): p * 2^-64 is exact (af__exp_poly_s64), so the one multiplication rounds once,
     * as (p * 2^(n+64)) * 2^-64 did with two (the same bits for every x <= 0 and NaN, checked exhaustively) */
    float res = af__exp_poly_s64(r) * af__u2f(scale);
    return x < -104.0f ? 0.0f : res; /* a NaN fails the compare and flows through */
}

/* 2^x.  Max error measured: 1 ulp (every float in [-151, 129]); asserted <= 2 ulp.  Exact for integer x. */
AF_INLINE float af_exp2(float x) {
    float xc = x > 129.0f ? 129.0f : x;
    xc = xc < -151.0f ? -151.0f : xc;
    float t = xc + AF__MAGIC;
    float nf = t - AF__MAGIC;
    int32_t n = (int32_t)(af__f2u(t) - AF__MAGIC_BITS);
    float f = xc - nf; /* exact, |f| <= 1/2 */
    float r = f * 0x1.62e430p-1f; /* f * ln2: one rounding, relative 2^-24 of |r| <= 0.35 */
    float p = af__expm1_poly(r) + 1.0f;
    return af__scale(p, n);
}

/* e^x - 1.  Max relative error measured: 1.21e-7 (about 1 ulp); asserted <= 3e-7.
 * expm1(x > 88.7228) = inf, expm1(x < -17.3) = -1, expm1(+-0) = +-0, tiny x returns x. */
AF_INLINE float af_expm1(float x) {
    float xc = x > 89.0f ? 89.0f : x;
    xc = xc < -30.0f ? -30.0f : xc;
    float t = AF__FMA(xc, AF__LOG2E, AF__MAGIC);
    float nf = t - AF__MAGIC;
    int32_t n = (int32_t)(af__f2u(t) - AF__MAGIC_BITS);
    float r = AF__FMA(-nf, AF__LN2_HI, xc);
    r = AF__FMA(-nf, AF__LN2_LO, r);
    float q = af__expm1_poly(r);
    /* 2^n (1 + q) - 1 = 2 * ((2^(n-1) - 1/2) + 2^(n-1) q): 2^(n-1) is normal for n in [-43, 128] and the
     * final doubling overflows to inf exactly when the result does; for n = 0 it gives q exactly. */
    float h = af__pow2i(n - 1);
    float res = 2.0f * ((h - 0.5f) + h * q);
    return __builtin_fabsf(x) < 0x1p-25f ? x : res;
}

/* ---------------------------------------------------------------- logarithms */

/* log(1 + f) - f + f^2/2 = f^3 P(f) on [sqrt(1/2) - 1, sqrt(2) - 1]; relative error 7.5e-10 unrounded */
AF_INLINE float af__log_poly(float f) {
    float p = 0x1.14631ep-4f;
    p = AF__FMA(p, f, -0x1.de4faep-4f);
    p = AF__FMA(p, f, 0x1.e6f60ap-4f);
    p = AF__FMA(p, f, -0x1.fc1f6ap-4f);
    p = AF__FMA(p, f, 0x1.2336e2p-3f);
    p = AF__FMA(p, f, -0x1.555c5ap-3f);
    p = AF__FMA(p, f, 0x1.99a4bcp-3f);
    p = AF__FMA(p, f, -0x1.000006p-2f);
    p = AF__FMA(p, f, 0x1.555548p-2f);
    return p;
}

/* Splits x > 0 (subnormals included) into 2^k * (1 + f), 1 + f in [sqrt(1/2), sqrt(2)); f is exact. */
AF_INLINE float af__log_split(float x, float *kf) {
    int is_sub = x < 0x1p-126f;
    float xs = is_sub ? x * 0x1p23f : x;
    uint32_t ix = af__f2u(xs);
    uint32_t tmp = ix - 0x3f3504f3u; /* bits of (float)sqrt(1/2) */
    int32_t k = ((int32_t)tmp >> 23) - (is_sub ? 23 : 0);
    float m = af__u2f(ix - (tmp & 0xff800000u));
    *kf = (float)k;
    return m - 1.0f;
}

/* x <= 0, inf and NaN: log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, log(NaN) = NaN. */
AF_INLINE float af__log_special(float x, float res) {
    res = x == AF__INF ? x : res;
    return x > 0.0f ? res : (x == 0.0f ? -AF__INF : AF__NAN);
}

/* natural log.  Max error measured: 1 ulp (every positive float, subnormals included); asserted <= 2 ulp. */
AF_INLINE float af_log(float x) {
    float kf;
    float f = af__log_split(x, &kf);
    float z = f * f;
    float y = f * z * af__log_poly(f);
    y = AF__FMA(kf, AF__LN2_LO, y);
    y = AF__FMA(-0.5f, z, y);
    float res = f + y;
    res = AF__FMA(kf, AF__LN2_HI, res); /* exact product, |k| <= 149 */
    return af__log_special(x, res);
}

/* log base 2.  Max error measured: 1 ulp (every positive float); asserted <= 2 ulp.  Exact at powers of 2. */
AF_INLINE float af_log2(float x) {
    float kf;
    float f = af__log_split(x, &kf);
    float z = f * f;
    float y = AF__FMA(f * z, af__log_poly(f), -0.5f * z); /* log(1 + f) - f */
    /* (f + y) * log2(e) as f + y + (f + y) * (log2(e) - 1): keeps the big term unmultiplied */
    const float l2ea = 0x1.c551dap-2f;
    float res = y * l2ea;
    res = AF__FMA(f, l2ea, res);
    res = res + y;
    res = res + f;
    res = res + kf;
    return af__log_special(x, res);
}

/* log(1 + x).  Max relative error measured: 1.82e-7 (every float > -1); asserted <= 4e-7.
 * log1p(-1) = -inf, log1p(x < -1) = NaN, log1p(inf) = inf, log1p(+-0) = +-0. */
AF_INLINE float af_log1p(float x) {
    float u = 1.0f + x;
    float d = u - 1.0f; /* exact */
    float res = af_log(u) * (x / d); /* Goldberg: the ratio corrects for the rounding of 1 + x */
    res = d == 0.0f ? x : res;
    return x == AF__INF ? x : res;
}

/* ---------------------------------------------------------------- powers */

/* b^m for m <= 127 by binary powering in double, written out bit by bit with selects (no loop: GCC does not
 * always unroll one before vectorising, and a loop left inside the simd loop keeps it scalar).  Where kernels
 * call it, m is a literal (the exponent of x ** 3, say), so the selects fold and what is left is at most
 * 2 * log2(m) multiplies.  Each multiply rounds at 2^-53, so the product is within m * 2^-53 of b^m: the
 * float rounding that follows is the one that matters.  Double has the range for every float power: a
 * result that overflows (underflows) double overflows (underflows) float too. */
AF_INLINE double af__powi_d(double b, uint32_t m) {
    double r = (m & 1u) ? b : 1.0;
#define AF__POWI_STEP(bit)              \
    b = b * b;                          \
    r = (m & (bit)) ? r * b : r;
    AF__POWI_STEP(2u)
    AF__POWI_STEP(4u)
    AF__POWI_STEP(8u)
    AF__POWI_STEP(16u)
    AF__POWI_STEP(32u)
    AF__POWI_STEP(64u)
#undef AF__POWI_STEP
    return r;
}

/* x^n for an integer n with |n| <= 127 (a literal where kernels use it): multiplies in double, then one
 * rounding to float.  Max error: 0.5 ulp plus |n| * 2^-53 relative (measured: 0.5 ulp, i.e. correctly
 * rounded on the sweep); asserted <= 1 ulp.  Special values as C's pow: x^0 = 1 (NaN too), signed zeros
 * and infinities by the parity of n (pow(-0, -3) = -inf, pow(-inf, 2) = inf), NaN stays NaN. */
AF_INLINE float af_powi(float x, int32_t n) {
    double r = af__powi_d((double)x, (uint32_t)(n < 0 ? -n : n));
    return (float)(n < 0 ? 1.0 / r : r);
}

/* x^(k2/2) for an odd k2 with |k2| <= 255 (a literal: x ** 1.5 is af_pow_half(x, 3)): x^m * sqrt(x) in
 * double, m = (|k2| - 1) / 2, one rounding to float.  Max error: as af_powi (sqrt in double is correctly
 * rounded); asserted <= 1 ulp.  Special values as C's pow for a non-integer exponent: x < 0 gives NaN,
 * pow(-0, y) = +0 (y > 0) or +inf (y < 0), pow(-inf, y) = +inf (y > 0) or +0 (y < 0). */
AF_INLINE float af_pow_half(float x, int32_t k2) {
    double b = (double)x + 0.0; /* -0 + 0 = +0: sqrt(-0) would keep the sign that pow drops */
    double r = af__powi_d(b, (uint32_t)(k2 < 0 ? -k2 : k2) >> 1) * __builtin_sqrt(b);
    float res = (float)(k2 < 0 ? 1.0 / r : r);
    return x == -AF__INF ? (k2 < 0 ? 0.0f : AF__INF) : res; /* sqrt(-inf) is NaN, pow(-inf, y) is not */
}

/* log2(x) in double for finite x > 0 (subnormals included): x = 2^k (1 + f) with f exact (af__log_split),
 * log(1 + f) = 2 atanh(s), s = f / (2 + f), |s| <= 0.1716, by its series to s^13 (the terms left out are
 * below 1.5e-12 of the sum; k is exact, so the error is 1.5e-12 of log2(1 + f), at most 0.5). */
AF_INLINE double af__log2_d(float x) {
    float kf;
    double f = (double)af__log_split(x, &kf);
    double s = f / (2.0 + f);
    double z = s * s;
    double p = 1.0 / 13.0;
    p = AF__FMAD(p, z, 1.0 / 11.0);
    p = AF__FMAD(p, z, 1.0 / 9.0);
    p = AF__FMAD(p, z, 1.0 / 7.0);
    p = AF__FMAD(p, z, 1.0 / 5.0);
    p = AF__FMAD(p, z, 1.0 / 3.0);
    double ln = AF__FMAD(2.0 * s * z, p, 2.0 * s);
    return AF__FMAD(ln, 0x1.71547652b82fep+0, (double)kf); /* k + log(1 + f) * log2(e) */
}

/* 2^w in double for w in [-200, 200] (clamped here; NaN flows through), relative error below 2.1e-10
 * (1/300 of a float ulp): w = n + r, |r| <= 1/2, 2^r = e^(r ln2) by its Taylor series to degree 8 (the
 * terms left out are below 2.1e-10), times 2^n built in the exponent bits. */
AF_INLINE double af__exp2_d(double w) {
    w = w > 200.0 ? 200.0 : w;
    w = w < -200.0 ? -200.0 : w;
    double t = w + 0x1.8p52;
    double nd = t - 0x1.8p52;
    uint64_t tb;
    __builtin_memcpy(&tb, &t, sizeof tb);
    uint64_t sb = (tb - 0x4338000000000000ull + 1023u) << 52; /* 2^n; n in [-200, 200] */
    double q = (w - nd) * 0x1.62e42fefa39efp-1; /* w - nd is exact */
    double p = 1.0 / 40320.0;
    p = AF__FMAD(p, q, 1.0 / 5040.0);
    p = AF__FMAD(p, q, 1.0 / 720.0);
    p = AF__FMAD(p, q, 1.0 / 120.0);
    p = AF__FMAD(p, q, 1.0 / 24.0);
    p = AF__FMAD(p, q, 1.0 / 6.0);
    p = AF__FMAD(p, q, 0.5);
    p = AF__FMAD(p, q, 1.0);
    p = AF__FMAD(p, q, 1.0);
    double scale;
    __builtin_memcpy(&scale, &sb, sizeof scale);
    return p * scale;
}

/* x^y (C's pow, the exponent in double): 2^(y log2|x|) in double, the sign and the special cases by selects.
 * y * log2|x| is within 2.5e-10 absolute of the exact product wherever the result is a finite nonzero float
 * (|y log2|x|| < 150; log2(1 + f) <= 0.5 carries the error), and 2^w is within 2.1e-10 relative, so the
 * result is within 0.5 ulp + 5e-10 relative (0.008 ulp) before the one float rounding.
 * Special values as C99 Annex F: pow(x, +-0) = 1 and pow(1, y) = 1 (NaN too); x < 0 with a non-integer y
 * gives NaN; signed zeros and infinities by the parity of y; pow(-1, +-inf) = 1; |x| < 1 or > 1 decides
 * pow(x, +-inf).  Kernels call af_pow (eager's vectorised kernel raises a float tensor to a Python float
 * exponent rounded to float: x ** 1.7 is x ** 1.7f); af_pow_d serves callers that have y in double. */
AF_INLINE float af_pow_d(float x, double y) {
    float ax = __builtin_fabsf(x);
    double l = af__log2_d(ax);
    l = ax == 0.0f ? -(double)AF__INF : l;
    l = ax == AF__INF ? (double)AF__INF : l;
    double w = y * l;
    w = ax == 1.0f ? 0.0 : w; /* pow(-1, +-inf) = 1: inf * 0 would be NaN */
    float r = (float)af__exp2_d(w);
    double half = y * 0.5; /* exact: an integer y is even exactly when y / 2 is an integer */
    int y_int = __builtin_trunc(y) == y; /* +-inf count as even integers, as in C */
    int y_odd = y_int && __builtin_trunc(half) != half;
    uint32_t neg = (af__f2u(x) & 0x80000000u) & (y_odd ? 0xffffffffu : 0u);
    r = af__u2f(af__f2u(r) ^ neg);
    r = (x < 0.0f && x != -AF__INF && !y_int) ? AF__NAN : r;
    r = (x != x || y != y) ? AF__NAN : r;
    return (y == 0.0 || x == 1.0f) ? 1.0f : r;
}

/* x^y for float x and y.  Max error measured: 1 ulp (one step from the correctly rounded float, where the
 * exact value lies within the 0.008 ulp budget of a rounding tie; elsewhere correctly rounded); asserted
 * <= 1 ulp.
 * Special values: af_pow_d's. */
AF_INLINE float af_pow(float x, float y) { return af_pow_d(x, (double)y); }

/* ---------------------------------------------------------------- hyperbolic, logistic, activations */

/* tanh.  Max relative error measured: 1.76e-7; asserted <= 4e-7.
 * Exactly +-1 for |x| >= 9.02, tanh(-0) = -0. */
AF_INLINE float af_tanh(float x) {
    float a = __builtin_fabsf(x);
    a = a > 9.5f ? 9.5f : a; /* tanh(9.5) rounds to 1; keeps expm1 finite (inf/inf would be NaN) */
    float e = af_expm1(2.0f * a);
    return af__copysign(e / (e + 2.0f), x);
}

/* 1 / (1 + e^-x).  Max relative error measured: 1.78e-7; asserted <= 4e-7, for x < 0 too (e / (1 + e)).
 * sigmoid(+inf) = 1, sigmoid(-inf) = 0, sigmoid(x > 16.6) = 1, sigmoid(x < -103.98) = 0. */
AF_INLINE float af_sigmoid(float x) {
    float e = af_exp_nonpos(-__builtin_fabsf(x)); /* bitwise af_exp's result on x <= 0, cheaper */
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* x * sigmoid(x) = {x or x e} / (1 + e), e = exp(-|x|), with af_exp_nonpos's reduction and scaling: e and
 * x e are formed from p * 2^(n+64) (exact: n >= -174 wherever the lanes are kept), each scaled by 2^-64 with
 * one rounding into the subnormal range where the result goes (x e: two roundings, as p * x before).
 * About 25 vector operations against 35 with af__scale (measured 0.34 -> 0.21 ns/element on an L2-resident
 * buffer, one core).
 * Max relative error measured: 2.42e-7; asserted <= 5e-7.  Subnormal results within one subnormal step;
 * silu(+inf) = inf, silu(-inf) = NaN as in PyTorch (-inf * 0). */
AF_INLINE float af_silu(float x) {
    float a = -__builtin_fabsf(x);
    float t = AF__FMA(a, AF__LOG2E, AF__MAGIC_S64);
    float nf = t - AF__MAGIC_S64;
    uint32_t scale = af__f2u(t) << 23; /* 2^(n+64): n >= -174 where the lanes are kept */
    float r = AF__FMA(-nf, AF__LN2_HI, a); /* exact */
    r = AF__FMA(-nf, AF__LN2_LO, r);
    float ps = af__exp_poly(r) * af__u2f(scale); /* e * 2^64, exact */
    float e = ps * 0x1p-64f;
    float num = (ps * x) * 0x1p-64f;
    /* below -120 x e < 2^-150 rounds to 0 (n + 64 stays normal down to a = -131); the lanes computed
     * garbage there, or at -inf (a NaN fails the compare and flows through) */
    int gone = a < -120.0f;
    e = gone ? 0.0f : e;
    num = gone ? x * 0.0f : num; /* -0, and NaN for -inf as PyTorch */
    num = x >= 0.0f ? x : num;
    return num / (1.0f + e);
}

/* m * erfc(t) for t in [0.49, 10.5]: u * exp(-t^2 + P(u)), u = 1 / (1 + t); -t^2 = hi + lo exactly (from the
 * caller); m is applied before the final scaling, so m * erfc(t) does not underflow early.  P (degree 9 in
 * u - 0.379) fits log(erfc(t) / u) + t^2 to 4.2e-8 absolute, i.e. relative error of erfc.  The rounding of u
 * is what limits the float32 result (~2e-7): d log(erfc) / d log(u) = 1 + 1/t. */
AF_INLINE float af__erfc_core(float t, float hi, float lo, float m) {
    float u = 1.0f / (1.0f + t);
    float v = u - 0x1.84255ap-2f;
    float p = -0x1.78c4aep+0f;
    p = AF__FMA(p, v, -0x1.e28c34p-1f);
    p = AF__FMA(p, v, 0x1.99b41cp+0f);
    p = AF__FMA(p, v, -0x1.2c3742p-2f);
    p = AF__FMA(p, v, -0x1.4c6288p-1f);
    p = AF__FMA(p, v, 0x1.5298fep-1f);
    p = AF__FMA(p, v, -0x1.9617b8p-5f);
    p = AF__FMA(p, v, -0x1.427c10p-1f);
    p = AF__FMA(p, v, 0x1.69b23cp-1f);
    p = AF__FMA(p, v, -0x1.dc9f14p-3f);
    int32_t n;
    float e = af__exp_hilo_parts(hi, lo + p, &n);
    return af__scale(e * (m * u), n);
}

/* erf(x)/x - 1 = H(x^2) on |x| <= 0.875; relative error of erf 2e-10 before rounding, 7.5e-8 in float32 */
AF_INLINE float af__erf_small(float x) {
    float s = x * x;
    float h = 0x1.6bdf42p-14f;
    h = AF__FMA(h, s, -0x1.ae7f8ep-11f);
    h = AF__FMA(h, s, 0x1.553abap-8f);
    h = AF__FMA(h, s, -0x1.b819a6p-6f);
    h = AF__FMA(h, s, 0x1.ce2e84p-4f);
    h = AF__FMA(h, s, -0x1.812744p-2f);
    h = AF__FMA(h, s, 0x1.06eba8p-3f);
    return AF__FMA(x, h, x);
}

/* keeps the top 12 significant bits of a non-negative float (its square is then exact) */
AF_INLINE float af__hi12(float a) { return af__u2f(af__f2u(a) & 0xfffff000u); }

/* erf.  Max relative error measured: 9.9e-8; asserted <= 2.5e-7.
 * Exactly +-1 for |x| >= 3.92, erf(-0) = -0. */
AF_INLINE float af_erf(float x) {
    float a = __builtin_fabsf(x);
    float t = a > 4.0f ? 4.0f : a; /* erfc(4) = 1.5e-8 < half an ulp of 1 */
    float th = af__hi12(t);
    float hi = -(th * th);
    float lo = -((t - th) * (t + th));
    float big = 1.0f - af__erfc_core(t, hi, lo, 1.0f);
    /* switching at 0.875 rather than 0.5 divides erfc's error by erf/erfc = 3.6 instead of 1.1 */
    return a < 0.875f ? af__erf_small(x) : af__copysign(big, x);
}

/* erfc = 1 - erf, without the cancellation: relative accuracy all the way down its tail (1 - af_erf(x) has
 * none for x > 1).  Max relative error measured: 2.9e-7; asserted <= 5e-7 (subnormal results, x > 9.2:
 * within 2^-149).  erfc(-inf) = 2, erfc(x > 10.05) = 0, erfc(+inf) = 0. */
AF_INLINE float af_erfc(float x) {
    float a = __builtin_fabsf(x);
    float t = a > 10.5f ? 10.5f : a;
    float th = af__hi12(t);
    float hi = -(th * th);
    float lo = -((t - th) * (t + th));
    float c = af__erfc_core(t, hi, lo, 1.0f); /* erfc(|x|) */
    float big = x < 0.0f ? 2.0f - c : c;
    float small = 1.0f - af__erf_small(x); /* in (0.48, 1.79): no cancellation to speak of */
    return (x > -0.875f && x < 0.5f) ? small : big;
}

/* 0.5 * x * (1 + erf(x / sqrt(2))) (torch gelu, approximate='none'), as x - e for x >= 0 and -e for x < 0,
 * e = |x| Phi(-|x|) = 0.5 |x| erfc(|x| / sqrt2): no cancellation on either side, relative accuracy down the
 * negative tail.  One path for every |x|: e = exp(-x^2 / 2) * q * R(q), q = |x| / (1 + 0.34 |x|) (the one
 * division; q is relatively accurate near 0, where e ~ |x| / 2), R a degree-8 polynomial in q - 1.2 fitted
 * (Lawson's iteration in float64 against torch's float64 erfcx) to a Phi(-a) exp(a^2 / 2) / q for a in
 * [0, 13.3] with relative weight: 2.5e-8 before rounding.  -x^2 / 2 is carried exactly as hi + lo (a
 * product and its fused residual) into the exp reduction, so the tail, where the exponent reaches -105,
 * keeps its relative accuracy; the exponential uses af_exp_nonpos's 2^(n+64) scaling and R's coefficients
 * carry the 2^-64, so results that go subnormal round once (the product with q is taken first, while it is
 * large, so that tiny |x| do not underflow).  x > 0 ? x : x * 0 gives the +-0 (and NaN for -inf) that e is
 * subtracted from.  About 32 vector instructions and a division per 16 lanes, Horner (Estrin measured
 * slower: the loop is bound by the two multiply-add pipes, not by latency); the exp(Q(w)) form before it
 * (degree 9 in the exponent) measured 0.49 -> 0.26 ns/element on one core, ATen's 0.19-0.23 (its erf has no
 * relative accuracy in the tail: abs error 1.1e-6 at |x| in [2, 4], relative error 1 below -4).
 * Max relative error measured: 3.04e-7; asserted <= 6e-7 (subnormal results: within one subnormal step or the
 * relative bound).  gelu(x < -14.36) = -0, gelu(+inf) = inf, gelu(-inf) = NaN as in PyTorch, gelu(-0) = -0. */
AF_INLINE float af_gelu(float x) {
    float a = __builtin_fabsf(x);
    float ac = a < 14.5f ? a : 14.5f; /* beyond, the negative side rounds to -0 and the positive side is x */
    float q = ac / AF__FMA(0x1.5c28f6p-2f, ac, 1.0f);
    float u = q - 0x1.344b4ap+0f;
    /* R(u) * 2^-64: the coefficients carry af_exp_nonpos's 2^-64 (exact: all stay normal floats) */
    float R = -0x1.3d3edap-82f;
    R = AF__FMA(R, u, -0x1.1b83eep-81f);
    R = AF__FMA(R, u, 0x1.3ac6ecp-78f);
    R = AF__FMA(R, u, 0x1.aec0fcp-77f);
    R = AF__FMA(R, u, -0x1.471aep-74f);
    R = AF__FMA(R, u, -0x1.94b056p-73f);
    R = AF__FMA(R, u, 0x1.3258e2p-69f);
    R = AF__FMA(R, u, -0x1.14c184p-67f);
    R = AF__FMA(R, u, 0x1.1f45ccp-66f);
    float ah = -0.5f * ac;
    float hi = ah * ac;
    float lo = AF__FMA(ah, ac, -hi); /* exact: hi + lo = -ac^2 / 2 */
    /* n from hi alone (|lo| <= ulp(hi) keeps r within the polynomial's interval); hi - n*ln2_hi is exact */
    float t = AF__FMA(hi, AF__LOG2E, AF__MAGIC_S64);
    float nf = t - AF__MAGIC_S64;
    uint32_t scale = af__f2u(t) << 23; /* 2^(n+64), n in [-152, 0] */
    float r = AF__FMA(-nf, AF__LN2_HI, hi);
    r = r + lo;
    r = AF__FMA(-nf, AF__LN2_LO, r);
    float e = ((af__exp_poly(r) * af__u2f(scale)) * q) * R;
    float m = x > 0.0f ? x : x * 0.0f; /* +-0, or NaN for -inf and NaN */
    return m - e;
}

/* 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) (torch gelu, approximate='tanh'), computed as
 * x * sigmoid(2 * inner) = {x or x e} / (1 + e), e = exp(-|z|), z = 2 * inner: equal in exact arithmetic, but
 * without the cancellation of 1 + tanh for x < 0, so the negative tail keeps relative accuracy.  There the
 * result is ~ x exp(z), and rounding z to float would cost |z| 2^-24 relative (6e-6 at x = -10), so -|z| is
 * formed in float as an exact-ish pair zh + zl (Dekker products, a two-sum, both constants split in two:
 * 12 operations, error ~2^-46 |z|) and zl joins the exp reduction, as af__exp_hilo_parts does; the exponential
 * uses af_exp_nonpos's 2^(n+64) scaling (|x| is clamped to 11, where z = -112.5: n + 64 stays normal, and
 * every x < -11 gives -0 as the exact result rounds).  About 42 vector instructions and a division per 16
 * lanes; the double-precision form before it (vcvtps2pd, double multiply-adds, two af__scale) measured
 * 0.97 -> 0.34 ns/element on one core, ATen's 1.1.
 * Max relative error measured: 2.27e-7, tail included; asserted <= 5e-7.  Subnormal results within one
 * subnormal step.  gelu_tanh(+inf) = inf, gelu_tanh(-inf) = NaN as in PyTorch, gelu_tanh(-0) = -0. */
AF_INLINE float af_gelu_tanh(float x) {
    const float c1h = 0x1.988454p+0f, c1l = -0x1.857936p-25f; /* 2 sqrt(2/pi) = c1h + c1l */
    const float c3h = 0x1.2444f2p-4f, c3l = 0x1.49b16ap-29f;  /* 0.044715 * 2 sqrt(2/pi) */
    float a = __builtin_fabsf(x);
    a = a > 11.0f ? 11.0f : a;
    float s = a * a;
    float sl = AF__FMA(a, a, -s);
    float m = c3h * s;
    float ml = AF__FMA(c3h, s, -m);
    ml = AF__FMA(c3h, sl, ml);
    ml = AF__FMA(c3l, s, ml);
    float k = c1h + m;
    float kb = k - c1h;
    float kl = (c1h - (k - kb)) + (m - kb);
    kl = kl + (ml + c1l);
    float zh = -a * k;
    float zl = AF__FMA(-a, k, -zh);
    zl = AF__FMA(-a, kl, zl);
    float t = AF__FMA(zh, AF__LOG2E, AF__MAGIC_S64);
    float nf = t - AF__MAGIC_S64;
    uint32_t scale = af__f2u(t) << 23;
    float r = AF__FMA(-nf, AF__LN2_HI, zh);
    r = r + zl;
    r = AF__FMA(-nf, AF__LN2_LO, r);
    float ps = af__exp_poly(r) * af__u2f(scale);
    float e = ps * 0x1p-64f;
    float num = (ps * -a) * 0x1p-64f;
    num = x >= 0.0f ? x : num;
    num = x == -AF__INF ? AF__NAN : num;
    return num / (1.0f + e);
}

/* 1 / sqrt(x): a correctly rounded sqrt and a division (GCC emits vsqrtps + vdivps; with -fno-math-errno no
 * libm call).  Max error measured: 1 ulp; asserted <= 1 ulp.  rsqrt(+0) = inf, rsqrt(-0) = -inf,
 * rsqrt(x < 0) = NaN, rsqrt(inf) = 0. */
AF_INLINE float af_rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }

/* ---------------------------------------------------------------- sin, cos */

/* af_sin_small / af_cos_small hold for |x| < AF_TRIG_SMALL_LIMIT (and give NaN for inf and NaN, as they
 * should).  Kernels run a block with the _small versions while taking the max of |x|, and run it again
 * with af_sin / af_cos when that max reached the limit (codegen/cpp/render.py). */
#define AF_TRIG_SMALL_LIMIT 0x1p16f

/* (2^s * 2/pi) mod 4 for s = -7 .. 104, as two doubles: its bits 2^1 .. 2^-26 (exactly) and the rest
 * rounded to double (from mpmath at 500 bits).  A float m * 2^s (m < 2^24 an integer) times the first is
 * exact in double, which is what makes the reduction below exact where it needs to be. */
static const double af__2opi_mod4[112 * 2] = {
    0x1.45f3000000000p-8, 0x1.b727220a94fe1p-30, /* s = -7 */
    0x1.45f3000000000p-7, 0x1.b727220a94fe1p-29, /* s = -6 */
    0x1.45f3000000000p-6, 0x1.b727220a94fe1p-28, /* s = -5 */
    0x1.45f3000000000p-5, 0x1.b727220a94fe1p-27, /* s = -4 */
    0x1.45f3040000000p-4, 0x1.6e4e441529fc2p-27, /* s = -3 */
    0x1.45f3060000000p-3, 0x1.b9391054a7f0ap-28, /* s = -2 */
    0x1.45f3060000000p-2, 0x1.b9391054a7f0ap-27, /* s = -1 */
    0x1.45f3068000000p-1, 0x1.727220a94fe14p-27, /* s = 0 */
    0x1.45f306c000000p+0, 0x1.c9c882a53f84fp-28, /* s = 1 */
    0x1.45f306c000000p+1, 0x1.c9c882a53f84fp-27, /* s = 2 */
    0x1.17cc1b4000000p+0, 0x1.9391054a7f09dp-27, /* s = 3 */
    0x1.17cc1b6000000p+1, 0x1.27220a94fe13bp-27, /* s = 4 */
    0x1.7cc1b70000000p-2, 0x1.391054a7f09d6p-29, /* s = 5 */
    0x1.7cc1b70000000p-1, 0x1.391054a7f09d6p-28, /* s = 6 */
    0x1.7cc1b70000000p+0, 0x1.391054a7f09d6p-27, /* s = 7 */
    0x1.7cc1b72000000p+1, 0x1.c882a53f84eb0p-29, /* s = 8 */
    0x1.f306dc8000000p+0, 0x1.c882a53f84eb0p-28, /* s = 9 */
    0x1.f306dc8000000p+1, 0x1.c882a53f84eb0p-27, /* s = 10 */
    0x1.e60db92000000p+1, 0x1.91054a7f09d5fp-27, /* s = 11 */
    0x1.cc1b726000000p+1, 0x1.220a94fe13abfp-27, /* s = 12 */
    0x1.9836e4e000000p+1, 0x1.1054a7f09d5f4p-29, /* s = 13 */
    0x1.306dc9c000000p+1, 0x1.1054a7f09d5f4p-28, /* s = 14 */
    0x1.836e4e0000000p-1, 0x1.1054a7f09d5f4p-27, /* s = 15 */
    0x1.836e4e4000000p+0, 0x1.054a7f09d5f48p-30, /* s = 16 */
    0x1.836e4e4000000p+1, 0x1.054a7f09d5f48p-29, /* s = 17 */
    0x1.06dc9c8000000p+1, 0x1.054a7f09d5f48p-28, /* s = 18 */
    0x1.b727200000000p-4, 0x1.054a7f09d5f48p-27, /* s = 19 */
    0x1.b727220000000p-3, 0x1.529fc2757d1f5p-32, /* s = 20 */
    0x1.b727220000000p-2, 0x1.529fc2757d1f5p-31, /* s = 21 */
    0x1.b727220000000p-1, 0x1.529fc2757d1f5p-30, /* s = 22 */
    0x1.b727220000000p+0, 0x1.529fc2757d1f5p-29, /* s = 23 */
    0x1.b727220000000p+1, 0x1.529fc2757d1f5p-28, /* s = 24 */
    0x1.6e4e440000000p+1, 0x1.529fc2757d1f5p-27, /* s = 25 */
    0x1.b939104000000p+0, 0x1.4a7f09d5f47d5p-28, /* s = 26 */
    0x1.b939104000000p+1, 0x1.4a7f09d5f47d5p-27, /* s = 27 */
    0x1.727220a000000p+1, 0x1.29fc2757d1f53p-28, /* s = 28 */
    0x1.c9c8828000000p+0, 0x1.29fc2757d1f53p-27, /* s = 29 */
    0x1.c9c882a000000p+1, 0x1.4fe13abe8fa9ap-29, /* s = 30 */
    0x1.9391054000000p+1, 0x1.4fe13abe8fa9ap-28, /* s = 31 */
    0x1.27220a8000000p+1, 0x1.4fe13abe8fa9ap-27, /* s = 32 */
    0x1.3910548000000p-1, 0x1.3f84eafa3ea6ap-28, /* s = 33 */
    0x1.3910548000000p+0, 0x1.3f84eafa3ea6ap-27, /* s = 34 */
    0x1.391054a000000p+1, 0x1.fc2757d1f534ep-29, /* s = 35 */
    0x1.c882a50000000p-1, 0x1.fc2757d1f534ep-28, /* s = 36 */
    0x1.c882a50000000p+0, 0x1.fc2757d1f534ep-27, /* s = 37 */
    0x1.c882a52000000p+1, 0x1.f84eafa3ea69cp-27, /* s = 38 */
    0x1.91054a6000000p+1, 0x1.f09d5f47d4d37p-27, /* s = 39 */
    0x1.220a94e000000p+1, 0x1.e13abe8fa9a6fp-27, /* s = 40 */
    0x1.1054a78000000p-1, 0x1.c2757d1f534dep-27, /* s = 41 */
    0x1.1054a7c000000p+0, 0x1.84eafa3ea69bcp-27, /* s = 42 */
    0x1.1054a7e000000p+1, 0x1.09d5f47d4d377p-27, /* s = 43 */
    0x1.054a7f0000000p-2, 0x1.3abe8fa9a6ee0p-31, /* s = 44 */
    0x1.054a7f0000000p-1, 0x1.3abe8fa9a6ee0p-30, /* s = 45 */
    0x1.054a7f0000000p+0, 0x1.3abe8fa9a6ee0p-29, /* s = 46 */
    0x1.054a7f0000000p+1, 0x1.3abe8fa9a6ee0p-28, /* s = 47 */
    0x1.529fc00000000p-4, 0x1.3abe8fa9a6ee0p-27, /* s = 48 */
    0x1.529fc20000000p-3, 0x1.d5f47d4d37703p-29, /* s = 49 */
    0x1.529fc20000000p-2, 0x1.d5f47d4d37703p-28, /* s = 50 */
    0x1.529fc20000000p-1, 0x1.d5f47d4d37703p-27, /* s = 51 */
    0x1.529fc24000000p+0, 0x1.abe8fa9a6ee07p-27, /* s = 52 */
    0x1.529fc26000000p+1, 0x1.57d1f534ddc0ep-27, /* s = 53 */
    0x1.4a7f09c000000p+0, 0x1.5f47d4d377037p-28, /* s = 54 */
    0x1.4a7f09c000000p+1, 0x1.5f47d4d377037p-27, /* s = 55 */
    0x1.29fc274000000p+0, 0x1.7d1f534ddc0dbp-28, /* s = 56 */
    0x1.29fc274000000p+1, 0x1.7d1f534ddc0dbp-27, /* s = 57 */
    0x1.4fe13a8000000p-1, 0x1.f47d4d377036ep-28, /* s = 58 */
    0x1.4fe13a8000000p+0, 0x1.f47d4d377036ep-27, /* s = 59 */
    0x1.4fe13aa000000p+1, 0x1.e8fa9a6ee06dbp-27, /* s = 60 */
    0x1.3f84eac000000p+0, 0x1.d1f534ddc0db6p-27, /* s = 61 */
    0x1.3f84eae000000p+1, 0x1.a3ea69bb81b6cp-27, /* s = 62 */
    0x1.fc27578000000p-1, 0x1.47d4d377036d9p-27, /* s = 63 */
    0x1.fc2757c000000p+0, 0x1.1f534ddc0db63p-28, /* s = 64 */
    0x1.fc2757c000000p+1, 0x1.1f534ddc0db63p-27, /* s = 65 */
    0x1.f84eafa000000p+1, 0x1.f534ddc0db629p-30, /* s = 66 */
    0x1.f09d5f4000000p+1, 0x1.f534ddc0db629p-29, /* s = 67 */
    0x1.e13abe8000000p+1, 0x1.f534ddc0db629p-28, /* s = 68 */
    0x1.c2757d0000000p+1, 0x1.f534ddc0db629p-27, /* s = 69 */
    0x1.84eafa2000000p+1, 0x1.ea69bb81b6c53p-27, /* s = 70 */
    0x1.09d5f46000000p+1, 0x1.d4d377036d8a5p-27, /* s = 71 */
    0x1.3abe8e0000000p-3, 0x1.a9a6ee06db14bp-27, /* s = 72 */
    0x1.3abe8f0000000p-2, 0x1.534ddc0db6296p-27, /* s = 73 */
    0x1.3abe8f8000000p-1, 0x1.4d377036d8a56p-28, /* s = 74 */
    0x1.3abe8f8000000p+0, 0x1.4d377036d8a56p-27, /* s = 75 */
    0x1.3abe8fa000000p+1, 0x1.34ddc0db6295ap-28, /* s = 76 */
    0x1.d5f47d0000000p-1, 0x1.34ddc0db6295ap-27, /* s = 77 */
    0x1.d5f47d4000000p+0, 0x1.a6ee06db14acdp-29, /* s = 78 */
    0x1.d5f47d4000000p+1, 0x1.a6ee06db14acdp-28, /* s = 79 */
    0x1.abe8fa8000000p+1, 0x1.a6ee06db14acdp-27, /* s = 80 */
    0x1.57d1f52000000p+1, 0x1.4ddc0db629599p-27, /* s = 81 */
    0x1.5f47d4c000000p+0, 0x1.377036d8a5665p-28, /* s = 82 */
    0x1.5f47d4c000000p+1, 0x1.377036d8a5665p-27, /* s = 83 */
    0x1.7d1f534000000p+0, 0x1.bb81b6c52b328p-29, /* s = 84 */
    0x1.7d1f534000000p+1, 0x1.bb81b6c52b328p-28, /* s = 85 */
    0x1.f47d4d0000000p+0, 0x1.bb81b6c52b328p-27, /* s = 86 */
    0x1.f47d4d2000000p+1, 0x1.77036d8a5664fp-27, /* s = 87 */
    0x1.e8fa9a6000000p+1, 0x1.dc0db6295993cp-28, /* s = 88 */
    0x1.d1f534c000000p+1, 0x1.dc0db6295993cp-27, /* s = 89 */
    0x1.a3ea69a000000p+1, 0x1.b81b6c52b3279p-27, /* s = 90 */
    0x1.47d4d36000000p+1, 0x1.7036d8a5664f1p-27, /* s = 91 */
    0x1.1f534dc000000p+0, 0x1.c0db6295993c4p-28, /* s = 92 */
    0x1.1f534dc000000p+1, 0x1.c0db6295993c4p-27, /* s = 93 */
    0x1.f534dd0000000p-2, 0x1.81b6c52b32788p-27, /* s = 94 */
    0x1.f534dd8000000p-1, 0x1.036d8a5664f11p-27, /* s = 95 */
    0x1.f534ddc000000p+0, 0x1.b6c52b3278872p-33, /* s = 96 */
    0x1.f534ddc000000p+1, 0x1.b6c52b3278872p-32, /* s = 97 */
    0x1.ea69bb8000000p+1, 0x1.b6c52b3278872p-31, /* s = 98 */
    0x1.d4d3770000000p+1, 0x1.b6c52b3278872p-30, /* s = 99 */
    0x1.a9a6ee0000000p+1, 0x1.b6c52b3278872p-29, /* s = 100 */
    0x1.534ddc0000000p+1, 0x1.b6c52b3278872p-28, /* s = 101 */
    0x1.4d37700000000p+0, 0x1.b6c52b3278872p-27, /* s = 102 */
    0x1.4d37702000000p+1, 0x1.6d8a5664f10e4p-27, /* s = 103 */
    0x1.34ddc0c000000p+0, 0x1.b6295993c4390p-28, /* s = 104 */
};

/* Payne-Hanek style reduction for |x| >= 2^16: x = m * 2^s with m < 2^24, and x * 2/pi = m * F(s) (mod 4)
 * with F(s) = (2^s * 2/pi) mod 4 from the table.  m * hi is exact and is reduced mod 4 exactly; m * lo
 * (< 2^-2) rounds at 2^-55, so y - j is within 2^-52 of x * 2/pi - j for every finite x up to FLT_MAX
 * and r = (y - j) * pi/2 within 2^-51 (the float rounding of r is what is left).  Returns r and j & 3. */
AF_INLINE float af__trig_reduce_big(float x, uint32_t *q) {
    uint32_t u = af__f2u(x) & 0x7fffffffu;
    int32_t e = (int32_t)(u >> 23) - 127;
    e = e < 16 ? 16 : e;
    e = e > 127 ? 127 : e; /* inf and NaN: any row; the caller turns the result into NaN */
    int32_t k = 2 * (e - 16);
    double m = (double)(int32_t)((u & 0x7fffffu) | 0x800000u);
    double t0 = m * af__2opi_mod4[k];
    double n = (t0 * 0.25 + 0x1.8p52) - 0x1.8p52; /* nearest integer to t0 / 4 (t0 < 2^26) */
    double y = (t0 - 4.0 * n) + m * af__2opi_mod4[k + 1]; /* in [-2, 2.25] */
    y = x < 0.0f ? -y : y;
    double j = (y + 0x1.8p52) - 0x1.8p52;
    *q = (uint32_t)(int32_t)j & 3u;
    return (float)((y - j) * 0x1.921fb54442d18p+0); /* y - j is exact; times pi/2 */
}

/* x = j * pi/2 + r, |r| <= pi/4 (+ tiny), for |x| < 2^16; returns r and j & 3.  Cody-Waite with
 * pi/2 = P1 + P2 + P3 + P4; P1..P3 have <= 8 significant bits (P2 and P3 rounded down, so every part is
 * positive), so j * Pk is exact for |j| < 2^16 and the first two subtractions are exact; the last two are
 * fused multiply-adds where the target has FMA (rounding <= 2^-25 each).  Beyond 2^16 the result is
 * meaningless (callers use af__trig_reduce_big there); +-inf and NaN give NaN. */
AF_INLINE float af__trig_reduce(float x, uint32_t *q) {
    float t = AF__FMA(x, 0x1.45f306p-1f, AF__MAGIC); /* 2/pi */
    float jf = t - AF__MAGIC;
    *q = (af__f2u(t) - AF__MAGIC_BITS) & 3u;
    /* all four parts positive, so r keeps the sign of a zero x (x - (+0) = x) */
    float r = AF__FMA(-jf, 0x1.92p+0f, x); /* exact either way */
    r = AF__FMA(-jf, 0x1.fap-12f, r);
    r = AF__FMA(-jf, 0x1.54p-20f, r);
    r = AF__FMA(-jf, 0x1.10b462p-30f, r);
    r = r > 0.8f ? 0.8f : r; /* only reached for large |x|; NaN flows through */
    r = r < -0.8f ? -0.8f : r;
    return r;
}

/* af__trig_reduce for every x: the table reduction where |x| >= 2^16 (both are computed, one is kept) */
AF_INLINE float af__trig_reduce_all(float x, uint32_t *q) {
    uint32_t q_small, q_big;
    float r = af__trig_reduce(x, &q_small);
    float r_big = af__trig_reduce_big(x, &q_big) + (x - x); /* x - x: NaN for +-inf and NaN, else +0 */
    int big = !(__builtin_fabsf(x) < AF_TRIG_SMALL_LIMIT); /* NaN too */
    *q = big ? q_big : q_small;
    return big ? r_big : r;
}

/* sin(r), |r| <= pi/4: r + r^3 S(r^2), abs error 3.8e-8 in float32 */
AF_INLINE float af__sin_poly(float r, float s) {
    float p = -0x1.98d6b6p-13f;
    p = AF__FMA(p, s, 0x1.1105a8p-7f);
    p = AF__FMA(p, s, -0x1.55554p-3f);
    return AF__FMA(r * s, p, r);
}

/* cos(r), |r| <= pi/4: 1 - r^2/2 + r^4 C(r^2), abs error 7.2e-8 in float32 */
AF_INLINE float af__cos_poly(float s) {
    float p = 0x1.99ff4p-16f;
    p = AF__FMA(p, s, -0x1.6c0c82p-10f);
    p = AF__FMA(p, s, 0x1.55554ap-5f);
    return AF__FMA(s * s, p, AF__FMA(-0.5f, s, 1.0f));
}

AF_INLINE float af__sin_of(float x, float r, uint32_t q) {
    float s = r * r;
    float sn = af__sin_poly(r, s);
    float cs = af__cos_poly(s);
    float v = (q & 1u) ? cs : sn;
    v = af__u2f(af__f2u(v) ^ ((q & 2u) << 30));
    return __builtin_fabsf(x) < 0x1p-12f ? x : v; /* sin(x) rounds to x there; keeps sin(-0) = -0 */
}

AF_INLINE float af__cos_of(float r, uint32_t q) {
    float s = r * r;
    float sn = af__sin_poly(r, s);
    float cs = af__cos_poly(s);
    float v = (q & 1u) ? sn : cs;
    return af__u2f(af__f2u(v) ^ (((q + 1u) & 2u) << 30));
}

/* sin.  Max abs error measured: 1.05e-7 (every float with |x| <= 1e5); asserted <= 2e-7 on every finite
 * float.  sin(-0) = -0, sin(+-inf) = NaN.  Costs a table gather per lane; see af_sin_small. */
AF_INLINE float af_sin(float x) {
    uint32_t q;
    float r = af__trig_reduce_all(x, &q);
    return af__sin_of(x, r, q);
}

/* cos.  Max abs error measured: 1.15e-7 (every float with |x| <= 1e5); asserted <= 2e-7 on every finite
 * float.  cos(+-inf) = NaN. */
AF_INLINE float af_cos(float x) {
    uint32_t q;
    float r = af__trig_reduce_all(x, &q);
    return af__cos_of(r, q);
}

/* sin and cos for |x| < AF_TRIG_SMALL_LIMIT (2^16) only, four times cheaper than af_sin/af_cos,
 * and bitwise equal to them there.  Meaningless (but in [-1, 1]) beyond; NaN for inf and NaN. */
AF_INLINE float af_sin_small(float x) {
    uint32_t q;
    float r = af__trig_reduce(x, &q);
    return af__sin_of(x, r, q);
}

AF_INLINE float af_cos_small(float x) {
    uint32_t q;
    float r = af__trig_reduce(x, &q);
    return af__cos_of(r, q);
}

/* ---------------------------------------------------------------- half types */

/* These are the per-element conversions of every half-typed load, store and in-register rounding, so
 * they are written for the vectorised loop: few operations, no float subnormal produced or consumed on
 * the common path (some CPUs take a slow microcode path for those), and the same bits as the IEEE
 * conversion instructions (F16C's vcvtps2ph with round-to-nearest-even) for every non-NaN input.  GCC 12
 * does not vectorise `_Float16` conversions without AVX512-FP16 (each element becomes a scalar vcvtph2ps),
 * so integer and float arithmetic the vectoriser understands is the way to keep the loops wide. */

/* IEEE binary16 bits -> float, exact for every input (subnormals, +-inf, NaN with its payload). */
AF_INLINE float af_f16_to_f32(uint16_t h) {
    uint32_t hu = h;
    uint32_t o = (hu & 0x7fffu) << 13; /* exponent and mantissa in float position */
    /* subnormal (or zero): mantissa * 2^-24, an exact int -> float conversion and an exact scaling */
    float sub = (float)(int32_t)(hu & 0x3ffu) * 0x1p-24f;
    uint32_t r = o < (1u << 23) ? af__f2u(sub) : o + ((uint32_t)(127 - 15) << 23); /* normal: rebias */
    /* inf/NaN: exponent all ones, payload kept; a signalling NaN comes out quiet, as F16C's vcvtph2ps
     * (and so eager's vectorised conversion and the staged loads below) make it */
    uint32_t quiet = o > (0x7c00u << 13) ? 0x00400000u : 0u;
    r = o >= (0x7c00u << 13) ? (o | 0x7f800000u | quiet) : r;
    return af__u2f(r | ((hu & 0x8000u) << 16));
}

/* x rounded to the nearest fp16 value, kept as a float (round to nearest even, overflow to inf, fp16
 * subnormals exact, NaN stays NaN): (|x| + m) - m with m = 2^(e+13), e the exponent of |x| clamped to
 * [-14, 16], rounds |x| once, in the float add, to a multiple of 2^(e-10), the fp16 spacing at |x|
 * (2^-24 below 2^-14); the subtraction is exact.  One value up at the top of a binade stays right
 * (m + 2^(e+1) is still a multiple of that spacing).  |x| >= 65520 (where fp16 rounds to inf) gives a
 * value > 65504. */
AF_INLINE float af_round_f16(float x) {
    uint32_t u = af__f2u(x);
    uint32_t a = u & 0x7fffffffu;
    uint32_t e = a & 0x7f800000u;
    e = e < (113u << 23) ? (113u << 23) : e;
    e = e > (143u << 23) ? (143u << 23) : e;
    float m = af__u2f(e + (13u << 23));
    float r = (af__u2f(a) + m) - m;
    r = r > 65504.0f ? AF__INF : r; /* NaN compares false and stays NaN */
    return af__u2f(af__f2u(r) | (u & 0x80000000u));
}

/* fp16 bits of a float that already holds an fp16 value (af_round_f16's result, a loaded fp16 value,
 * +-inf) or NaN (-> quiet NaN 0x7e00, sign kept): no rounding left to do. */
AF_INLINE uint16_t af_f16_bits(float r) {
    uint32_t u = af__f2u(r);
    uint32_t sign = u & 0x80000000u;
    uint32_t a = u ^ sign;
    uint32_t sub = (uint32_t)(int32_t)(af__u2f(a) * 0x1p24f); /* subnormal: the mantissa, exactly */
    uint32_t n = a < (113u << 23) ? sub : (a >> 13) - (112u << 10);
    n = a >= 0x7f800000u ? (a > 0x7f800000u ? 0x7e00u : 0x7c00u) : n;
    return (uint16_t)(n | (sign >> 16));
}

/* float -> IEEE binary16 bits, round to nearest even; overflow -> inf, NaN -> quiet NaN (sign kept),
 * subnormal results rounded correctly.  Bit-exact with torch's .to(torch.float16) (NaNs aside). */
AF_INLINE uint16_t af_f32_to_f16(float f) { return af_f16_bits(af_round_f16(f)); }

/* bfloat16 bits -> float (exact) */
AF_INLINE float af_bf16_to_f32(uint16_t b) { return af__u2f((uint32_t)b << 16); }

/* float -> bfloat16 bits, round to nearest even (overflow -> inf); NaN stays NaN (quiet, sign kept).
 * Integer rounding: the carry of u + 0x7fff + (the kept lsb) is the rounding; it cannot carry a NaN
 * into inf because NaN takes the other select. */
AF_INLINE uint16_t af_f32_to_bf16(float f) {
    uint32_t u = af__f2u(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t n = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? n : r);
}

/* bfloat16 bits of a float that already holds a bfloat16 value (low 16 bits zero) or NaN (quieted as
 * af_f32_to_bf16 does). */
AF_INLINE uint16_t af_bf16_bits(float r) {
    uint32_t u = af__f2u(r);
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : u >> 16);
}

/* Staged fp16 loads and stores: a pointwise kernel converts a run of up to AF_STAGE contiguous fp16
 * values to floats in a stack array before its simd loop, and the loop's results back after it, with
 * F16C's vcvtph2ps / vcvtps2ph (round to nearest even) where the build may use F16C: one instruction per
 * 8 or 16 values instead of the bit manipulation above, which GCC cannot turn into those instructions.
 * The bits are those of af_f16_to_f32 / af_f32_to_f16 for every input (tests/codegen/test_half_staging.py
 * checks every fp16 value and a sweep of floats): the store makes a NaN the quiet NaN of its sign first,
 * as af_f16_bits does (vcvtps2ph would keep part of the payload); a tail shorter than a vector goes
 * through a zero-padded vector, so every element takes the same instructions.  Without F16C they are
 * the plain loops over the functions above. The renderer defines AF_F16_STAGED only in units that call
 * them: <immintrin.h> costs g++ about 0.45 s to parse, ten times a plain kernel's whole build. */
#define AF_STAGE 256
#if defined(AF_F16_STAGED) && defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define AF__F16_HW 1

AF_INLINE __m256 af__f16_canon_nan8(__m256 x) {
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 q = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    return _mm256_blendv_ps(x, q, nan);
}
#endif

AF_INLINE void af_f16_load(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
#ifdef AF__F16_HW
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
#endif
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
    if (i < n) {
        uint16_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float o[8];
        for (int64_t j = 0; j < n - i; ++j) t[j] = src[i + j];
        _mm256_storeu_ps(o, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)t)));
        for (int64_t j = 0; j < n - i; ++j) dst[i + j] = o[j];
    }
#else
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = af_f16_to_f32(src[i]);
#endif
}

AF_INLINE void af_f16_store(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
#ifdef AF__F16_HW
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        __m512i q = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)),
                                    _mm512_set1_epi32(0x7fc00000));
        x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(q));
        _mm256_storeu_si256((__m256i*)(dst + i), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i*)(dst + i),
                         _mm256_cvtps_ph(af__f16_canon_nan8(_mm256_loadu_ps(src + i)), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        uint16_t o[8];
        for (int64_t j = 0; j < n - i; ++j) t[j] = src[i + j];
        _mm_storeu_si128((__m128i*)o, _mm256_cvtps_ph(af__f16_canon_nan8(_mm256_loadu_ps(t)), _MM_FROUND_TO_NEAREST_INT));
        for (int64_t j = 0; j < n - i; ++j) dst[i + j] = o[j];
    }
#else
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = af_f32_to_f16(src[i]);
#endif
}

/* x rounded to the nearest bfloat16 value, kept as a float: what storing to the half type and loading
 * back gives, with the same rounding (nearest even, overflow to inf, NaN stays NaN).
 * A cast to a half type inside a kernel uses these, so the value is the half value even when it never
 * leaves a float register (x.half().float() - x is the rounding error, as in eager). */
AF_INLINE float af_round_bf16(float x) { return af_bf16_to_f32(af_f32_to_bf16(x)); }

/* ---------------------------------------------------------------- float -> integer */

/* Truncation toward zero, as (int32_t)x, but defined for every input: NaN, +-inf and values outside the
 * integer range give INT32_MIN / INT64_MIN, the "integer indefinite" value x86's cvtt* instructions (and so
 * eager PyTorch on x86) produce.  The out-of-range input is replaced by 0 before the conversion, so the
 * compiler never sees the undefined conversion and may not assume it away. */
AF_INLINE int32_t af_f32_to_i32(float x) {
    int ok = x >= -0x1p31f && x < 0x1p31f; /* NaN fails both */
    int32_t r = (int32_t)(ok ? x : 0.0f);
    return ok ? r : (int32_t)0x80000000u;
}

AF_INLINE int64_t af_f32_to_i64(float x) {
    int ok = x >= -0x1p63f && x < 0x1p63f;
    int64_t r = (int64_t)(ok ? x : 0.0f);
    return ok ? r : (int64_t)0x8000000000000000ull;
}

/* ---------------------------------------------------------------- lerp */

/* torch.lerp as ATen's vectorised kernel computes it: start + w * (end - start) for |w| < 0.5, else
 * end + (w - 1) * (end - start), each as one fused multiply-add (so near-cancelling results match eager). */
AF_INLINE float af_lerp(float start, float end, float w) {
    int small = __builtin_fabsf(w) < 0.5f;
    float coeff = small ? w : w - 1.0f;
    float base = small ? start : end;
    float r = AF__FMA(coeff, end - start, base);
    /* The same value, but a second use of r: GCC 12 rewrites a lone -fma(a, b, c) as fnmsub, -(a * b) - c,
     * which turns -(+0 + -0) = -0 into +0, so a negated lerp would lose eager's sign of zero. */
    return r == 0.0f ? af__u2f(af__f2u(r) & 0x80000000u) : r;
}

/* ---------------------------------------------------------------- eager's floating division ops */

/* These call fmodf (exact, but a libm call: loops that use them stay scalar).  They transcribe ATen's CPU
 * kernels step by step, so every special value (inf, NaN, signed zeros, huge quotients) comes out as in
 * eager. */

/* torch.remainder: fmod, moved into the divisor's sign */
AF_INLINE float af_remainder(float a, float b) {
    float mod = __builtin_fmodf(a, b);
    return (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) ? mod + b : mod;
}

/* torch.div(a, b, rounding_mode="floor") (also floor_divide): ATen's div_floor_floating_vec.  For fp16 and
 * bf16 eager computes it in the half type itself, rounding after every step: R is that rounding. */
#define AF__FLOOR_DIVIDE(NAME, R)                                                                         \
    AF_INLINE float NAME(float a, float b) {                                                              \
        float basic = R(a / b);                                                                           \
        float mod = __builtin_fmodf(a, b); /* exact, so already a value of the half type */               \
        float fl = (__builtin_fabsf(basic) == AF__INF && __builtin_fabsf(a) != AF__INF) ? a : R(a - mod); \
        float div = R(fl / b);                                                                            \
        div = (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) ? R(div - 1.0f) : div;                        \
        float fd = __builtin_floorf(div);                                                                 \
        fd = R(div - fd) > 0.5f ? R(fd + 1.0f) : fd;                                                      \
        fd = div == 0.0f ? af__copysign(0.0f, basic) : fd;                                                \
        return b == 0.0f ? basic : fd;                                                                    \
    }
#define AF__EXACT(v) (v)
AF__FLOOR_DIVIDE(af_floor_divide, AF__EXACT)
AF__FLOOR_DIVIDE(af_floor_divide_f16, af_round_f16)
AF__FLOOR_DIVIDE(af_floor_divide_bf16, af_round_bf16)

#endif /* AUTOFUSION_AF_MATH_H */
