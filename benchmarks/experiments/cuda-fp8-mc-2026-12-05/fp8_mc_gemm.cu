// A block-scaled fp8 GEMM for Hopper with and without a 2-CTA cluster that multicasts the A
// tile (device probe for issue 12; benchmarks/experiments/cuda-fp8-mc-2026-12-05/README.md).
//
// C[M, N] (bf16) = sum_k sa[row, k] * sb[n / 128, k] * (A_k B_k^T), A [M, K] and B [N, K]
// e4m3 (K contiguous), K steps of 128 (one quantization group), sa stored [K/128, M]
// (M contiguous), sb [N/128, K/128]: DESIGN 11a's scales, as the Gluon probe
// (../gluon-2026-12-02/ws_gemm.py) takes them.
//
// The question: Nsight Compute has the Gluon ws kernels' tensor pipe busy 50-56 % of the cycles
// with L2 at 74-88 % of its peak; their 128 x 128 tile reads 32 KB of L2 per K step. Triton
// 3.6 cannot multicast a TMA copy ("NYI: Support multicast." in libtriton), so this probe is
// CUDA: the same tile and schedule (persistent, one TMA producer thread, two consumer warp
// groups of 64 rows, a ring of STAGES stages, each K step's wgmma result promoted into an fp32
// accumulator times the step's scales), built twice:
//   MC = 1: each CTA loads its own A and B tiles (the Gluon kernel's traffic);
//   MC = 2, 4: a cluster of MC CTAs computes MC neighbouring N tiles of the same 128 rows;
//           each CTA loads 128 / MC rows of A and multicasts them to all, so a CTA reads
//           16 / MC + 16 KB of L2 per K step instead of 32 (24 KB at MC = 2, 20 at MC = 4).
//   ALONG_M: the cluster's CTAs take MC neighbouring row blocks of one N tile and multicast
//           B instead (BN / MC weight rows each), the same L2 bytes per step; in a grouped
//           MoE GEMM that keeps the CTAs that read one expert's weight tile in step.
// A stage is refilled only when the consumers of every CTA of the cluster released it (the
// empty barrier counts one arrival per consumer warp of each CTA; lane j of a warp arrives
// on CTA j's).
//
// Written for this project (no code taken from elsewhere). Build (sm_90a, CUDA 12.x/13.0):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
//        -o fp8_mc_gemm.so fp8_mc_gemm.cu

#include "mc_common.cuh"

