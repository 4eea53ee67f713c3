// The grouped MoE GEMMs of the fp8 ws path in CUDA, with A shared across a cluster of MC CTAs
// by TMA multicast (device probe for issue 12; README.md). Same inputs, outputs and numbers as
// the Gluon 64-column forms of moerun/backends/triton/fp8_ws.py, so moe_probe.py can put them
// in the shipped call's place (moe_align, quantize_rows_fp8, gather_rows_fp8 before; the
// intermediate's quantize_rows_fp8 between; moe_sum after).
//
// Legend as fp8_ws.py: R aligned rows (the alignment's static bound; the first num_post[0] in
// use, 128 per block, block b of expert expert_ids[b]), S slots, H hidden, I intermediate,
// P = M * K pairs; sorted_ids[r] is row r's pair (P in padding rows).
//
// KIND 0, gate/up: act[r, j] = silu(g) * u for 64 intermediate columns j per tile, with
//   g = sum_k a_s[r, k] * gs[e, j / 128, k] * (A_k . W13[e, j]_k) and u the same over the up
//   row I + j: one m64n128 wgmma chain per consumer over [64 gate | 64 up] weight rows, each
//   half promoted with its own block scale. A [R, H] e4m3 and a_s [R, H/128] fp32 (the
//   gathered rows), W13 viewed [S * 2I, H], gs [S, 2I/128, H/128]; act [R, I] bf16.
// KIND 1, down: y[r, n] = w[sorted_ids[r]] * sum_k a_s[r, k] * ds[e, n / 128, k] *
//   (A_k . W2[e, n]_k) for 128 hidden columns per tile (w = 0 in padding rows). A [R, I] e4m3
//   and a_s [R, I/128] (the quantized intermediate), W2 viewed [S * H, I], ds [S, H/128,
//   I/128]; y [R, H] bf16 in aligned order (moe_sum reads it through the pair-to-row map).
//
// Schedule as fp8_mc_gemm.cu (persistent, one TMA producer thread, two 64-row consumer warp
// groups, STAGES stages of 32 KB, GROUP_M tile order over blocks, the epilogue through
// shared memory and TMA stores). With MC > 1 the cluster's CTAs take MC neighbouring N tiles
// of the same block, which always share their rows (and expert): each loads 128 / MC rows of A
// into every CTA. The number of blocks is read on the device (num_post), so the grid is the
// persistent one and a graph replay sees the routing of its own call. Padding rows are
// computed like the others (their A rows and scales are zero; down's weight there is 0).
//
// BF16 (entry point bf16_mc_moe; issue 11): the same kernels for bf16 rows and weights with no
// scales. A stage holds 64 columns (128 bytes a row, the same 32 KB), four m64n128k16 bf16
// wgmmas a step accumulating in acc across the whole K loop with one stage's group in flight;
// A is the unquantized gathered rows (gate/up) or act itself (down).
//
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
//          -o fp8_mc_moe.so fp8_mc_moe.cu

#include <cstdlib>

#include "mc_common.cuh"

namespace {

constexpr int GATE_UP = 0;
constexpr int DOWN = 1;

template <int MC, int STAGES, int KIND, bool BF16>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    moe_kernel(const __grid_constant__ CUtensorMap map_a,
               const __grid_constant__ CUtensorMap map_b,
               const __grid_constant__ CUtensorMap map_c, const float* __restrict__ a_s,
               int a_s_stride, const float* __restrict__ w_s, const int* __restrict__ sorted_ids,
               const int* __restrict__ expert_ids, const int* __restrict__ num_post,
               const float* __restrict__ topk_w, int num_pairs, int K, int inter, int hidden) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t c_stage0 = base + STAGES * STAGE_BYTES;
  const uint32_t full0 = c_stage0 + C_STAGE_BYTES;
  const uint32_t empty0 = full0 + STAGES * 8;

  const int wg = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  const uint32_t rank = MC > 1 ? cluster_rank() : 0;

  init_ring<MC, STAGES>(full0, empty0);

