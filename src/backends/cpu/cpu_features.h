// Which x86 SIMD extensions this CPU has, and which kernel family the CPU backend uses (run-time dispatch: one
// binary runs everywhere; the scalar kernels always work).
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx_vnni = false;  // VEX-encoded vpdpbusd on 256-bit registers
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
};

// Detected once (cpuid + xgetbv, so an OS that does not save the wide registers disables them).
const CpuFeatures& cpu_features();

// Kernel families. Each implies AVX2 + FMA + F16C beyond SCALAR; AVX512_VNNI does not imply AVX-VNNI (Ice Lake has
// the first only), so a family is checked with isa_supported, and code that picks kernels tests the highest first.
enum class Isa : uint8_t {
  SCALAR = 0,       // portable C++, compiled for the baseline target
  AVX2 = 1,         // AVX2 + FMA + F16C
  AVX2_VNNI = 2,    // + AVX-VNNI (vpdpbusd on ymm): the quantized matmuls use it, everything else is AVX2
  AVX512_VNNI = 3,  // + AVX-512 F/BW/VL/VNNI: quantized matmuls on zmm (16 rows per register), the rest AVX2
};

// The best family this CPU can run.
Isa best_isa();
bool isa_supported(Isa isa);
// The family kernels use now: best_isa() unless set_active_isa chose another. Process-wide (the kernels dispatch on
// it at each call, so they need no options argument); set by CpuBackend from BackendOptions::isa (the `--cpu-isa`
// flag) and by the tests, which run every path.
Isa active_isa();
// Forces a family. Fails (tessera::Error) when the CPU cannot run `isa`.
void set_active_isa(Isa isa);
std::string_view isa_name(Isa isa);
// The family named by isa_name (scalar, avx2, avx2_vnni, avx512_vnni); tessera::Error for any other name.
Isa parse_isa(std::string_view name);

}  // namespace tessera::cpu
