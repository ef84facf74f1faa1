// SPDX-License-Identifier: Apache-2.0
// A model profile (configs/models/*.json, made by scripts/gen_model_profiles.py): every
// parameter tensor of a real architecture in forward order, grouped by layer, with each layer's
// forward and backward compute time at a stated device throughput.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace psched::bench {

struct ProfileTensor {
  std::string name;
  std::vector<uint64_t> shape;
  uint64_t bytes = 0;  // float32
};

struct ProfileLayer {
  std::string name;
  double forward_s = 0;
  double backward_s = 0;
  std::vector<ProfileTensor> tensors;
  uint64_t bytes() const;
};

struct ModelProfile {
  std::string model;
  std::filesystem::path source;
  std::vector<ProfileLayer> layers;  // forward order: layers[0] is nearest the input
  uint64_t bytes() const;
  double compute_s() const;  // forward + backward of every layer
};

// Loads `name_or_path`: a path to a JSON profile, or a name looked up as
// <models_dir>/<name>.json. Throws psched::Error(bad_config) naming the file and the problem.
ModelProfile load_profile(const std::string& name_or_path, const std::filesystem::path& models_dir);

// The same profile with compute times multiplied by `time_scale`.
ModelProfile scale_compute(ModelProfile profile, double time_scale);
// The same profile with every tensor `divisor` times smaller (rounded to whole pairs of
// float32 elements, at least one pair), for compute-bound runs whose real bytes would take
// too long at the rate the machine can shape.
ModelProfile scale_bytes(ModelProfile profile, double divisor);

}  // namespace psched::bench