namespace {

// EPI_TMA: the epilogue stages each consumer's [64, 128] bf16 tile in shared memory (two
// [64, 64] boxes, 128-byte swizzle, so the 4-byte fragment stores hit 32 banks) and stores it
// with TMA, moving on while the copy drains; otherwise each thread stores its fragments to
// global memory directly.
// ALONG_M (MC > 1): the cluster's CTAs take MC neighbouring row blocks of the same N tile
// and share B instead: each loads BN / MC weight rows and multicasts them (the form that
// keeps the CTAs reading one expert's weight tile in step, in a grouped MoE GEMM).
template <int MC, int STAGES, bool EPI_TMA, bool ALONG_M>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    fp8_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                    const __grid_constant__ CUtensorMap map_b,
                    const __grid_constant__ CUtensorMap map_c, const float* __restrict__ sa_t,
                    const float* __restrict__ sb, __nv_bfloat16* __restrict__ c, int M, int N,
                    int K) {
  extern __shared__ uint8_t smem_raw[];
  // stages 1024-byte aligned (the 128-byte swizzle's atom), then the barriers
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t c_stage0 = base + STAGES * STAGE_BYTES;  // EPI_TMA: 2 x 16 KB
  const uint32_t full0 = c_stage0 + (EPI_TMA ? C_STAGE_BYTES : 0);  // STAGES x 8 bytes
  const uint32_t empty0 = full0 + STAGES * 8;          // STAGES x 8 bytes
  (void)smem;

  const int wg = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  const uint32_t rank = MC > 1 ? cluster_rank() : 0;

  init_ring<MC, STAGES>(full0, empty0);

  // tile groups: MC neighbouring N tiles of the same rows (or MC row blocks, ALONG_M)
  const int grid_mp = M / (BM * (ALONG_M ? MC : 1));
  const int grid_np = N / (BN * (ALONG_M ? 1 : MC));
  const int tiles = grid_mp * grid_np;
  const int cluster = blockIdx.x / MC;
  const int clusters = gridDim.x / MC;
  const int k_steps = K / BK;

  if (wg == 2) {  // producer: one thread issues every copy
    if (threadIdx.x == 256) {
      uint32_t it = 0;
      for (int t = cluster; t < tiles; t += clusters) {
        int mp, np;
        tile_of(t, grid_mp, grid_np, mp, np);
        const int m = ALONG_M ? mp * MC + static_cast<int>(rank) : mp;
        const int n = ALONG_M ? np : np * MC + static_cast<int>(rank);
        for (int k = 0; k < k_steps; ++k, ++it) {
          uint32_t full;
          const uint32_t a_dst = producer_acquire<STAGES>(it, base, full0, empty0, &full);
          const uint16_t all = static_cast<uint16_t>((1u << MC) - 1u);
          load_a<(ALONG_M ? 1 : MC)>(a_dst, &map_a, full, k * BK, m * BM, rank);
          if (MC > 1 && ALONG_M) {  // my BN / MC weight rows into every CTA of the cluster
            tma_load_multicast(a_dst + A_BYTES + rank * (B_BYTES / MC), &map_b, full, k * BK,
                               n * BN + static_cast<int>(rank) * (BN / MC), all);
          } else {
            tma_load(a_dst + A_BYTES, &map_b, full, k * BK, n * BN);
          }
        }
      }
    }
  } else {  // consumer warp group wg: rows [wg * 64, wg * 64 + 64) of each tile
    const int warp = (threadIdx.x % 128) / 32;
    const int r_in = wg * 64 + warp * 16 + lane / 4;  // this thread's rows: r_in, r_in + 8
    const int kb = K / BK;
    uint32_t it = 0;
    float acc[64];
    float d[64];
    for (int t = cluster; t < tiles; t += clusters) {
      int mp, np;
      tile_of(t, grid_mp, grid_np, mp, np);
      const int m = ALONG_M ? mp * MC + static_cast<int>(rank) : mp;
      const int n = ALONG_M ? np : np * MC + static_cast<int>(rank);
      const int row0 = m * BM + r_in;
      const float* sb_row = sb + static_cast<size_t>(n) * kb;
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.f;
      float sa0 = sa_t[row0], sa1 = sa_t[row0 + 8], sbk = sb_row[0];
      for (int k = 0; k < k_steps; ++k, ++it) {
        const int kn = k + 1 < k_steps ? k + 1 : k;  // next step's scales, loaded early
        const float nsa0 = sa_t[static_cast<size_t>(kn) * M + row0];
        const float nsa1 = sa_t[static_cast<size_t>(kn) * M + row0 + 8];
        const float nsb = sb_row[kn];
        const uint32_t stage = consumer_acquire<STAGES>(it, base, full0);
        mma_stage<MC>(d, stage + wg * A_HALF_BYTES, stage + A_BYTES,
                      empty0 + 8 * (it % STAGES), lane);
        const float s0 = sa0 * sbk;
        const float s1 = sa1 * sbk;
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += d[i] * ((i & 2) ? s1 : s0);
        sa0 = nsa0;
        sa1 = nsa1;
        sbk = nsb;
      }
      // epilogue: fragment (i) of m64nN: row r_in + 8 * ((i >> 1) & 1),
      // column 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)
      if (EPI_TMA) {
        const uint32_t c_stage = c_stage0 + wg * (C_STAGE_BYTES / 2);
        const bool leader = (threadIdx.x % 128) == 0;
        if (leader) bulk_wait_read();  // the previous tile's store has read the buffer
        named_barrier(1 + wg, 128);
        const int r = warp * 16 + lane / 4;  // row in the half; r % 8 == lane / 4
        stage_tile_bf16(c_stage, acc, r, lane, 1.f, 1.f);
        fence_proxy_async();
        named_barrier(1 + wg, 128);
        if (leader) {
          const int row = m * BM + wg * 64;
          tma_store(&map_c, c_stage, n * BN, row);
          tma_store(&map_c, c_stage + 8192, n * BN + 64, row);
          bulk_commit();
        }
      } else {
        __nv_bfloat16* c0 = c + static_cast<size_t>(row0) * N + n * BN + 2 * (lane % 4);
        __nv_bfloat16* c1 = c0 + static_cast<size_t>(8) * N;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<__nv_bfloat162*>(c0 + 8 * j) =
              __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
          *reinterpret_cast<__nv_bfloat162*>(c1 + 8 * j) =
              __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
    }
    if (EPI_TMA && (threadIdx.x % 128) == 0) bulk_wait_all();
  }
  if (MC > 1) cluster_sync();  // no CTA leaves while a peer may still write to it
}

template <int MC, int STAGES, bool EPI_TMA, bool ALONG_M>
int launch(const void* a, const void* b, const float* sa_t, const float* sb, void* c, int M,
           int N, int K, int ctas, cudaStream_t stream, int* ctas_used) {
  CUtensorMap ma, mb;  // A, B; C below
  int e = make_map(&ma, a, M, K, MC > 1 && !ALONG_M ? BM / MC : 64);
  if (e) return e;
  e = make_map(&mb, b, N, K, ALONG_M ? BN / MC : BN);
  if (e) return e;
  CUtensorMap mc_;
  e = make_map(&mc_, c, M, N, 64, 64, 2);
  if (e) return e;
  const int smem = STAGES * STAGE_BYTES + (EPI_TMA ? C_STAGE_BYTES : 0) + 1024 + 2 * STAGES * 8;
  return launch_persistent<MC>(fp8_gemm_kernel<MC, STAGES, EPI_TMA, ALONG_M>, smem, ctas,
                               stream, ctas_used, ma, mb, mc_, sa_t, sb,
                               reinterpret_cast<__nv_bfloat16*>(c), M, N, K);
}

}  // namespace

