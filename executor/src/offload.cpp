#include "offload.h"

#include "memory_meter.h"

namespace dplan::executor {

torch::Tensor OffloadedAdamW::step(LossClosure closure) {
  grads_.gradients_to_host();
  HostScope host;
  return torch::optim::AdamW::step(std::move(closure));
}

}  // namespace dplan::executor
