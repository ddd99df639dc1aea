// The native extension's Python module: the decode step, the prefill's row operations, attention and
// Linears (AVX512-BF16 column tiles, AMX), the sampler's draw, and a reused chunk's key rotation.
#include <torch/extension.h>

void bind_decode_step(pybind11::module_& mod);
void bind_decode_step_f32(pybind11::module_& mod);
void bind_prefill_rows(pybind11::module_& mod);
void bind_prefill_rows_f32(pybind11::module_& mod);
void bind_prefill_attention(pybind11::module_& mod);
void bind_prefill_attention_amx(pybind11::module_& mod);
void bind_prefill_attention_f32(pybind11::module_& mod);
void bind_linear_tiles(pybind11::module_& mod);
void bind_linear_amx(pybind11::module_& mod);
void bind_linear_tiles_f32(pybind11::module_& mod);
void bind_linear_int8(pybind11::module_& mod);
void bind_sample(pybind11::module_& mod);
void bind_key_rotation(pybind11::module_& mod);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  bind_decode_step(mod);
  bind_decode_step_f32(mod);
  bind_prefill_rows(mod);
  bind_prefill_rows_f32(mod);
  bind_prefill_attention(mod);
  bind_prefill_attention_amx(mod);
  bind_prefill_attention_f32(mod);
  bind_linear_tiles(mod);
  bind_linear_amx(mod);
  bind_linear_tiles_f32(mod);
  bind_linear_int8(mod);
  bind_sample(mod);
  bind_key_rotation(mod);
}
