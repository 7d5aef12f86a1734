// SPDX-License-Identifier: Apache-2.0
// The table of one kernel variant (kernels/variant.h).
#include "kernels/variant.h"

namespace protokv::kernels::PROTOKV_KERNEL_VARIANT {

const KernelVariant& kernel_table() {
  static constexpr KernelVariant table{
      .dot = dot,
      .exp = exp,
      .rmsnorm = rmsnorm,
      .softmax = softmax,
      .matvec_rows = matvec_rows,
      .matmul = matmul,
      .matmul_as_llama_cpp = matmul_as_llama_cpp,
      .attention_as_llama_cpp = attention_as_llama_cpp,
      .flash_attention_as_llama_cpp = flash_attention_as_llama_cpp,
      .swiglu_as_llama_cpp = swiglu_as_llama_cpp,
      .legacy_quant_dot = legacy_quant_dot,
      .weight_row_to_f32 = weight_row_to_f32,
      .attention_prefill_heads = attention_prefill_heads,
      .attention_prefill_cached = attention_prefill_cached,
      .attention_prefill = attention_prefill,
      .attention_decode_group_segments = attention_decode_group_segments,
      .attention_decode_gathered_segments = attention_decode_gathered_segments,
      .chunk_pass_range = chunk_pass_range,
      .rows_dot = rows_dot,
      .assign_to_prototypes = assign_to_prototypes,
  };
  return table;
}

}  // namespace protokv::kernels::PROTOKV_KERNEL_VARIANT
