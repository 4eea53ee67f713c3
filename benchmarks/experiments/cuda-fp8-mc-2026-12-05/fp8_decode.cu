// The fp8 decode expert call (a few tokens) in CUDA, two launches: a device probe for issue 12's
// T=1 cells (README.md). qwen3-30b-a3b T=1 is the fp8 matrix's lowest cell (0.407 of its
// floor, 21.2 µs for 8.6 µs of bytes on the H200, 2026-12-05); Nsight Compute had the shipped
// Triton gate/up at 52 % of DRAM peak and 9 % occupancy, its warps waiting on weight tiles.
// At the end, the same pair for bf16 weights (issue 11's T=1 cells: qwen3-30b-a3b T=1 bf16
// reads 0.702 of its floor, the model geomean 0.848 against 0.85).
//
// Legend: T tokens, K top-k, P = T * K pairs (p = t * K + j), S slots, H hidden, I
// intermediate; weights e4m3 with fp32 128 x 128 block scales (w13 [S, 2I, H], s13
// [S, 2I/128, H/128], w2 [S, H, I], s2 [S, H/128, I/128]); activations bf16.
//
// Kernel 1, gate/up: act[p, c] = silu(g) * u, g = x[t] . W13[e, c] and u = x[t] . W13[e, I + c]
//   block-scaled, e = ids[p]; act [P, I] bf16, unweighted (the shipped direct path's
//   intermediate). x[t] is quantized per 128-column group inside the launch, exactly as
//   moerun.quant.quantize_rows does (scale = max(amax, 1e-10) * fp32(1/448), codes =
//   e4m3(x / scale) with saturation, round to nearest even).
// Kernel 2, down: out[t, n] = sum_j w[t, j] * (q(act[p]) . W2[e, n]) block-scaled, with q the
//   same per-group quantization of the bf16 intermediate; out [T, H] bf16, the K pairs summed
//   in fp32 in a fixed order (deterministic).
//
// The product: mma.sync m16n8k32 e4m3 with fp32 accumulation (sm_89+), the weights as B (8
// weight rows = 8 output columns per mma) and the activation as A (row 0 live). A lane
// loads 16 contiguous bytes of one weight row per chunk of 64 columns, so a warp reads 8 rows
// x 64 bytes per load instruction; K is a sum, so the chunk's columns are assigned to the two
// mmas' k slots in the order the loads give them, and A is read from shared memory in the
// same order. Each 128-column group is one product in its own accumulator, then added to the
// running sums times its activation and weight scales (the block-scaled dot).
//
// Parallelism: every launch is a grid of small CTAs whose warps each take one set of 8 output
// columns and a share of K (the groups); all a warp's loads of a batch are issued before any
// is used, and the partial sums of a set's warps are added in shared memory in warp order.
// With PDL the down launch issues its first weight loads before waiting for the gate/up grid.
//
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
//          -o fp8_decode.so fp8_decode.cu

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace {

constexpr int G = 128;       // quantization group (columns)
constexpr int U = 4;         // groups per load batch
constexpr float QMAX = 448.f;
constexpr float EPS = 1e-10f;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ uint32_t cvt4_e4m3(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return (lo & 0xffffu) | (hi << 16);
}

// One warp quantizes 128 bf16 values (src) into 128 codes (dst, shared) and returns the
// scale (every lane): lane l takes values 4l..4l+3.
__device__ __forceinline__ float quantize_group(const __nv_bfloat16* __restrict__ src,
                                                uint8_t* dst, int lane) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src + 4 * lane);
  const __nv_bfloat162 v01 = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
  const __nv_bfloat162 v23 = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  const float2 f01 = __bfloat1622float2(v01);
  const float2 f23 = __bfloat1622float2(v23);
  float amax = fmaxf(fmaxf(fabsf(f01.x), fabsf(f01.y)), fmaxf(fabsf(f23.x), fabsf(f23.y)));
  amax = warp_max(amax);
  // times the fp32 reciprocal, as moerun.quant defines it (torch on CUDA divides by a number
  // that way); the exact quotient differs in the last bit for about half the groups, and that
  // flips e4m3 codes on rounding ties: the 1-2.5 % of the first run (H100, 2026-12-05)
  const float scale = fmaxf(amax, EPS) * (1.f / QMAX);
  *reinterpret_cast<uint32_t*>(dst + 4 * lane) =
      cvt4_e4m3(f01.x / scale, f01.y / scale, f23.x / scale, f23.y / scale);
  return scale;
}

