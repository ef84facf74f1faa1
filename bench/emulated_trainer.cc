// SPDX-License-Identifier: Apache-2.0
#include "bench/emulated_trainer.h"

#include <algorithm>
#include <thread>

#include "common/check.h"

namespace psched::bench {

EmulatedTrainer::EmulatedTrainer(Client& client, const ModelProfile& profile)
    : client_(client), profile_(profile) {
  for (size_t l = 0; l < profile.layers.size(); ++l) {
    auto& layer = tensors_.emplace_back();
    for (const ProfileTensor& t : profile.layers[l].tensors) {
      Tensor& tensor = layer.emplace_back();
      tensor.value.assign(t.bytes / 4, 0.f);
      tensor.gradient.assign(t.bytes / 4, 1e-3f);
      VariableSpec spec{t.name, {t.bytes / 4}, DType::float32, static_cast<Priority>(l), {}};
      tensor.handle =
          client.register_variable(spec, std::as_writable_bytes(std::span(tensor.value)), true);
    }
  }
}

void EmulatedTrainer::compute(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

void EmulatedTrainer::forward(size_t layer, Step previous) {
  if (previous != Step())
    for (Tensor& t : tensors_[layer]) client_.wait(t.handle, previous);
  compute(profile_.layers[layer].forward_s);
}

void EmulatedTrainer::backward(size_t layer, Step step) {
  compute(profile_.layers[layer].backward_s);
  for (Tensor& t : tensors_[layer])
    client_.push(t.handle, step, std::as_bytes(std::span(t.gradient)));
}

std::vector<double> EmulatedTrainer::run(int iterations, Clock::time_point epoch) {
  auto since_epoch = [epoch] {
    return std::chrono::duration<double>(Clock::now() - epoch).count();
  };
  std::vector<double> starts;
  Step pushed;  // the newest step pushed
  for (int i = 1; i <= iterations; ++i) {
    starts.push_back(since_epoch());
    started_.store(i, std::memory_order_relaxed);
    for (size_t l = 0; l < tensors_.size(); ++l) forward(l, pushed);
    pushed = pushed.next();
    for (size_t l = tensors_.size(); l-- > 0;) backward(l, pushed);
  }
  for (auto& layer : tensors_)
    for (Tensor& t : layer) client_.wait(t.handle, pushed);
  return starts;
}

double steady_iteration_s(const std::vector<double>& starts, int warmup) {
  std::vector<double> durations;
  for (size_t k = static_cast<size_t>(warmup); k + 1 < starts.size(); ++k)
    durations.push_back(starts[k + 1] - starts[k]);
  PSCHED_REQUIRE(!durations.empty(), starts.size(), warmup);
  std::nth_element(durations.begin(), durations.begin() + durations.size() / 2, durations.end());
  return durations[durations.size() / 2];
}

}  // namespace psched::bench