  // N tiles: 64 intermediate columns (gate/up) or 128 hidden columns (down)
  const int n_tiles = KIND == GATE_UP ? inter / 64 : hidden / BN;
  const int grid_m = num_post[0] / BM;
  const int grid_np = n_tiles / MC;
  const int tiles = grid_m * grid_np;
  const int cluster = blockIdx.x / MC;
  const int clusters = gridDim.x / MC;
  constexpr int KE = BF16 ? BK / 2 : BK;  // K elements per stage (128 bytes a row)
  const int k_steps = K / KE;
  const int rows_per_expert = KIND == GATE_UP ? 2 * inter : hidden;  // weight rows per slot

  if (wg == 2) {
    if (threadIdx.x == 256) {
      uint32_t it = 0;
      for (int t = cluster; t < tiles; t += clusters) {
        int m, np;
        tile_of(t, grid_m, grid_np, m, np);
        const int n = np * MC + static_cast<int>(rank);
        const int w_row = expert_ids[m] * rows_per_expert + n * (KIND == GATE_UP ? 64 : BN);
        for (int k = 0; k < k_steps; ++k, ++it) {
          uint32_t full;
          const uint32_t a_dst = producer_acquire<STAGES>(it, base, full0, empty0, &full);
          load_a<MC>(a_dst, &map_a, full, k * KE, m * BM, rank);
          if (KIND == GATE_UP) {  // 64 gate rows, then the 64 up rows `inter` further
            tma_load(a_dst + A_BYTES, &map_b, full, k * KE, w_row);
            tma_load(a_dst + A_BYTES + B_BYTES / 2, &map_b, full, k * KE, w_row + inter);
          } else {
            tma_load(a_dst + A_BYTES, &map_b, full, k * KE, w_row);
          }
        }
      }
    }
  } else {
    const int warp = (threadIdx.x % 128) / 32;
    const int r_in = wg * 64 + warp * 16 + lane / 4;
    const int kb = K / BK;
    uint32_t it = 0;
    float acc[64];
    float d[64];  // fp8: a step's product before its promotion into acc
    for (int t = cluster; t < tiles; t += clusters) {
      int m, np;
      tile_of(t, grid_m, grid_np, m, np);
      const int n = np * MC + static_cast<int>(rank);
      const int e = expert_ids[m];
      const int row0 = m * BM + r_in;
      if constexpr (BF16) {
        // no scales: the wgmmas accumulate in acc across the K steps, one stage's group kept
        // in flight while the next is issued; a slot is released once its group finished
        for (int k = 0; k < k_steps; ++k, ++it) {
          const uint32_t stage = consumer_acquire<STAGES>(it, base, full0);
          issue_stage<true>(acc, stage + wg * A_HALF_BYTES, stage + A_BYTES, k > 0);
          wgmma_wait_one();
          fence_operands(acc);
          if (k > 0) release_stage<MC>(empty0 + 8 * ((it - 1) % STAGES), lane);
        }
        wgmma_wait_all();
        fence_operands(acc);
        release_stage<MC>(empty0 + 8 * ((it - 1) % STAGES), lane);
      } else {
        const float* sa_p0 = a_s + static_cast<size_t>(row0) * a_s_stride;
        const float* sa_p1 = sa_p0 + static_cast<size_t>(8) * a_s_stride;
        // weight-scale rows: gate/up: the gate block of columns n*64 and the up block I + n*64
        // ([S, 2I/128, H/128]); down: block n ([S, H/128, I/128])
        const int wblocks = rows_per_expert / 128;
        const float* sw0 = w_s + (static_cast<size_t>(e) * wblocks +
                                  (KIND == GATE_UP ? (n * 64) / 128 : n)) * kb;
        const float* sw1 = KIND == GATE_UP ? sw0 + static_cast<size_t>(inter / 128) * kb : sw0;
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.f;
        float sa0 = sa_p0[0], sa1 = sa_p1[0], sg = sw0[0], su = sw1[0];
        for (int k = 0; k < k_steps; ++k, ++it) {
          const int kn = k + 1 < k_steps ? k + 1 : k;
          const float nsa0 = sa_p0[kn], nsa1 = sa_p1[kn], nsg = sw0[kn], nsu = sw1[kn];
          const uint32_t stage = consumer_acquire<STAGES>(it, base, full0);
          mma_stage<MC>(d, stage + wg * A_HALF_BYTES, stage + A_BYTES,
                        empty0 + 8 * (it % STAGES), lane);
          // fragment i: column 8 * (i >> 2) + 2 * (lane % 4) + (i & 1), row +8 when i & 2;
          // gate/up: columns 0-63 (i < 32) are gate, 64-127 up
          const float g0 = sa0 * sg, g1 = sa1 * sg, u0 = sa0 * su, u1 = sa1 * su;
#pragma unroll
          for (int i = 0; i < 64; ++i) {
            const bool up = KIND == GATE_UP && i >= 32;
            acc[i] += d[i] * ((i & 2) ? (up ? u1 : g1) : (up ? u0 : g0));
          }
          sa0 = nsa0;
          sa1 = nsa1;
          sg = nsg;
          su = nsu;
        }
      }
      // epilogue through shared memory: gate/up one [64, 64] box per consumer (silu(g) * u),
      // down two (times the pair's routing weight)
      const uint32_t c_stage = c_stage0 + wg * (C_STAGE_BYTES / 2);
      const bool leader = (threadIdx.x % 128) == 0;
      if (leader) bulk_wait_read();
      named_barrier(1 + wg, 128);
      const int r = warp * 16 + lane / 4;
      if (KIND == GATE_UP) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t at = c_stage + r * 128 + ((j ^ (lane / 4)) * 16) + (lane % 4) * 4;
          float v[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float g = acc[4 * j + q];
            v[q] = __fdividef(g, 1.f + __expf(-g)) * acc[4 * j + q + 32];
          }
          __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
          __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
          st_shared_b32(at, *reinterpret_cast<uint32_t*>(&lo));
          st_shared_b32(at + 8 * 128, *reinterpret_cast<uint32_t*>(&hi));
        }
      } else {
        const int p0 = sorted_ids[row0], p1 = sorted_ids[row0 + 8];
        const float w0 = p0 < num_pairs ? topk_w[p0] : 0.f;
        const float w1 = p1 < num_pairs ? topk_w[p1] : 0.f;
        stage_tile_bf16(c_stage, acc, r, lane, w0, w1);
      }
      fence_proxy_async();
      named_barrier(1 + wg, 128);
      if (leader) {
        const int row = m * BM + wg * 64;
        if (KIND == GATE_UP) {
          tma_store(&map_c, c_stage, n * 64, row);
        } else {
          tma_store(&map_c, c_stage, n * BN, row);
          tma_store(&map_c, c_stage + 8192, n * BN + 64, row);
        }
        bulk_commit();
      }
    }
    if ((threadIdx.x % 128) == 0) bulk_wait_all();
  }
  if (MC > 1) cluster_sync();
}

