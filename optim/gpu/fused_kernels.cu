// SPDX-License-Identifier: Apache-2.0
// The fused optimizer kernels: one thread per element (grid-stride), each element's update
// written exactly as the CPU kernel computes it (optim/sgd.cc, adam.cc, adagrad.cc,
// rmsprop.cc), term by term and in the same order. Built with --fmad=false and
// nvcc's default IEEE division and square root (see optim/CMakeLists.txt).
#include "optim/gpu/fused_kernels.h"

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

namespace psched::optim::gpu {
namespace {

constexpr unsigned kThreads = 256;
constexpr uint64_t kMaxBlocks = 8192;  // grid-stride beyond this: plenty to fill any GPU

unsigned blocks_for(uint64_t size) {
  return static_cast<unsigned>(std::min<uint64_t>((size + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ uint64_t first_index() {
  return uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ uint64_t grid_stride() {
  return uint64_t(gridDim.x) * blockDim.x;
}

// torch's L2 term, skipped when wd == 0 (0*inf would be nan), as optim/lanes.h's l2_grad.
template <typename T>
__device__ T l2_grad(T grad, T weight_decay, T p) {
  return weight_decay == T(0) ? grad : grad + weight_decay * p;
}

template <typename T>
__global__ void sgd_kernel(DeviceRange<T> r, SgdArgs<T> a) {
  for (uint64_t i = first_index(); i < r.size; i += grid_stride()) {
    const T p = r.param[i];
    r.param[i] = p - a.lr * l2_grad(r.grad[i], a.weight_decay, p);
  }
}

template <typename T>
__global__ void momentum_kernel(DeviceRange<T> r, MomentumArgs<T> a) {
  for (uint64_t i = first_index(); i < r.size; i += grid_stride()) {
    const T p = r.param[i];
    const T g = l2_grad(r.grad[i], a.weight_decay, p);
    const T buf = a.first_step ? g : a.momentum * r.state[0][i] + a.one_minus_dampening * g;
    r.state[0][i] = buf;
    r.param[i] = a.nesterov ? p - a.lr * (g + a.momentum * buf) : p - a.lr * buf;
  }
}

template <typename T>
__global__ void adam_kernel(DeviceRange<T> r, AdamArgs<T> a) {
  for (uint64_t i = first_index(); i < r.size; i += grid_stride()) {
    const T p = r.param[i] * a.decay;
    const T g = l2_grad(r.grad[i], a.weight_decay, p);
    const T m = a.beta1 * r.state[0][i] + a.one_minus_beta1 * g;
    r.state[0][i] = m;
    T v = r.state[1][i];
    if (!a.freeze_variance) {
      v = a.beta2 * v + a.one_minus_beta2 * g * g;
      r.state[1][i] = v;
    }
    T v_used = v;
    if (a.amsgrad) {
      const T v_max = r.state[2][i];
      v_used = v_max < v ? v : v_max;  // std::max(v_max, v), as the CPU's (frozen: v_max)
      r.state[2][i] = v_used;
    }
    r.param[i] = p - a.step_size * m / (sqrt(v_used) / a.bias_correction2_sqrt + a.eps);
  }
}

template <typename T>
__global__ void adam_tf_kernel(DeviceRange<T> r, AdamTfArgs<T> a) {
  for (uint64_t i = first_index(); i < r.size; i += grid_stride()) {
    const T g = r.grad[i];
    const T m = a.beta1 * r.state[0][i] + a.one_minus_beta1 * g;
    r.state[0][i] = m;
    T v = r.state[1][i];
    if (!a.freeze_variance) {
      v = a.beta2 * v + a.one_minus_beta2 * g * g;
      r.state[1][i] = v;
    }
    r.param[i] = r.param[i] - a.lr_t * m / (sqrt(v) + a.eps);
  }
}

template <typename T>
__global__ void adagrad_kernel(DeviceRange<T> r, AdagradArgs<T> a) {
  for (uint64_t i = first_index(); i < r.size; i += grid_stride()) {
    const T p = r.param[i];
    const T g = l2_grad(r.grad[i], a.weight_decay, p);
    T sum = r.state[0][i];
    if (!a.freeze_variance) {
      sum = sum + g * g;
      r.state[0][i] = sum;
    }
    r.param[i] = p - a.clr * g / (sqrt(sum) + a.eps);
  }
}

template <typename T>
__global__ void rmsprop_kernel(DeviceRange<T> r, RmspropArgs<T> a) {
  // The optional slots, picked once (a runtime index into `r.state` would spill it to memory).
  T* const grad_avgs = a.grad_avg_slot < 0 ? nullptr : r.state[a.grad_avg_slot];
  T* const buffers = a.momentum_slot < 0 ? nullptr : r.state[a.momentum_slot];
  for (uint64_t i = first_index(); i < r.size; i += grid_stride()) {
    const T p = r.param[i];
    const T g = l2_grad(r.grad[i], a.weight_decay, p);
    T square_avg = r.state[0][i];
    if (!a.freeze_variance) {
      square_avg = a.alpha * square_avg + a.one_minus_alpha * g * g;
      r.state[0][i] = square_avg;
    }
    T avg;
    if (grad_avgs == nullptr) {
      avg = sqrt(square_avg) + a.eps;
    } else {
      T grad_avg = grad_avgs[i];
      if (!a.freeze_variance) {
        grad_avg = a.alpha * grad_avg + a.one_minus_alpha * g;
        grad_avgs[i] = grad_avg;
      }
      avg = sqrt(square_avg - grad_avg * grad_avg) + a.eps;
    }
    if (buffers == nullptr) {
      r.param[i] = p - a.lr * g / avg;
    } else {
      const T buf = a.momentum * buffers[i] + g / avg;
      buffers[i] = buf;
      r.param[i] = p - a.lr * buf;
    }
  }
}

}  // namespace

template <typename T>
void launch_sgd(const DeviceRange<T>& range, const SgdArgs<T>& args, Stream stream) {
  sgd_kernel<<<blocks_for(range.size), kThreads, 0, stream>>>(range, args);
}
template <typename T>
void launch_momentum(const DeviceRange<T>& range, const MomentumArgs<T>& args, Stream stream) {
  momentum_kernel<<<blocks_for(range.size), kThreads, 0, stream>>>(range, args);
}
template <typename T>
void launch_adam(const DeviceRange<T>& range, const AdamArgs<T>& args, Stream stream) {
  adam_kernel<<<blocks_for(range.size), kThreads, 0, stream>>>(range, args);
}
template <typename T>
void launch_adam_tf(const DeviceRange<T>& range, const AdamTfArgs<T>& args, Stream stream) {
  adam_tf_kernel<<<blocks_for(range.size), kThreads, 0, stream>>>(range, args);
}
template <typename T>
void launch_adagrad(const DeviceRange<T>& range, const AdagradArgs<T>& args, Stream stream) {
  adagrad_kernel<<<blocks_for(range.size), kThreads, 0, stream>>>(range, args);
}
template <typename T>
void launch_rmsprop(const DeviceRange<T>& range, const RmspropArgs<T>& args, Stream stream) {
  rmsprop_kernel<<<blocks_for(range.size), kThreads, 0, stream>>>(range, args);
}

#define PSCHED_INSTANTIATE(T)                                                              \
  template void launch_sgd<T>(const DeviceRange<T>&, const SgdArgs<T>&, Stream);           \
  template void launch_momentum<T>(const DeviceRange<T>&, const MomentumArgs<T>&, Stream); \
  template void launch_adam<T>(const DeviceRange<T>&, const AdamArgs<T>&, Stream);         \
  template void launch_adam_tf<T>(const DeviceRange<T>&, const AdamTfArgs<T>&, Stream);    \
  template void launch_adagrad<T>(const DeviceRange<T>&, const AdagradArgs<T>&, Stream);   \
  template void launch_rmsprop<T>(const DeviceRange<T>&, const RmspropArgs<T>&, Stream);
PSCHED_INSTANTIATE(float)
PSCHED_INSTANTIATE(double)
#undef PSCHED_INSTANTIATE

}  // namespace psched::optim::gpu
