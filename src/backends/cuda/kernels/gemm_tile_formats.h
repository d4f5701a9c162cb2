// Every format's TileFormat (gemm_quant_tile.h has the contract and q4_K's): the tile GEMM (gemm_quant_tile.cu) and its
// host tests include this header, so that a format has its tile kernel exactly where its specialization is visible.
//  - gemm_tile_kquant.h: q5_K, q6_K;
//  - gemm_tile_blocks.h: q5_0, q5_1, iq4_nl (32-element blocks, two per step) and iq4_xs;
//  - gemm_tile_low.h: q2_K, q3_K.
#pragma once

#include "backends/cuda/kernels/gemm_quant_tile.h"
#include "backends/cuda/kernels/gemm_tile_blocks.h"
#include "backends/cuda/kernels/gemm_tile_kquant.h"
#include "backends/cuda/kernels/gemm_tile_low.h"
