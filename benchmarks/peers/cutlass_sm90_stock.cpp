// Python binding of the stock-CUTLASS benchmark peer (cutlass_sm90_stock.cu).
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

char const* cutlass_peer_mm(void const* a, int64_t lda, void const* b, int64_t ldb, void* d, int m, int n, int k,
                            int swizzle, int stream_k, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            size_t* workspace_needed);

namespace {
// a (M, K) row-major, b (K, N) column-major, bf16 -> bf16 (M, N). stream_k: 0 CUTLASS's
// PersistentScheduler, 1 its StreamKScheduler forced to stream-K, 2 that scheduler's heuristic.
torch::Tensor mm(torch::Tensor const& a, torch::Tensor const& b, int64_t swizzle, int64_t stream_k) {
  TORCH_CHECK(stream_k >= 0 && stream_k <= 2, "cutlass peer: stream_k is 0, 1 or 2, got ", stream_k);
  TORCH_CHECK(a.is_cuda() && a.scalar_type() == torch::kBFloat16 && b.scalar_type() == torch::kBFloat16,
              "cutlass peer: bf16 CUDA tensors");
  TORCH_CHECK(a.stride(1) == 1 && b.stride(0) == 1, "cutlass peer: a row-major, b column-major");
  c10::cuda::CUDAGuard guard(a.device());
  auto d = torch::empty({a.size(0), b.size(1)}, a.options());
  auto stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  size_t need = 0;
  torch::Tensor ws = torch::empty({256}, a.options().dtype(torch::kUInt8));
  for (int attempt = 0; attempt < 2; ++attempt) {
    char const* err = cutlass_peer_mm(a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(1), d.data_ptr(),
                                      int(a.size(0)), int(b.size(1)), int(a.size(1)), int(swizzle), int(stream_k),
                                      ws.data_ptr(),
                                      size_t(ws.numel()), stream, &need);
    TORCH_CHECK(!err, "cutlass peer: ", err);
    if (need <= size_t(ws.numel())) return d;
    ws = torch::empty({int64_t(need)}, a.options().dtype(torch::kUInt8));
  }
  TORCH_CHECK(false, "cutlass peer: workspace");
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "stock CUTLASS SM90 cooperative GEMM under CUTLASS's PersistentScheduler or StreamKScheduler",
        pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("swizzle"), pybind11::arg("stream_k") = 0);
}
