// hisparse-hal's registration of vLLM 0.34.0's four HiSparse host launchers (declared in the sdist's
// csrc/ops.h:739-780, defined in csrc/hisparse_kernels.cu; both taken from the sdist at run time, never
// committed) as torch.ops.hisparse_vllm_peer.<op>, for ci/gpu-check.sh's peer step.
// The schemas are defined from Python (hisparse_hal.cache_ops.library.SCHEMAS) before this library loads; this
// file only adds the CUDA kernels, boxed through the stable ABI as vLLM's own binding does.
#include "ops.h"

#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY_IMPL(hisparse_vllm_peer, CUDA, m) {
  m.impl("resolve_residency", TORCH_BOX(&hisparse_resolve_residency));
  m.impl("gather_compact", TORCH_BOX(&hisparse_gather_compact));
  m.impl("gather_plan", TORCH_BOX(&hisparse_gather_plan));
  m.impl("invalidate_written_slots", TORCH_BOX(&hisparse_invalidate_written_slots));
}
