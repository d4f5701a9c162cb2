// Hopper's asynchronous copies and warpgroup MMA as inline PTX: cp.async (4-, 8- and 16-byte copies, commit / wait
// groups), wgmma (fence, commit / wait groups, bf16 m64n128k16 and m64n256k16 with A from registers), the K-major
// shared-memory descriptor and a 2-D TMA box load. Shared by the quantized tile GEMM (gemm_quant_tile.cu) and the
// experiment it was grown in (bench/cuda/experiments/quant_prefill_tile.cu). wgmma and cp.async.bulk.tensor exist on
// sm_90a only: call these from code compiled for sm_90a alone (a kernel body under __CUDA_ARCH_FEAT_SM90_ALL, or a
// target built for sm_90a only). Inline, so a translation unit (or a compute_90 pass) that calls none of them compiles
// none of them.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace tessera::cuda::detail {

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// 8- and 4-byte copies (cp.async.ca: .cg takes 16 bytes only); src and dst aligned to the size.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving the accumulators across the points where no wgmma is in flight (attn_prefill_tma.cu).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// K-major operand, 128-byte swizzle: LBO unused (1), SBO = 1,024 B between groups of 8 rows (attn_prefill_tma.cu's).
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// A box of a 2-D tensor map (at column c0, row r0) by TMA, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int r0, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(bar)
      : "memory");
}

// The accumulator operands of a wgmma asm statement: "+f"(d[0]) .. "+f"(d[N - 1]), and below, its registers in the
// instruction: "{%0, %1, .., %N - 1}". Left defined for an includer's own wgmma forms (the experiment's wgmma_ss_n256).
#define TESSERA_WGMMA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define TESSERA_WGMMA_F16(i) \
  TESSERA_WGMMA_F4(i), TESSERA_WGMMA_F4(i + 4), TESSERA_WGMMA_F4(i + 8), TESSERA_WGMMA_F4(i + 12)
#define TESSERA_WGMMA_D64 TESSERA_WGMMA_F16(0), TESSERA_WGMMA_F16(16), TESSERA_WGMMA_F16(32), TESSERA_WGMMA_F16(48)
#define TESSERA_WGMMA_D128 \
  TESSERA_WGMMA_D64, TESSERA_WGMMA_F16(64), TESSERA_WGMMA_F16(80), TESSERA_WGMMA_F16(96), TESSERA_WGMMA_F16(112)

#define TESSERA_WGMMA_ACC64                                                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define TESSERA_WGMMA_ACC128                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, "  \
  "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "  \
  "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "  \
  "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// D[64 x 128] += A[64 x 16] (registers, the m16n8k16 A layout per warp) · B (shared, K-major, 128-byte swizzle); bf16
// inputs, f32 accumulation.
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TESSERA_WGMMA_ACC64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : TESSERA_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// D[64 x 256] += A[64 x 16] · B, as wgmma_rs_n128.
__device__ __forceinline__ void wgmma_rs_n256(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " TESSERA_WGMMA_ACC128
      ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : TESSERA_WGMMA_D128
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

}  // namespace tessera::cuda::detail