template <int MC, int STAGES, int KIND, bool BF16>
int launch(const void* a, const float* a_s, int a_s_stride, const void* w, const float* w_s,
           const int* sorted_ids, const int* expert_ids, const int* num_post,
           const float* topk_w, int num_pairs, void* out, int R, int H, int I, int S,
           cudaStream_t stream, int* ctas_used) {
  const int K = KIND == GATE_UP ? H : I;
  const int out_cols = KIND == GATE_UP ? I : H;
  const int w_rows = S * (KIND == GATE_UP ? 2 * I : H);
  constexpr int KE = BF16 ? BK / 2 : BK, ELEM = BF16 ? 2 : 1;  // a box row is 128 bytes
  CUtensorMap ma, mb, mo;
  int e = make_map(&ma, a, R, K, MC > 1 ? BM / MC : 64, KE, ELEM);
  if (e) return e;
  e = make_map(&mb, w, w_rows, K, KIND == GATE_UP ? 64 : BN, KE, ELEM);
  if (e) return e;
  e = make_map(&mo, out, R, out_cols, 64, 64, 2);
  if (e) return e;
  const int smem = STAGES * STAGE_BYTES + C_STAGE_BYTES + 1024 + 2 * STAGES * 8;
  // MC_MOE_GRID=tiles: one cluster per tile of the static bound (R / BM row blocks), launched
  // in tile order, so an expert's row blocks run side by side and share each weight tile in
  // L2 (the persistent grid's CTAs drift apart; Nsight Compute, 2026-12-06: the bf16 gate/up
  // read its weights about three times from DRAM). Clusters past the routed tiles exit.
  const char* grid = getenv("MC_MOE_GRID");
  const int ctas = grid && grid[0] == 't' ? (R / BM) * (out_cols / (KIND == GATE_UP ? 64 : BN))
                                          : 0;
  return launch_persistent<MC>(moe_kernel<MC, STAGES, KIND, BF16>, smem, ctas, stream, ctas_used,
                               ma, mb, mo, a_s, a_s_stride, w_s, sorted_ids, expert_ids, num_post,
                               topk_w, num_pairs, K, I, H);
}

