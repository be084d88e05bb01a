// tests/ports/hwlike/hw_calls.h — forced into the hardware-like port's copy
// of reference/forward.c and reference/forward_llama.c (CMakeLists.txt): the
// models call this port's kernels (hw_matmul.c, hw_kernels.c) where the
// reference calls reference/layers.c's, with the same signatures. The
// kernels fall back to layers.c's when their knobs are off.
#define fc_matmul_forward hw_matmul_forward
#define fc_matmul_backward hw_matmul_backward
#define fc_layernorm_forward hw_layernorm_forward
#define fc_layernorm_backward hw_layernorm_backward
#define fc_rmsnorm_forward hw_rmsnorm_forward
#define fc_rmsnorm_backward hw_rmsnorm_backward
#define fc_gelu_forward hw_gelu_forward
#define fc_gelu_backward hw_gelu_backward
#define fc_swiglu_forward hw_swiglu_forward
#define fc_swiglu_backward hw_swiglu_backward
#define fc_rope_forward hw_rope_forward
#define fc_rope_backward hw_rope_backward
#define fc_attention_forward hw_attention_forward
#define fc_attention_backward hw_attention_backward
#define fc_gqa_attention_forward hw_gqa_attention_forward
#define fc_gqa_attention_backward hw_gqa_attention_backward
#define fc_encoder_forward hw_encoder_forward
#define fc_encoder_backward hw_encoder_backward
#define fc_residual_forward hw_residual_forward
#define fc_crossentropy_forward hw_crossentropy_forward
#define fc_crossentropy_backward hw_crossentropy_backward