// Prefetch `bytes` (a multiple of 16) from `src` into L2 (a bulk copy to no destination).
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// d += A(16x32, e4m3, rows 8-15 zero) * B(32x8, e4m3); fp32.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// d += A(16x16, bf16, rows 8-15 zero) * B(16x8, bf16); fp32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// bf16: the dot of 8 weight rows with one activation row over chunks [c_begin, c_end) of 32
// columns (64 bytes): lane (g, q) loads row g's 8 values at 32 c + 8 q; one accumulator, times
// `extra` at the end, into sums[0..1] (columns 2q, 2q + 1). The activation row is read
// from global memory (L1 after its first use).
__device__ __forceinline__ void dot8_bf16(const __nv_bfloat16* __restrict__ wrow,
                                          const __nv_bfloat16* __restrict__ xrow, float extra,
                                          int c_begin, int c_end, int lane, float (&sums)[2]) {
  constexpr int UB = 2 * U;  // chunks per load batch (the fp8 form's bytes per batch)
  const int q = lane % 4;
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  for (int c0 = c_begin; c0 < c_end; c0 += UB) {
    uint4 w[UB];
#pragma unroll
    for (int u = 0; u < UB; ++u) {
      const int c = c0 + u;
      w[u] = c < c_end ? __ldg(reinterpret_cast<const uint4*>(wrow + 32 * c + 8 * q))
                       : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UB; ++u) {
      const int c = c0 + u;
      if (c < c_end) {
        const uint4 x = __ldg(reinterpret_cast<const uint4*>(xrow + 32 * c + 8 * q));
        mma_bf16(d, x.x, x.y, w[u].x, w[u].y);
        mma_bf16(d, x.z, x.w, w[u].z, w[u].w);
      }
    }
  }
  sums[0] += d[0] * extra;
  sums[1] += d[1] * extra;
}

// The scaled dot of 8 weight rows with one activation row over groups [g_begin, g_end):
// lane (g = lane / 4, q = lane % 4) loads row g's 16 bytes at 64 * c + 16 * q of each group's
// two chunks c; returns in sums[0..1] the running sums of columns 2q and 2q + 1 (row 0 of the
// mma's A; every lane holds them). `wrow`: this lane's weight row; `xq`/`xs`: the activation
// codes and group scales (shared); `ws`: the 8 rows' weight-scale row (one per group);
// `extra`: a factor on every group's scale (the routing weight, or 1).
__device__ __forceinline__ void dot8(const uint8_t* __restrict__ wrow, const uint8_t* xq,
                                     const float* xs, const float* __restrict__ ws, float extra,
                                     int g_begin, int g_end, int lane, float (&sums)[2]) {
  const int q = lane % 4;
  for (int g0 = g_begin; g0 < g_end; g0 += U) {
    uint4 w[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of the batch first
      const int g = g0 + u;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        w[u][c] = g < g_end ? __ldg(reinterpret_cast<const uint4*>(wrow + G * g + 64 * c +
                                                                   16 * q))
                            : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int g = g0 + u;
      if (g < g_end) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const uint4 x = *reinterpret_cast<const uint4*>(xq + G * g + 64 * c + 16 * q);
          mma_e4m3(d, x.x, x.y, w[u][c].x, w[u][c].y);
          mma_e4m3(d, x.z, x.w, w[u][c].z, w[u][c].w);
        }
        const float s = xs[g] * __ldg(ws + g) * extra;
        sums[0] += d[0] * s;
        sums[1] += d[1] * s;
      }
    }
  }
}

