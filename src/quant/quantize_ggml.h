// GGML's reference quantizers, reproduced to the bit: the bytes llama-quantize writes for a tensor when it has no
// importance matrix (ggml_quantize_chunk with imatrix == nullptr). Each format's search (q4_K/q5_K's weighted
// min/scale fit, q6_K's scale sweep, iq4_nl's 15 tries) is written from GGML's description of it, keeping GGML's
// order of float operations: this file is compiled with -ffp-contract=off (src/CMakeLists.txt), since one fused
// multiply-add changes a rounding and with it a code.
//
// Unlike quant.h's quantize_row (Tessera's own fast K-quant quantizers, checked by error bounds), these are the slow,
// exact ones `tessera quantize` writes files with; tests/quant/test_quantize_ggml.cpp checks them against bytes
// produced by llama-quantize (python/make_quantize_golden.py).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tessera {

// The formats quantize_row_ggml produces: q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K, iq4_nl, tq1_0, tq2_0.
bool can_quantize_ggml(DType t);

// x [n] -> n / block_size blocks of `t` at y (dtype_row_bytes(t, n) bytes), as GGML's quantize_<t> without importance
// weights. Error when `t` is not one of the formats above or n is not a whole number of its blocks.
void quantize_row_ggml(DType t, const float* x, void* y, int64_t n);

}  // namespace tessera
