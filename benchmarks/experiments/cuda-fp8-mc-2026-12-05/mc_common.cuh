// Device primitives shared by the fp8 probes of this folder (fp8_mc_gemm.cu: dense;
// fp8_mc_moe.cu: the grouped MoE gate/up and down): tile constants, the persistent tile order,
// mbarriers, TMA copies (multicast included) and stores, the wgmma descriptor and the e4m3
// m64n128k32 wgmma, and the host-side tensor-map encoder. Written for this project from the
// PTX ISA (sm_90a). Everything is in an anonymous namespace: each .cu that includes it is
// one shared object.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace {

constexpr int BM = 128;                 // rows per tile: two consumer warp groups of 64
constexpr int BN = 128;                 // columns per tile: one weight-scale block
constexpr int BK = 128;                 // K per step: one quantization group (bytes: e4m3)
constexpr int A_HALF_BYTES = 64 * BK;   // 8 KB
constexpr int A_BYTES = BM * BK;        // 16 KB
constexpr int B_BYTES = BN * BK;        // 16 KB
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int C_STAGE_BYTES = BM * BN * 2;  // bf16 tile staged for the TMA store (EPI_TMA)
constexpr int NUM_THREADS = 384;        // warp groups 0, 1: consumers; 2: producer
constexpr int GROUP_M = 8;              // tile order: GROUP_M row blocks per run over N

// Persistent tile t -> (row block, tile group): GROUP_M row blocks share each run over the
// N tile groups, so the programs in flight read the same A and B tiles close in time (L2);
// the Gluon probe's order.
__device__ __forceinline__ void tile_of(int t, int grid_mp, int grid_np, int& mp, int& np) {
  const int width = GROUP_M * grid_np;
  const int gid = t / width;
  const int size = min(grid_mp - gid * GROUP_M, GROUP_M);
  mp = gid * GROUP_M + (t % size);
  np = (t % width) / size;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

#ifdef MC_WATCHDOG
// The check builds (-DMC_WATCHDOG): a wait still open after 10 s is a protocol bug (a wrong
// parity, count or byte total), not a slow peer, so the thread records the barrier in
// host-mapped memory (`mc_watchdog_arm`; the host can read it after the fault) and traps; a
// check then names it in seconds instead of spinning to its call's timeout. The clock and its
// state live in a function that is not inlined and that only a wait whose first try fails
// enters. No printf: a call to it inside the kernel makes ptxas serialize every wgmma of the
// kernel (C7510), which would leave the pipelining the timing builds run unchecked.
constexpr uint64_t WATCHDOG_NS = 10ull * 1000 * 1000 * 1000;
__device__ uint32_t* watchdog_slot = nullptr;  // [4]: block, thread, barrier, parity + 1

__device__ __noinline__ void mbar_wait_slow(uint32_t bar, uint32_t parity) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (uint32_t tries = 1; !mbar_try_wait(bar, parity); ++tries) {
    if (tries % 256) continue;
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > WATCHDOG_NS) {
      volatile uint32_t* w = watchdog_slot;
      if (w != nullptr) {
        w[0] = blockIdx.x;
        w[1] = threadIdx.x;
        w[2] = bar;
        w[3] = parity + 1;
        __threadfence_system();
      }
      __trap();
    }
  }
}
#endif

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef MC_WATCHDOG
  if (!mbar_try_wait(bar, parity)) mbar_wait_slow(bar, parity);
#else
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Arrive on the mbarrier at offset `bar` of CTA `cta` of this cluster (this CTA included).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                         int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// The same box into the same shared-memory offset of every CTA in `mask`, each CTA's
// mbarrier at offset `bar` receiving the bytes written there.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map,
                                                   uint32_t bar, int c0, int c1,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// The committed bulk stores have finished reading shared memory (their source may be reused).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Generic-proxy shared-memory writes made visible to the async proxy (the TMA store).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void named_barrier(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// wgmma shared-memory descriptor of a K-major tile written by TMA with the 128-byte swizzle:
// rows of 128 bytes, 8-row atoms of 1024 bytes (stride byte offset), the leading byte offset
// unused for this layout; the start address moves by 32 bytes per k32 sub-step.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;
  d |= static_cast<uint64_t>(1024 >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// All but the newest committed wgmma group have finished.
__device__ __forceinline__ void wgmma_wait_one() {
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}
// Pins a register's value at this point of the program (the wgmma writes it asynchronously).
__device__ __forceinline__ void fence_operand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}