// The epilogue of a gate/up column set shared by KS warps: each warp's lanes 0-3 put their
// two columns' gate and up sums in `part` ([RS][KS][8][2]); after the block barrier, lane c
// (< 8) of the set's first warp adds the KS shares in warp order and writes
// act[p, c0 + c] = silu(g) * u in bf16. Every thread of the block calls it.
template <int KS>
__device__ __forceinline__ void gate_up_epilogue(float* part, int rs, int ks, int lane,
                                                 const float (&gs)[2], const float (&us)[2],
                                                 __nv_bfloat16* act_row, int c0) {
  if (lane < 4) {
    float* dst = part + ((rs * KS + ks) * 8 + 2 * lane) * 2;
    dst[0] = gs[0];
    dst[1] = us[0];
    dst[2] = gs[1];
    dst[3] = us[1];
  }
  __syncthreads();
  if (ks == 0 && lane < 8) {
    float g = 0.f, u = 0.f;
    for (int k = 0; k < KS; ++k) {
      const float* src = part + ((rs * KS + k) * 8 + lane) * 2;
      g += src[0];
      u += src[1];
    }
    act_row[c0 + lane] = __float2bfloat16_rn(g / (1.f + __expf(-g)) * u);
  }
}

// The epilogue of a down column set shared by KW warps: the shares of `part` ([RS][KW][8])
// added in warp order into out_row[n0 + c] (bf16). Every thread of the block calls it.
template <int KW>
__device__ __forceinline__ void down_epilogue(float* part, int rs, int kw, int lane,
                                              const float (&sums)[2], __nv_bfloat16* out_row,
                                              int n0) {
  if (lane < 4) {
    float* dst = part + (rs * KW + kw) * 8 + 2 * lane;
    dst[0] = sums[0];
    dst[1] = sums[1];
  }
  __syncthreads();
  if (kw == 0 && lane < 8) {
    float v = 0.f;
    for (int k = 0; k < KW; ++k) v += part[(rs * KW + k) * 8 + lane];
    out_row[n0 + lane] = __float2bfloat16_rn(v);
  }
}

// A down warp's share [u_begin, u_end) of its token's (pair, unit) work, `per_pair` units
// per pair: f(j, e, first, stop) for each run of units within one pair j whose slot e is valid
// (first, stop counted within the pair). ids_t: the token's K slot ids.
template <typename F>
__device__ __forceinline__ void for_pair_runs(int u_begin, int u_end, int per_pair,
                                              const int* ids_t, int slots, F&& f) {
  for (int u = u_begin; u < u_end;) {
    const int j = u / per_pair;
    const int stop = min(u_end, (j + 1) * per_pair);
    const int e = ids_t[j];
    if (e >= 0 && e < slots) f(j, e, u - j * per_pair, stop - j * per_pair);
    u = stop;
  }
}

// Before a down launch's PDL wait: the weight rows of the warp's first pair run start moving
// into L2 (one bulk prefetch per row, lane 4g: row n0 + g of W2[e], `row_bytes` each, units
// of `unit_bytes`). The weights do not depend on the gate/up grid, and reading ids here is
// safe: that grid triggers this launch only after its own wait, so the router's writes are
// visible by then.
__device__ __forceinline__ void prefetch_first_run(const uint8_t* w2, int hidden, int row_bytes,
                                                   int unit_bytes, int n0, int lane,
                                                   int u_begin, int u_end, int per_pair,
                                                   const int* ids_t, int slots) {
  if (u_begin >= u_end || lane % 4) return;
  const int j = u_begin / per_pair;
  const int stop = min(u_end, (j + 1) * per_pair);
  for_pair_runs(u_begin, stop, per_pair, ids_t, slots, [&](int, int e, int first, int last) {
    prefetch_l2(w2 + (static_cast<size_t>(e) * hidden + n0 + lane / 4) * row_bytes +
                    unit_bytes * first,
                unit_bytes * (last - first));
  });
}