// The form named by (kind, mc, stages), or -100 (a size the tiles do not divide) or -101 (an
// unbuilt form).
template <bool BF16>
int dispatch(int kind, const void* a, const float* a_s, int a_s_stride, const void* w,
             const float* w_s, const int* sorted_ids, const int* expert_ids,
             const int* num_post, const float* topk_w, int num_pairs, void* out, int R, int H,
             int I, int S, int mc, int stages, void* stream, int* ctas_used) {
  if (R % BM || H % BN || I % BN || (mc != 1 && mc != 2 && mc != 4)) return -100;
  if ((kind == GATE_UP ? I / 64 : H / BN) % mc) return -100;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define MOERUN_CASE(MC_, ST_, KIND_)                                                      \
  if (mc == MC_ && stages == ST_ && kind == KIND_)                                        \
    return launch<MC_, ST_, KIND_, BF16>(a, a_s, a_s_stride, w, w_s, sorted_ids,          \
                                         expert_ids, num_post, topk_w, num_pairs, out, R, \
                                         H, I, S, st, ctas_used);
#define MOERUN_KINDS(MC_, ST_) MOERUN_CASE(MC_, ST_, GATE_UP) MOERUN_CASE(MC_, ST_, DOWN)
  MOERUN_KINDS(1, 4) MOERUN_KINDS(1, 6) MOERUN_KINDS(2, 4) MOERUN_KINDS(2, 6)
  MOERUN_KINDS(4, 4) MOERUN_KINDS(4, 6)
#undef MOERUN_KINDS
#undef MOERUN_CASE
  return -101;
}

}  // namespace

// C ABI for ctypes. kind 0: gate/up (a [R, H] e4m3 gathered rows, w = W13 [S, 2I, H], out =
// act [R, I] bf16; topk_w unused); kind 1: down (a [R, I] e4m3, w = W2 [S, H, I], out = y
// [R, H] bf16). mc 1, 2 or 4; stages 4 or 6. Returns 0 or a code naming the failed step
// (-100: a size the tiles do not divide; -101: an unbuilt form; see launch / make_map).
extern "C" int fp8_mc_moe(int kind, const void* a, const float* a_s, int a_s_stride,
                          const void* w, const float* w_s, const int* sorted_ids,
                          const int* expert_ids, const int* num_post, const float* topk_w,
                          int num_pairs, void* out, int R, int H, int I, int S, int mc,
                          int stages, void* stream, int* ctas_used) {
  return dispatch<false>(kind, a, a_s, a_s_stride, w, w_s, sorted_ids, expert_ids, num_post,
                         topk_w, num_pairs, out, R, H, I, S, mc, stages, stream, ctas_used);
}

// The bf16 pair (issue 11's prefill cells): a [R, H] bf16 gathered rows (gate/up) or act
// [R, I] bf16 (down), w bf16, no scales; otherwise as fp8_mc_moe.
extern "C" int bf16_mc_moe(int kind, const void* a, const void* w, const int* sorted_ids,
                           const int* expert_ids, const int* num_post, const float* topk_w,
                           int num_pairs, void* out, int R, int H, int I, int S, int mc,
                           int stages, void* stream, int* ctas_used) {
  return dispatch<true>(kind, a, nullptr, 0, w, nullptr, sorted_ids, expert_ids, num_post,
                        topk_w, num_pairs, out, R, H, I, S, mc, stages, stream, ctas_used);
}