// The 64 fp32 accumulator registers of an m64n128 wgmma as asm operands %0-%63 (read and
// written), and the template of their brace list; the descriptors are %64, %65 and the
// accumulate flag %66.
#define MC_WGMMA_D_LIST                                                                       \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "    \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "    \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "    \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MC_WGMMA_D_OPERANDS(d)                                                                \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),       \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),            \
      "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),         \
      "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),         \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),         \
      "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),         \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),         \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),         \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),         \
      "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),         \
      "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" MC_WGMMA_D_LIST
      "}, %64, %65, p, 1, 1;\n}\n"
      : MC_WGMMA_D_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The bf16 form (both operands K-major: no transposes); its k16 step is 32 bytes too.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MC_WGMMA_D_LIST
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MC_WGMMA_D_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The ring's barriers, initialised by thread 0 and made visible to the cluster's CTAs before
// any copy or remote arrival: full[s] (one arrival, the producer's, plus the stage's bytes)
// and empty[s] (one arrival per consumer warp of each of the MC CTAs). Every thread calls it.
template <int MC, int STAGES>
__device__ __forceinline__ void init_ring(uint32_t full0, uint32_t empty0) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 8 * MC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (MC > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
}

// The producer's stage number `it` (a running count over the launch): waits until every
// consumer released the ring slot, arms its full barrier for the stage's bytes; returns the
// slot's shared address and its full barrier (*full).
template <int STAGES>
__device__ __forceinline__ uint32_t producer_acquire(uint32_t it, uint32_t base, uint32_t full0,
                                                     uint32_t empty0, uint32_t* full) {
  const uint32_t s = it % STAGES;
  mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1u) ^ 1u);
  *full = full0 + 8 * s;
  mbar_expect_tx(*full, STAGE_BYTES);
  return base + s * STAGE_BYTES;
}

// A consumer's stage number `it`: waits until the slot's bytes have landed; returns the slot's
// shared address (A halves first, then B at A_BYTES).
template <int STAGES>
__device__ __forceinline__ uint32_t consumer_acquire(uint32_t it, uint32_t base,
                                                     uint32_t full0) {
  const uint32_t s = it % STAGES;
  mbar_wait(full0 + 8 * s, (it / STAGES) & 1u);
  return base + s * STAGE_BYTES;
}

// The producer's A copies of one stage: rows [row0, row0 + 128) at K element kc into
// `a_dst`, as two 64-row boxes (MC = 1), or this CTA's 128 / MC rows multicast to every CTA of
// the cluster (the map's box is then 128 / MC rows).
template <int MC>
__device__ __forceinline__ void load_a(uint32_t a_dst, const CUtensorMap* map, uint32_t full,
                                       int kc, int row0, uint32_t rank) {
  if (MC > 1) {
    tma_load_multicast(a_dst + rank * (A_BYTES / MC), map, full, kc,
                       row0 + static_cast<int>(rank) * (BM / MC),
                       static_cast<uint16_t>((1u << MC) - 1u));
  } else {
    tma_load(a_dst, map, full, kc, row0);
    tma_load(a_dst + A_HALF_BYTES, map, full, kc, row0 + 64);
  }
}

// A consumer warp's release of a ring slot: one arrival per warp on every CTA's empty barrier
// (lane j on CTA j's), or on this CTA's.
template <int MC>
__device__ __forceinline__ void release_stage(uint32_t empty_bar, int lane) {
  if (MC > 1) {
    if (lane < MC) mbar_arrive_cluster(empty_bar, static_cast<uint32_t>(lane));
  } else {
    if (lane == 0) mbar_arrive(empty_bar);
  }
}

// Pins the 64 accumulator registers of a consumer (before a wgmma group is issued and after
// one is waited).
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(d[i]);
}

// Issues one stage's four wgmmas of a consumer warp group's 64 rows x 128 columns into d as one
// committed group: e4m3 k32 steps, or (BF16) bf16 k16 steps, 32 bytes of each row either way.
// The first accumulates onto d only when `accumulate`; the caller waits.
template <bool BF16>
__device__ __forceinline__ void issue_stage(float (&d)[64], uint32_t a_tile, uint32_t b_tile,
                                            bool accumulate) {
  fence_operands(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BK / 32; ++kk) {
    const uint32_t acc_flag = accumulate || kk > 0 ? 1u : 0u;
    if constexpr (BF16) {
      wgmma_m64n128k16_bf16(d, smem_desc(a_tile + 32 * kk), smem_desc(b_tile + 32 * kk),
                            acc_flag);
    } else {
      wgmma_m64n128k32_e4m3(d, smem_desc(a_tile + 32 * kk), smem_desc(b_tile + 32 * kk),
                            acc_flag);
    }
  }
  wgmma_commit();
}

// One fp8 K step of a consumer warp group: the stage's wgmmas into d (the first with the
// accumulator off), waited; then the stage released (release_stage).
template <int MC>
__device__ __forceinline__ void mma_stage(float (&d)[64], uint32_t a_tile, uint32_t b_tile,
                                          uint32_t empty_bar, int lane) {
  issue_stage<false>(d, a_tile, b_tile, false);
  wgmma_wait_all();
  fence_operands(d);
  release_stage<MC>(empty_bar, lane);
}

