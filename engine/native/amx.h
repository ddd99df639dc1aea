// AMX's tile state for the kernels that use it (linear_amx.cpp, prefill_attention_amx.cpp): every
// tile 16 rows of 64 bytes, asked of Linux once per process.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <immintrin.h>

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

namespace prefixrag {

constexpr int64_t AMX_ROWS = 16;  // rows of an A or C tile, and of a B tile's pairs
constexpr int64_t AMX_DEPTH = 32;  // bfloat16 inputs of one tdpbf16ps (16 pairs: 64 bytes)

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands AMX's tile state to a process that asks (once; every thread then has it)
inline bool tiles_permitted() {
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  static const bool permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return permitted;
}

inline bool amx_ready() {
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("amx-bf16") && tiles_permitted();
}

constexpr TileConfig tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = AMX_ROWS, cfg.colsb[t] = 64;
  return cfg;
}

// eight tiles of 16 rows x 64 bytes. A constant, not a local: GCC may drop the stores to a local
// config whose only reader is ldtilecfg, which then faults on the rows left unset
alignas(64) inline constexpr TileConfig TILE_CONFIG = tile_config();

// this thread's tiles
AMX inline void load_tile_config() { _tile_loadconfig(&TILE_CONFIG); }

}  // namespace prefixrag