// Kernel 1. grid (I / (8 * RS), P); block 32 * RS * KS: warp w takes column set w / KS (8
// intermediate columns, their gate and up rows) and the w % KS-th share of the H / 128 groups.
template <int RS, int KS, bool PDL>
__global__ void __launch_bounds__(32 * RS * KS, 1)
    gate_up_kernel(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w13,
                   const float* __restrict__ s13, const int* __restrict__ ids,
                   __nv_bfloat16* __restrict__ act, int top_k, int hidden, int inter,
                   int slots) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int groups = hidden / G;
  uint8_t* xq = smem;                                       // [H] codes
  float* xs = reinterpret_cast<float*>(smem + hidden);      // [H/128] scales
  float* part = xs + groups;                                // [RS][KS][8][2] partial sums
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int p = blockIdx.y;
  // ids and x may come from the launch just before (the router): nothing global is read
  // before the PDL wait
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  const int e = ids[p];
  if (e < 0 || e >= slots) return;  // an excluded pair: its row is not written (uniform)
  const int t = p / top_k;
  const int rs = warp / KS, ks = warp % KS;
  const int c0 = (blockIdx.x * RS + rs) * 8;  // this warp's 8 intermediate columns
  const size_t wrows = 2 * static_cast<size_t>(inter);
  const uint8_t* gate = w13 + (static_cast<size_t>(e) * wrows + c0 + lane / 4) * hidden;
  const uint8_t* up = gate + static_cast<size_t>(inter) * hidden;
  const int kb = groups;
  const float* sg = s13 + (static_cast<size_t>(e) * (wrows / G) + c0 / G) * kb;
  const float* su = sg + static_cast<size_t>(inter / G) * kb;
  const int per = (groups + KS - 1) / KS;
  const int g_begin = ks * per, g_end = min(groups, g_begin + per);
  // this warp's weight bytes start moving while x is read and quantized: one bulk L2
  // prefetch per row (lane 4g: gate row g, lane 4g + 1: up row g)
  if (g_begin < g_end && lane % 4 < 2) {
    prefetch_l2((lane % 4 ? up : gate) + G * g_begin, G * (g_end - g_begin));
  }
  for (int g = warp; g < groups; g += blockDim.x / 32) {
    const float s = quantize_group(x + static_cast<size_t>(t) * hidden + G * g, xq + G * g,
                                   lane);
    if (lane == 0) xs[g] = s;
  }
  __syncthreads();
  float gs[2] = {0.f, 0.f}, us[2] = {0.f, 0.f};
  dot8(gate, xq, xs, sg, 1.f, g_begin, g_end, lane, gs);
  dot8(up, xq, xs, su, 1.f, g_begin, g_end, lane, us);
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  gate_up_epilogue<KS>(part, rs, ks, lane, gs, us, act + static_cast<size_t>(p) * inter, c0);
}

