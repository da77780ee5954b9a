// Direct oneDNN convolutions for runtime/library.py's "dnnl" route (built and loaded by dnnl_conv.py).
//
// One handle per convolution configuration: the primitive descriptor and the primitive are created once,
// the weights reordered once into the layout the primitive prefers, the scratchpad allocated once, and
// the argument map built once. Executing a handle only points its memory objects at the caller's
// buffers and runs the primitive: no descriptor is created per call (what ATen's
// _convolution_pointwise does, ~20 us per call).
//
// Activations are NHWC (channels-last), weights arrive in torch's contiguous [K, C/G, KH, KW] layout,
// bias is float32 (a folded BatchNorm's shift). Post-ops, in order: residual add (a binary add of an
// NHWC tensor of the destination's type), then one eltwise activation. A per-handle mutex serialises
// executions of one handle (its memory objects and scratchpad are shared by its callers).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <unordered_map>

#include "oneapi/dnnl/dnnl.hpp"

namespace {

using dnnl::memory;

struct Handle {
    dnnl::engine eng;
    dnnl::stream strm;
    dnnl::convolution_forward prim;
    memory src, dst, wei, bias, res, scratch;
    std::unordered_map<int, memory> args;
    std::mutex mu;
    char impl[128];
};

void set_error(char* err, int64_t errlen, const char* what) {
    if (err != nullptr && errlen > 0) std::snprintf(err, static_cast<size_t>(errlen), "%s", what);
}

bool activation(int act, dnnl::algorithm* alg) {
    using A = dnnl::algorithm;
    // Codes shared with dnnl_conv.py's ACTIVATIONS.
    switch (act) {
        case 1: *alg = A::eltwise_relu; return true;
        case 2: *alg = A::eltwise_clip; return true;  // relu6: clip(x, alpha, beta)
        case 3: *alg = A::eltwise_swish; return true;  // silu: x * sigmoid(alpha * x)
        case 4: *alg = A::eltwise_logistic; return true;
        case 5: *alg = A::eltwise_gelu_erf; return true;
        case 6: *alg = A::eltwise_gelu_tanh; return true;
        case 7: *alg = A::eltwise_hardswish; return true;  // x * clip(alpha * x + beta, 0, 1)
        default: return false;
    }
}

}  // namespace

