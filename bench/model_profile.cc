// SPDX-License-Identifier: Apache-2.0
#include "bench/model_profile.h"

#include <algorithm>
#include <cmath>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace psched::bench {
namespace {

ProfileTensor parse_tensor(const nlohmann::json& j) {
  ProfileTensor t{j.at("name").get<std::string>(), j.at("shape").get<std::vector<uint64_t>>(),
                  j.at("bytes").get<uint64_t>()};
  uint64_t elements = 1;
  for (uint64_t d : t.shape) elements *= d;
  if (elements * 4 != t.bytes)
    fail(ErrorCode::bad_config, "tensor '{}': {} bytes do not match its shape ({} float32s)",
         t.name, t.bytes, elements);
  return t;
}

ProfileLayer parse_layer(const nlohmann::json& j) {
  ProfileLayer layer{j.at("name").get<std::string>(),
                     j.at("forward_s").get<double>(),
                     j.at("backward_s").get<double>(),
                     {}};
  for (const auto& t : j.at("tensors")) layer.tensors.push_back(parse_tensor(t));
  if (layer.tensors.empty()) fail(ErrorCode::bad_config, "layer '{}' has no tensors", layer.name);
  return layer;
}

}  // namespace

uint64_t ProfileLayer::bytes() const {
  uint64_t sum = 0;
  for (const auto& t : tensors) sum += t.bytes;
  return sum;
}

uint64_t ModelProfile::bytes() const {
  uint64_t sum = 0;
  for (const auto& l : layers) sum += l.bytes();
  return sum;
}

double ModelProfile::compute_s() const {
  double sum = 0;
  for (const auto& l : layers) sum += l.forward_s + l.backward_s;
  return sum;
}

ModelProfile load_profile(const std::string& name_or_path,
                          const std::filesystem::path& models_dir) {
  std::filesystem::path path = name_or_path;
  if (!std::filesystem::exists(path)) path = models_dir / (name_or_path + ".json");
  std::ifstream in(path);
  if (!in)
    fail(ErrorCode::bad_config, "no model profile '{}' (looked for {})", name_or_path,
         path.string());
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    ModelProfile profile{j.at("model").get<std::string>(), path, {}};
    for (const auto& layer : j.at("layers")) profile.layers.push_back(parse_layer(layer));
    if (profile.layers.empty()) fail(ErrorCode::bad_config, "it has no layers");
    return profile;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::bad_config, "model profile {}: {}", path.string(), e.what());
  } catch (const Error& e) {
    fail(ErrorCode::bad_config, "model profile {}: {}", path.string(), e.what());
  }
}

ModelProfile scale_compute(ModelProfile profile, double time_scale) {
  for (auto& layer : profile.layers) {
    layer.forward_s *= time_scale;
    layer.backward_s *= time_scale;
  }
  return profile;
}

ModelProfile scale_bytes(ModelProfile profile, double divisor) {
  for (auto& layer : profile.layers) {
    for (auto& tensor : layer.tensors) {
      auto pairs = static_cast<uint64_t>(std::llround(double(tensor.bytes) / 8 / divisor));
      tensor.bytes = std::max<uint64_t>(1, pairs) * 8;
      tensor.shape = {tensor.bytes / 4};
    }
  }
  return profile;
}

}  // namespace psched::bench