// Kernel 2. grid (H / (8 * RS), T); block 32 * RS * KW: warp w takes column set w / KW (8
// hidden columns) and the w % KW-th share of the K * I / 128 (pair, group) units. The K act
// rows of the token are quantized into shared memory first.
template <int RS, int KW, bool PDL>
__global__ void __launch_bounds__(32 * RS * KW, 1)
    down_kernel(const __nv_bfloat16* __restrict__ act, const uint8_t* __restrict__ w2,
                const float* __restrict__ s2, const int* __restrict__ ids,
                const float* __restrict__ topk_w, __nv_bfloat16* __restrict__ out, int top_k,
                int hidden, int inter, int slots) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int groups = inter / G;
  uint8_t* aq = smem;                                               // [K][I] codes
  float* as = reinterpret_cast<float*>(smem + top_k * inter);        // [K][I/128]
  float* part = as + top_k * groups;                                 // [RS][KW][8]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.y;
  const int rs = warp / KW, kw = warp % KW;
  const int n0 = (blockIdx.x * RS + rs) * 8;
  const int units = top_k * groups;
  const int per = (units + KW - 1) / KW;
  const int u_begin = kw * per, u_end = min(units, u_begin + per);
  const int* ids_t = ids + t * top_k;
  prefetch_first_run(w2, hidden, inter, G, n0, lane, u_begin, u_end, groups, ids_t, slots);
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int u = warp; u < units; u += blockDim.x / 32) {
    const int j = u / groups, g = u % groups;
    const int e = ids[t * top_k + j];
    if (e < 0 || e >= slots) continue;  // act row not written: never read
    const float s = quantize_group(act + (static_cast<size_t>(t) * top_k + j) * inter + G * g,
                                   aq + j * inter + G * g, lane);
    if (lane == 0) as[j * groups + g] = s;
  }
  __syncthreads();
  float sums[2] = {0.f, 0.f};
  for_pair_runs(u_begin, u_end, groups, ids_t, slots, [&](int j, int e, int first, int stop) {
    const uint8_t* wrow = w2 + (static_cast<size_t>(e) * hidden + n0 + lane / 4) * inter;
    const float* ws = s2 + (static_cast<size_t>(e) * (hidden / G) + n0 / G) * groups;
    dot8(wrow, aq + j * inter, as + j * groups, ws, topk_w[t * top_k + j], first, stop, lane,
         sums);
  });
  down_epilogue<KW>(part, rs, kw, lane, sums, out + static_cast<size_t>(t) * hidden, n0);
}


