// SPDX-License-Identifier: Apache-2.0
//
// Positions and bit-packed ancestor masks for a batch of token trees.
//
// Each request owns nodes [cu_num_nodes[b], cu_num_nodes[b + 1]) of the flat
// `parents` array, with request-local parent indices: local node 0 is the
// root (parent -1) and every other node's parent precedes it. For every node
// r the op writes
//   positions[r] = base_positions[b] + depth(r)   (the root has depth 0)
//   mask[r]      = words of a bitset over local nodes, bit c set iff c is r
//                  or an ancestor of r (word c / 32, bit c % 32).
//
// Only device-generic c10 headers are used: CPU wheels of torch ship no
// generated c10/cuda config header, so c10/cuda and ATen/cuda cannot be
// included there, and this file must compile against either wheel.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

namespace vllm_echo {
namespace {

constexpr int kBitsPerWord = 32;
constexpr int kMaxThreadsPerBlock = 256;

// One block per request, one thread per node (strided when the request has
// more nodes than threads). A thread walks from its node to the root; since
// parents precede children the walk visits strictly decreasing indices, so
// mask words are produced from high to low and each is stored exactly once,
// with no read-modify-write and no atomics.
__global__ void build_tree_mask_kernel(const int32_t* __restrict__ parents,
                                       const int32_t* __restrict__ cu_num_nodes,
                                       const int64_t* __restrict__ base_positions,
                                       int64_t* __restrict__ positions,
                                       uint32_t* __restrict__ mask,
                                       int32_t total_nodes,
                                       int32_t words_per_row) {
  const int32_t request = blockIdx.x;
  const int32_t start = cu_num_nodes[request];
  const int32_t end = cu_num_nodes[request + 1];
  // Offset contents are only checked by the Python wrapper, and only when it
  // is asked to validate; bail out rather than touch memory outside the
  // outputs if they are inconsistent.
  if (start < 0 || end < start || end > total_nodes) {
    return;
  }
  const int32_t num_nodes = end - start;
  const int64_t base_position = base_positions[request];
  const bool fits =
      num_nodes <= static_cast<int64_t>(words_per_row) * kBitsPerWord;

  for (int32_t node = threadIdx.x; node < num_nodes; node += blockDim.x) {
    uint32_t* row = mask + static_cast<int64_t>(start + node) * words_per_row;
    if (!fits) {
      // max_nodes was smaller than this request: mark the rows as invalid
      // instead of writing past the end of the row.
      for (int32_t w = 0; w < words_per_row; ++w) row[w] = 0u;
      positions[start + node] = -1;
      continue;
    }

    int32_t word = words_per_row - 1;
    uint32_t bits = 0u;
    int64_t depth = 0;
    int32_t current = node;
    while (true) {
      const int32_t current_word = current / kBitsPerWord;
      for (; word > current_word; --word) {
        row[word] = bits;
        bits = 0u;
      }
      bits |= 1u << (current % kBitsPerWord);
      const int32_t parent = parents[start + current];
      // Valid input always ends at the root's -1; the range test also stops
      // malformed input from looping or reading other requests' nodes.
      if (parent < 0 || parent >= current) break;
      current = parent;
      ++depth;
    }
    for (; word >= 0; --word) {
      row[word] = bits;
      bits = 0u;
    }
    positions[start + node] = base_position + depth;
  }
}

cudaStream_t current_cuda_stream(const c10::Device& device) {
  // Equivalent to at::cuda::getCurrentCUDAStream(), reached through the
  // backend-neutral guard interface (see the header note above) so the
  // kernel follows the caller's stream, including during CUDA graph capture.
  const c10::impl::DeviceGuardImplInterface* guard_impl =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return static_cast<cudaStream_t>(
      guard_impl->getStream(device).native_handle());
}

void check_vector(const at::Tensor& tensor, const char* name,
                  at::ScalarType dtype, const c10::Device& device) {
  TORCH_CHECK(tensor.is_cuda(), "build_tree_mask: ", name,
              " must be a CUDA tensor, got ", tensor.device());
  TORCH_CHECK(tensor.device() == device, "build_tree_mask: ", name, " is on ",
              tensor.device(), " but parents is on ", device);
  TORCH_CHECK(tensor.scalar_type() == dtype, "build_tree_mask: ", name,
              " must have dtype ", dtype, ", got ", tensor.scalar_type());
  TORCH_CHECK(tensor.dim() == 1, "build_tree_mask: ", name,
              " must be 1-D, got ", tensor.dim(), " dims");
  TORCH_CHECK(tensor.is_contiguous(), "build_tree_mask: ", name,
              " must be contiguous");
}

std::tuple<at::Tensor, at::Tensor> build_tree_mask_cuda(
    const at::Tensor& parents, const at::Tensor& cu_num_nodes,
    const at::Tensor& base_positions, int64_t max_nodes) {
  const c10::Device device = parents.device();
  check_vector(parents, "parents", at::kInt, device);
  check_vector(cu_num_nodes, "cu_num_nodes", at::kInt, device);
  check_vector(base_positions, "base_positions", at::kLong, device);

  const int64_t total_nodes = parents.size(0);
  const int64_t num_requests = cu_num_nodes.size(0) - 1;
  TORCH_CHECK(num_requests >= 0,
              "build_tree_mask: cu_num_nodes must have at least one entry");
  TORCH_CHECK(base_positions.size(0) == num_requests,
              "build_tree_mask: base_positions has ", base_positions.size(0),
              " entries but cu_num_nodes describes ", num_requests,
              " requests");
  TORCH_CHECK(max_nodes >= 0, "build_tree_mask: max_nodes must be >= 0, got ",
              max_nodes);
  TORCH_CHECK(total_nodes == 0 || max_nodes > 0,
              "build_tree_mask: max_nodes must be positive when there are "
              "nodes");
  TORCH_CHECK(total_nodes <= INT32_MAX && max_nodes <= INT32_MAX,
              "build_tree_mask: batch too large for 32-bit indexing");

  const int64_t words_per_row = (max_nodes + kBitsPerWord - 1) / kBitsPerWord;
  auto positions = at::empty({total_nodes}, parents.options().dtype(at::kLong));
  auto mask = at::empty({total_nodes, words_per_row},
                        parents.options().dtype(at::kInt));
  if (total_nodes == 0 || num_requests == 0) {
    return {positions, mask};
  }

  const c10::DeviceGuard device_guard(device);
  // Round up to whole warps; a block never needs more threads than nodes.
  const int64_t warps = (max_nodes + kBitsPerWord - 1) / kBitsPerWord;
  const int threads = static_cast<int>(
      std::min<int64_t>(warps * kBitsPerWord, kMaxThreadsPerBlock));
  build_tree_mask_kernel<<<static_cast<unsigned int>(num_requests), threads, 0,
                           current_cuda_stream(device)>>>(
      parents.data_ptr<int32_t>(), cu_num_nodes.data_ptr<int32_t>(),
      base_positions.data_ptr<int64_t>(), positions.data_ptr<int64_t>(),
      reinterpret_cast<uint32_t*>(mask.data_ptr<int32_t>()),
      static_cast<int32_t>(total_nodes), static_cast<int32_t>(words_per_row));
  const cudaError_t launch_status = cudaGetLastError();
  TORCH_CHECK(launch_status == cudaSuccess,
              "build_tree_mask: kernel launch failed: ",
              cudaGetErrorString(launch_status));
  return {positions, mask};
}

}  // namespace
}  // namespace vllm_echo

TORCH_LIBRARY(vllm_echo, m) {
  m.def(
      "build_tree_mask(Tensor parents, Tensor cu_num_nodes, "
      "Tensor base_positions, int max_nodes) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(vllm_echo, CUDA, m) {
  m.impl("build_tree_mask", &vllm_echo::build_tree_mask_cuda);
}