extern "C" {

void af_dnnl_version(int32_t* out) {
    const dnnl_version_t* v = dnnl_version();
    out[0] = v->major;
    out[1] = v->minor;
    out[2] = v->patch;
}

// dtype: 0 float32, 1 bfloat16. dims: N, C, H, W, K, KH, KW. conv: stride h, w; padding top, left,
// bottom, right; dilation h, w (1 = none); groups. act: 0 none, else activation()'s codes, with
// alpha/beta as oneDNN's eltwise takes them. residual: 0 none, 1 a binary add post-op.
// Returns the handle, or null with the reason in err.
void* af_dnnl_conv_create(int32_t dtype, const int64_t* dims, const int64_t* conv, const void* weight,
                          const float* bias, int32_t act, float alpha, float beta, int32_t residual,
                          char* err, int64_t errlen) {
    try {
        using tag = memory::format_tag;
        const memory::data_type dt = dtype == 1 ? memory::data_type::bf16 : memory::data_type::f32;
        const int64_t N = dims[0], C = dims[1], H = dims[2], W = dims[3], K = dims[4], KH = dims[5],
                      KW = dims[6];
        const int64_t sh = conv[0], sw = conv[1], pt = conv[2], pl = conv[3], pb = conv[4], pr = conv[5],
                      dh = conv[6], dw = conv[7], G = conv[8];
        if (G < 1 || C % G != 0 || K % G != 0) {
            set_error(err, errlen, "channels are not divisible by groups");
            return nullptr;
        }
        const int64_t OH = (H + pt + pb - dh * (KH - 1) - 1) / sh + 1;
        const int64_t OW = (W + pl + pr - dw * (KW - 1) - 1) / sw + 1;
        if (OH < 1 || OW < 1) {
            set_error(err, errlen, "empty output");
            return nullptr;
        }
        auto* h = new Handle();
        h->eng = dnnl::engine(dnnl::engine::kind::cpu, 0);
        h->strm = dnnl::stream(h->eng);
        memory::desc src_md({N, C, H, W}, dt, tag::nhwc);
        memory::desc dst_md({N, K, OH, OW}, dt, tag::nhwc);
        memory::desc user_w_md = G == 1 ? memory::desc({K, C, KH, KW}, dt, tag::oihw)
                                        : memory::desc({G, K / G, C / G, KH, KW}, dt, tag::goihw);
        memory::desc any_w_md = G == 1 ? memory::desc({K, C, KH, KW}, dt, tag::any)
                                       : memory::desc({G, K / G, C / G, KH, KW}, dt, tag::any);
        memory::desc bias_md({K}, memory::data_type::f32, tag::x);
        dnnl::post_ops po;
        if (residual) po.append_binary(dnnl::algorithm::binary_add, dst_md);
        dnnl::algorithm alg;
        if (act != 0) {
            if (!activation(act, &alg)) {
                delete h;
                set_error(err, errlen, "unknown activation code");
                return nullptr;
            }
            po.append_eltwise(alg, alpha, beta);
        }
        dnnl::primitive_attr attr;
        attr.set_post_ops(po);
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        const memory::dims strides{sh, sw}, dil{dh - 1, dw - 1}, pad_l{pt, pl}, pad_r{pb, pr};
        dnnl::convolution_forward::primitive_desc pd =
            bias != nullptr
                ? dnnl::convolution_forward::primitive_desc(
                      h->eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                      src_md, any_w_md, bias_md, dst_md, strides, dil, pad_l, pad_r, attr)
                : dnnl::convolution_forward::primitive_desc(
                      h->eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                      src_md, any_w_md, dst_md, strides, dil, pad_l, pad_r, attr);
        h->prim = dnnl::convolution_forward(pd);
        std::snprintf(h->impl, sizeof h->impl, "%s", pd.impl_info_str());
        // The weights, once: from torch's layout into the primitive's (the caller's buffer is only read).
        memory user_w(user_w_md, h->eng, const_cast<void*>(weight));
        h->wei = memory(pd.weights_desc(), h->eng);
        dnnl::reorder(user_w, h->wei).execute(h->strm, user_w, h->wei);
        h->src = memory(src_md, h->eng, DNNL_MEMORY_NONE);
        h->dst = memory(dst_md, h->eng, DNNL_MEMORY_NONE);
        h->scratch = memory(pd.scratchpad_desc(), h->eng);
        h->args = {{DNNL_ARG_SRC, h->src}, {DNNL_ARG_WEIGHTS, h->wei}, {DNNL_ARG_DST, h->dst},
                   {DNNL_ARG_SCRATCHPAD, h->scratch}};
        if (bias != nullptr) {
            h->bias = memory(bias_md, h->eng);
            std::memcpy(h->bias.get_data_handle(), bias, static_cast<size_t>(K) * sizeof(float));
            h->args[DNNL_ARG_BIAS] = h->bias;
        }
        if (residual) {
            h->res = memory(dst_md, h->eng, DNNL_MEMORY_NONE);
            h->args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = h->res;
        }
        h->strm.wait();
        return h;
    } catch (const std::exception& e) {
        set_error(err, errlen, e.what());
        return nullptr;
    }
}

// dst: a buffer of N*K*OH*OW elements (NHWC); residual: the same shape, or null when created without.
// Returns 0, or 1 with oneDNN's reason in err.
int32_t af_dnnl_conv_execute(void* handle, const void* src, void* dst, const void* residual, char* err,
                             int64_t errlen) {
    auto* h = static_cast<Handle*>(handle);
    try {
        std::lock_guard<std::mutex> lock(h->mu);
        h->src.set_data_handle(const_cast<void*>(src));
        h->dst.set_data_handle(dst);
        if (residual != nullptr) h->res.set_data_handle(const_cast<void*>(residual));
        h->prim.execute(h->strm, h->args);
        h->strm.wait();
        return 0;
    } catch (const std::exception& e) {
        set_error(err, errlen, e.what());
        return 1;
    }
}

const char* af_dnnl_conv_impl(void* handle) { return static_cast<Handle*>(handle)->impl; }

void af_dnnl_conv_destroy(void* handle) { delete static_cast<Handle*>(handle); }

}  // extern "C"