// bf16 kernel 1 (issue 11's decode cells): act[p, c] = silu(x[t] . W13[e, c]) * (x[t] .
// W13[e, I + c]) in bf16, unweighted. grid (I / (8 * RS), P); block 32 * RS * KS: warp w takes
// column set w / KS and the w % KS-th share of the H / 32 chunks.
template <int RS, int KS, bool PDL>
__global__ void __launch_bounds__(32 * RS * KS, 1)
    gate_up_bf16_kernel(const __nv_bfloat16* __restrict__ x,
                        const __nv_bfloat16* __restrict__ w13, const int* __restrict__ ids,
                        __nv_bfloat16* __restrict__ act, int top_k, int hidden, int inter,
                        int slots) {
  __shared__ float part[RS * KS * 8 * 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int p = blockIdx.y;
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");  // ids, x: the launch before's
  const int e = ids[p];
  if (e < 0 || e >= slots) return;
  const int t = p / top_k;
  const int rs = warp / KS, ks = warp % KS;
  const int c0 = (blockIdx.x * RS + rs) * 8;
  const __nv_bfloat16* gate =
      w13 + (static_cast<size_t>(e) * 2 * inter + c0 + lane / 4) * hidden;
  const __nv_bfloat16* up = gate + static_cast<size_t>(inter) * hidden;
  const int chunks = hidden / 32;
  const int per = (chunks + KS - 1) / KS;
  const int k_begin = ks * per, k_end = min(chunks, k_begin + per);
  if (k_begin < k_end && lane % 4 < 2) {  // lane 4g: gate row g, lane 4g + 1: up row g
    prefetch_l2((lane % 4 ? up : gate) + 32 * k_begin, 64 * (k_end - k_begin));
  }
  float gs[2] = {0.f, 0.f}, us[2] = {0.f, 0.f};
  const __nv_bfloat16* xrow = x + static_cast<size_t>(t) * hidden;
  dot8_bf16(gate, xrow, 1.f, k_begin, k_end, lane, gs);
  dot8_bf16(up, xrow, 1.f, k_begin, k_end, lane, us);
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  gate_up_epilogue<KS>(part, rs, ks, lane, gs, us, act + static_cast<size_t>(p) * inter, c0);
}

// bf16 kernel 2: out[t, n] = sum_j w[t, j] * (act[p] . W2[e, n]). grid (H / (8 * RS), T);
// block 32 * RS * KW: warp w takes column set w / KW and the w % KW-th share of the
// K * I / 32 (pair, chunk) units. With PDL its first weights are prefetched into L2 before
// the wait.
template <int RS, int KW, bool PDL>
__global__ void __launch_bounds__(32 * RS * KW, 1)
    down_bf16_kernel(const __nv_bfloat16* __restrict__ act,
                     const __nv_bfloat16* __restrict__ w2, const int* __restrict__ ids,
                     const float* __restrict__ topk_w, __nv_bfloat16* __restrict__ out,
                     int top_k, int hidden, int inter, int slots) {
  __shared__ float part[RS * KW * 8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.y;
  const int rs = warp / KW, kw = warp % KW;
  const int n0 = (blockIdx.x * RS + rs) * 8;
  const int chunks = inter / 32;
  const int units = top_k * chunks;
  const int per = (units + KW - 1) / KW;
  const int u_begin = kw * per, u_end = min(units, u_begin + per);
  const int* ids_t = ids + t * top_k;
  prefetch_first_run(reinterpret_cast<const uint8_t*>(w2), hidden, 2 * inter, 64, n0, lane,
                     u_begin, u_end, chunks, ids_t, slots);
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  float sums[2] = {0.f, 0.f};
  for_pair_runs(u_begin, u_end, chunks, ids_t, slots, [&](int j, int e, int first, int stop) {
    const __nv_bfloat16* wrow = w2 + (static_cast<size_t>(e) * hidden + n0 + lane / 4) * inter;
    dot8_bf16(wrow, act + (static_cast<size_t>(t) * top_k + j) * inter, topk_w[t * top_k + j],
              first, stop, lane, sums);
  });
  down_epilogue<KW>(part, rs, kw, lane, sums, out + static_cast<size_t>(t) * hidden, n0);
}

// The launch config of a decode kernel: the programmatic-stream-serialization attribute
// (PDL) when `pdl`, kept in *attr.
cudaLaunchConfig_t pair_config(cudaStream_t stream, bool pdl, cudaLaunchAttribute* attr,
                               dim3 grid, dim3 block, size_t smem) {
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cfg;
}

// A warps-per-set knob with built kernels (by_knobs' cases).
bool built_knob(int n) { return n == 1 || n == 2 || n == 4 || n == 8; }

// launch(n, p) with the runtime warps-per-set knob `n` (1, 2, 4 or 8) and `pdl` as the
// compile-time constants the kernel templates take.
template <typename F>
cudaError_t by_knobs(int n, bool pdl, F&& launch) {
  const auto with = [&](auto nc) {
    return pdl ? launch(nc, std::true_type{}) : launch(nc, std::false_type{});
  };
  switch (n) {
    case 1: return with(std::integral_constant<int, 1>{});
    case 2: return with(std::integral_constant<int, 2>{});
    case 4: return with(std::integral_constant<int, 4>{});
    default: return with(std::integral_constant<int, 8>{});
  }
}


}  // namespace

// C ABI for ctypes. x [T, H] bf16, w13/s13, w2/s2, ids [T, K] int32, topk_w [T, K] fp32,
// act [T*K, I] bf16 (workspace), out [T, H] bf16. ks, kw: warps per column set sharing K
// (1, 2, 4 or 8); pdl: launch the down grid with programmatic stream serialization (it
// waits in-kernel). Returns 0 or a code naming the failed step.
extern "C" int fp8_decode(const void* x, const void* w13, const float* s13, const void* w2,
                          const float* s2, const int* ids, const float* topk_w, void* act,
                          void* out, int T, int K, int H, int I, int S, int ks, int kw, int pdl,
                          void* stream) {
  if (H % G || I % G || T < 1 || K < 1) return -100;
  if (!built_knob(ks) || !built_knob(kw)) return -101;
  const auto st = static_cast<cudaStream_t>(stream);
  constexpr int RS = 1;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* w13b = static_cast<const uint8_t*>(w13);
  const auto* w2b = static_cast<const uint8_t*>(w2);
  auto* actb = static_cast<__nv_bfloat16*>(act);
  auto* outb = static_cast<__nv_bfloat16*>(out);
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = pair_config(st, pdl, &attr, dim3(I / (8 * RS), T * K, 1),
                                       dim3(32 * RS * ks, 1, 1),
                                       H + (H / G) * 4 + RS * ks * 8 * 2 * 4);
  cudaError_t err = by_knobs(ks, pdl, [&](auto n, auto p) {
    return cudaLaunchKernelEx(&cfg, gate_up_kernel<RS, decltype(n)::value, decltype(p)::value>,
                              xb, w13b, s13, ids, actb, K, H, I, S);
  });
  if (err != cudaSuccess) return 1000 + static_cast<int>(err);
  const size_t down_smem = K * I + K * (I / G) * 4 + RS * kw * 8 * 4;
  if (down_smem > 48 * 1024) return -102;
  cfg = pair_config(st, pdl, &attr, dim3(H / (8 * RS), T, 1), dim3(32 * RS * kw, 1, 1),
                    down_smem);
  err = by_knobs(kw, pdl, [&](auto n, auto p) {
    return cudaLaunchKernelEx(&cfg, down_kernel<RS, decltype(n)::value, decltype(p)::value>,
                              actb, w2b, s2, ids, topk_w, outb, K, H, I, S);
  });
  return err == cudaSuccess ? 0 : 2000 + static_cast<int>(err);
}

// The bf16 pair (no scales): x [T, H], w13 [S, 2I, H], w2 [S, H, I] bf16; otherwise as
// fp8_decode. Returns 0 or a code naming the failed step.
extern "C" int bf16_decode(const void* x, const void* w13, const void* w2, const int* ids,
                           const float* topk_w, void* act, void* out, int T, int K, int H, int I,
                           int S, int ks, int kw, int pdl, void* stream) {
  if (H % 32 || I % 32 || T < 1 || K < 1) return -100;
  if (!built_knob(ks) || !built_knob(kw)) return -101;
  const auto st = static_cast<cudaStream_t>(stream);
  constexpr int RS = 1;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* w13b = static_cast<const __nv_bfloat16*>(w13);
  const auto* w2b = static_cast<const __nv_bfloat16*>(w2);
  auto* actb = static_cast<__nv_bfloat16*>(act);
  auto* outb = static_cast<__nv_bfloat16*>(out);
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = pair_config(st, pdl, &attr, dim3(I / (8 * RS), T * K, 1),
                                       dim3(32 * RS * ks, 1, 1), 0);
  cudaError_t err = by_knobs(ks, pdl, [&](auto n, auto p) {
    return cudaLaunchKernelEx(&cfg,
                              gate_up_bf16_kernel<RS, decltype(n)::value, decltype(p)::value>,
                              xb, w13b, ids, actb, K, H, I, S);
  });
  if (err != cudaSuccess) return 1000 + static_cast<int>(err);
  cfg = pair_config(st, pdl, &attr, dim3(H / (8 * RS), T, 1), dim3(32 * RS * kw, 1, 1), 0);
  err = by_knobs(kw, pdl, [&](auto n, auto p) {
    return cudaLaunchKernelEx(&cfg, down_bf16_kernel<RS, decltype(n)::value, decltype(p)::value>,
                              actb, w2b, ids, topk_w, outb, K, H, I, S);
  });
  return err == cudaSuccess ? 0 : 2000 + static_cast<int>(err);
}