// C ABI for ctypes: mc 1, 2 or 4 CTAs per cluster, sharing A (along_m 0) or B (along_m 1);
// stages 4 or 6; epi_tma 0 (direct stores) or 1. Returns 0, or a code naming the failed
// step (see launch / make_map; -100: the shape or cluster, -101: an unbuilt form).
// ctas <= 0: the persistent grid (the SM count, or MC times the clusters that fit at once);
// the grid launched is written to *ctas_used.
extern "C" int fp8_mc_gemm(const void* a, const void* b, const float* sa_t, const float* sb,
                           void* c, int M, int N, int K, int mc, int along_m, int stages,
                           int epi_tma, int ctas, void* stream, int* ctas_used) {
  if (mc != 1 && mc != 2 && mc != 4) return -100;
  if (mc == 1) along_m = 0;
  if (M % (BM * (along_m ? mc : 1)) || N % (BN * (along_m ? 1 : mc)) || K % BK) return -100;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define MOERUN_CASE(MC_, ST_, E_, AM_)                                                    \
  if (mc == MC_ && stages == ST_ && (epi_tma != 0) == E_ && (along_m != 0) == AM_)      \
    return launch<MC_, ST_, E_, AM_>(a, b, sa_t, sb, c, M, N, K, ctas, st, ctas_used);
#define MOERUN_EPI(MC_, ST_, AM_) MOERUN_CASE(MC_, ST_, false, AM_) MOERUN_CASE(MC_, ST_, true, AM_)
  MOERUN_EPI(1, 4, false) MOERUN_EPI(1, 6, false)
  MOERUN_EPI(2, 4, false) MOERUN_EPI(2, 6, false) MOERUN_EPI(4, 4, false) MOERUN_EPI(4, 6, false)
  MOERUN_EPI(2, 4, true) MOERUN_EPI(2, 6, true) MOERUN_EPI(4, 4, true) MOERUN_EPI(4, 6, true)
#undef MOERUN_EPI
#undef MOERUN_CASE
  return -101;
}
