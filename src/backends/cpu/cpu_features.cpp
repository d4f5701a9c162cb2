#include "backends/cpu/cpu_features.h"

#include <atomic>
#include <string>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tessera::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  // xgetbv with ecx = 0; written as bytes so the file needs no -mxsave.
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(1, 0, a, b, c, d);
  const bool osxsave = (c >> 27) & 1;
  if (!osxsave) return f;
  const uint64_t xcr0 = read_xcr0();
  // The OS must save the ymm (bits 1-2) and, for AVX-512, opmask/zmm (bits 5-7) state, or using them corrupts tasks.
  const bool ymm_ok = (xcr0 & 0x6) == 0x6;
  const bool zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0;
  const bool avx = ((c >> 28) & 1) && ymm_ok;
  f.fma = avx && ((c >> 12) & 1);
  f.f16c = avx && ((c >> 29) & 1);
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = avx && ((b >> 5) & 1);
  f.avx512f = zmm_ok && ((b >> 16) & 1);
  f.avx512bw = f.avx512f && ((b >> 30) & 1);
  f.avx512vl = f.avx512f && ((b >> 31) & 1);
  f.avx512_vnni = f.avx512f && ((c >> 11) & 1);
  __cpuid_count(7, 1, a, b, c, d);
  f.avx_vnni = f.avx2 && ((a >> 4) & 1);
  f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(best_isa())};
  return slot;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (isa) {
    case Isa::SCALAR:
      return true;
    case Isa::AVX2:
      return avx2;
    case Isa::AVX2_VNNI:
      return avx2 && f.avx_vnni;
    case Isa::AVX512_VNNI:
      return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512_vnni;
  }
  return false;
}

Isa best_isa() {
  for (Isa isa : {Isa::AVX512_VNNI, Isa::AVX2_VNNI, Isa::AVX2})
    if (isa_supported(isa)) return isa;
  return Isa::SCALAR;
}

Isa active_isa() { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  TESSERA_CHECK(isa_supported(isa), "cpu backend: this CPU cannot run {} kernels (best is {})", isa_name(isa),
                isa_name(best_isa()));
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : {Isa::SCALAR, Isa::AVX2, Isa::AVX2_VNNI, Isa::AVX512_VNNI})
    if (name == isa_name(isa)) return isa;
  fail("cpu isa '{}' is unknown (scalar, avx2, avx2_vnni or avx512_vnni)", name);
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::SCALAR:
      return "scalar";
    case Isa::AVX2:
      return "avx2";
    case Isa::AVX2_VNNI:
      return "avx2_vnni";
    case Isa::AVX512_VNNI:
      return "avx512_vnni";
  }
  return "unknown";
}

}  // namespace tessera::cpu