// Stages a consumer's [64, 128] fp32 tile as bf16 in two [64, 64] boxes of 8 KB at c_stage
// (128-byte swizzle: 16-byte chunk j % 8 of row r at (j % 8) ^ (r % 8)), rows r and r + 8 of
// this thread scaled by w0 and w1; r = 16 * warp + lane / 4. Shared-memory stores only.
__device__ __forceinline__ void stage_tile_bf16(uint32_t c_stage, const float (&acc)[64],
                                                int r, int lane, float w0, float w1) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {  // box j / 8, 16-byte chunk j % 8 of its 128-byte row
    const uint32_t chunk = static_cast<uint32_t>((j % 8) ^ (lane / 4)) * 16u;
    const uint32_t at = c_stage + (j / 8) * 8192 + r * 128 + chunk + (lane % 4) * 4;
    __nv_bfloat162 lo = __floats2bfloat162_rn(acc[4 * j] * w0, acc[4 * j + 1] * w0);
    __nv_bfloat162 hi = __floats2bfloat162_rn(acc[4 * j + 2] * w1, acc[4 * j + 3] * w1);
    st_shared_b32(at, *reinterpret_cast<uint32_t*>(&lo));
    st_shared_b32(at + 8 * 128, *reinterpret_cast<uint32_t*>(&hi));
  }
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// A row-major [rows, cols] tensor of `elem`-byte elements, boxes of [box_rows, box_cols],
// 128-byte swizzle (box_cols * elem must be 128).
int make_map(CUtensorMap* map, const void* ptr, int rows, int cols, int box_rows,
             int box_cols = BK, int elem = 1) {
  static EncodeTiled encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult q;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || fn == nullptr)
      return -1;
    encode = reinterpret_cast<EncodeTiled>(fn);
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * elem};  // bytes
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUtensorMapDataType dt =
      elem == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUresult r = encode(map, dt, 2, const_cast<void*>(ptr), dims,
                      strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : -2 - static_cast<int>(r);
}

// Launches `kern` with `smem` bytes of dynamic shared memory on `ctas` CTAs (> 0: a multiple
// of MC) or on the persistent grid: as many MC-CTA clusters as fit on the device at once
// (MC > 1), or one CTA per SM; the grid is written to *ctas_used. Returns 0, or 1000 + /
// 2000 + / 3000 + / 4000 + the CUDA error of the attribute, occupancy, device query or launch
// step (-102: not one cluster fits, or `ctas` not a multiple of MC).
// The per-kernel setup (the shared-memory attribute, the persistent grid) is done at a
// kernel's first launch and kept in `setup_cache`, so a timed call pays only the tensor-map
// encodes and the launch.
struct SetupEntry {
  const void* kern;
  int smem;
  int ctas;
};
SetupEntry setup_cache[64];
int setup_count = 0;

template <int MC, typename... Params, typename... Args>
int launch_persistent(void (*kern)(Params...), int smem, int ctas, cudaStream_t stream,
                      int* ctas_used, Args&&... args) {
  const void* key = reinterpret_cast<const void*>(kern);
  SetupEntry* hit = nullptr;
  for (int i = 0; i < setup_count; ++i) {
    if (setup_cache[i].kern == key && setup_cache[i].smem == smem) hit = &setup_cache[i];
  }
  cudaError_t err = cudaSuccess;
  if (!hit) {
    err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return 1000 + static_cast<int>(err);
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.blockDim = dim3(NUM_THREADS, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = MC;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const bool persistent = ctas <= 0;
  if (!persistent) {
    if (ctas % MC) return -102;
  } else if (hit && hit->ctas > 0) {
    ctas = hit->ctas;
  } else if (MC > 1) {
    int clusters = 0;
    cfg.gridDim = dim3(MC, 1, 1);
    err = cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg);
    if (err != cudaSuccess) return 2000 + static_cast<int>(err);
    ctas = MC * clusters;
  } else {
    int dev = 0;
    cudaGetDevice(&dev);
    err = cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return 3000 + static_cast<int>(err);
  }
  if (ctas < MC) return -102;
  if (!hit && setup_count < 64) {
    setup_cache[setup_count++] = {key, smem, persistent ? ctas : 0};
  } else if (hit && persistent) {
    hit->ctas = ctas;
  }
  *ctas_used = ctas;
  cfg.gridDim = dim3(ctas, 1, 1);
  err = cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
  return err == cudaSuccess ? 0 : 4000 + static_cast<int>(err);
}

}  // namespace

#ifdef MC_WATCHDOG
// The check builds' watchdog record: allocates the host-mapped [4] words once, points the
// kernels at them, and returns their host address in *host (all zero until a wait times out:
// block, thread, barrier offset, parity + 1). Returns 0 or the CUDA error.
extern "C" int mc_watchdog_arm(uint32_t** host) {
  static uint32_t* slot = nullptr;
  if (slot == nullptr) {
    cudaError_t err = cudaHostAlloc(reinterpret_cast<void**>(&slot), 4 * sizeof(uint32_t),
                                    cudaHostAllocMapped);
    if (err != cudaSuccess) return static_cast<int>(err);
    for (int i = 0; i < 4; ++i) slot[i] = 0;
    uint32_t* dev = nullptr;
    err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), slot, 0);
    if (err == cudaSuccess) err = cudaMemcpyToSymbol(watchdog_slot, &dev, sizeof(dev));
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  *host = slot;
  return 0;
}
#endif
