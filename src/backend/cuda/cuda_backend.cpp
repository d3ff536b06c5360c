// CudaBackend: device setup, device memory (cudaMalloc, never managed memory), stream-ordered
// copies, weight uploads, and the factory.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "util/error.h"
#include "util/log.h"

namespace tokenmill {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error for later calls
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device, PrefillPrecision prefill_precision,
                                           bool l2_prefetch, BatchPrecision batch_precision) {
  return std::make_unique<CudaBackend>(device, prefill_precision, l2_prefetch, batch_precision);
}

CudaBackend::CudaBackend(int device, PrefillPrecision prefill_precision, bool l2_prefetch,
                         BatchPrecision batch_precision)
    : device_(device), prefill_precision_(prefill_precision) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    fail(
        "cuda backend: device {} requested but {} CUDA device(s) are visible; check the driver "
        "and CUDA_VISIBLE_DEVICES, or use --device cpu",
        device, count);
  }
  TM_CUDA(cudaSetDevice(device));
  cudaDeviceProp p{};
  TM_CUDA(cudaGetDeviceProperties(&p, device));
  device_name_ = p.name;
  cudaStream_t s = nullptr;
  TM_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  gemv_ws_.sm_count = p.multiProcessorCount;
  gemv_ws_.wgmma = p.major == 9 && p.minor == 0;
  if (gemv_ws_.wgmma) {
    cudaDriverEntryPointQueryResult found{};
    TM_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &gemv_ws_.encode_tiled,
                                             12000, cudaEnableDefault, &found));
    gemv_ws_.wgmma = found == cudaDriverEntryPointSuccess && gemv_ws_.encode_tiled != nullptr;
  }
  gemv_ws_.fast_gmma = batch_precision == BatchPrecision::kFast;
  gemv_ws_.max_warps =
      static_cast<int64_t>(p.multiProcessorCount) * (p.maxThreadsPerMultiProcessor / 32);
  gemv_ws_.act_bytes = kGemvWorkspaceBytes;
  gemv_ws_.act = alloc(gemv_ws_.act_bytes);
  owned_.push_back(gemv_ws_.act);
  gemv_ws_.partial_floats = static_cast<size_t>(gemv_ws_.max_warps) * 2 * kMaxGemvSlotFloats;
  gemv_ws_.partials = static_cast<float*>(alloc(gemv_ws_.partial_floats * sizeof(float)));
  owned_.push_back(gemv_ws_.partials);
  const size_t counter_bytes = static_cast<size_t>(gemv_ws_.max_warps + 1) * sizeof(int);
  gemv_ws_.counters = static_cast<int*>(alloc(counter_bytes));
  owned_.push_back(gemv_ws_.counters);
  TM_CUDA(cudaMemset(gemv_ws_.counters, 0, counter_bytes));
  gemv_ws_.ticket = gemv_ws_.counters + gemv_ws_.max_warps;
  const size_t argmax_bytes = static_cast<size_t>(2 * kArgmaxWsSlots + kArgmaxMaxRows) * 4;
  argmax_ws_ = static_cast<float*>(alloc(argmax_bytes));
  owned_.push_back(argmax_ws_);
  TM_CUDA(cudaMemset(argmax_ws_, 0, argmax_bytes));
  mixer_max_cluster_ = cuda::init_gdn_mixer();
  pick_ws_ = alloc(cuda::pick_workspace_bytes());
  owned_.push_back(pick_ws_);
  TM_CUDA(cudaMemset(pick_ws_, 0, cuda::pick_workspace_bytes()));
  auto* table = static_cast<cuda::L2Prefetch*>(
      alloc(sizeof(cuda::L2Prefetch) * static_cast<size_t>(kL2PrefetchEntries)));
  owned_.push_back(table);
  TM_CUDA(cudaMemset(table, 0, sizeof(cuda::L2Prefetch) * kL2PrefetchEntries));
  l2_chain_.init(table, kL2PrefetchEntries, l2_prefetch ? kL2PrefetchBytes : 0,
                 kL2PrefetchMinSourceBytes);
  init_gemm();
}

CudaBackend::~CudaBackend() {
  // Errors are ignored here: a destructor must not throw, and a failed device has already
  // reported its error through the op that hit it.
  cudaStreamSynchronize(stream_);
  destroy_gemm();
  for (void* g : graphs_) {
    if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  }
  for (void* p : owned_) cudaFree(p);
  for (PendingDownload& d : downloads_) {
    if (d.staging != nullptr) cudaFreeHost(d.staging);
    if (d.done != nullptr) cudaEventDestroy(d.done);
  }
  if (upload_ring_.host != nullptr) cudaFreeHost(upload_ring_.host);
  for (CUevent_st* e : upload_ring_.left) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
  return "cuda:" + std::to_string(device_) + " (" + device_name_ + ")";
}

void* CudaBackend::alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail(
        "cuda backend: could not allocate {} bytes of device memory ({}; {} of {} bytes free); "
        "reduce the cache size or the batch limits",
        bytes, cudaGetErrorString(err), free_b, total_b);
  }
  alloc_stats_.added(p, bytes);
  return p;
}

int64_t CudaBackend::free_memory_bytes() const {
  size_t free_b = 0, total_b = 0;
  TM_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

void CudaBackend::free(void* p) {
  l2_chain_.reset(stream_);  // its entries may point into p
  alloc_stats_.removed(p);
  ++memory_epoch_;  // recordings may point into p
  if (p) TM_CUDA(cudaFree(p));
}

void* CudaBackend::grow_workspace(void** p, size_t* bytes, size_t need, const char* what) {
  if (need <= *bytes) return *p;
  if (step_reserved_) {
    log::warn(
        "{} workspace grows from {} to {} bytes inside a step: the step is larger than the "
        "shape reserved up front",
        what, *bytes, need);
  }
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  TM_CUDA(cudaStreamIsCapturing(stream_, &cap));
  if (cap != cudaStreamCaptureStatusNone) {
    fail("{} workspace cannot grow to {} bytes while a decode step is recorded", what, need);
  }
  TM_CUDA(cudaStreamSynchronize(stream_));  // work queued on the old buffer is done
  free(*p);
  *p = nullptr;
  *bytes = 0;
  *p = alloc(need);
  *bytes = need;
  return *p;
}

void CudaBackend::reserve_step_workspaces(const StepShape& shape) {
  if (shape.max_tokens <= 0) return;
  step_reserved_ = false;  // growing here is the reservation (another model's, say), not a miss
  // Any linear of the step may run the GEMM on all its rows.
  grow_workspace(&gemm_x_, &gemm_x_bytes_, gemm_x_bytes(shape.max_tokens, shape.max_linear_cols),
                 "prefill GEMM");
  // The chunked delta rule's workspace grows with the step's rows and (its per-chunk products)
  // with its sequences.
  GDNStateView st;
  st.k_heads = shape.gdn_k_heads;
  st.v_heads = shape.gdn_v_heads;
  st.k_dim = shape.gdn_k_dim;
  st.v_dim = shape.gdn_v_dim;
  SeqLayout seqs;
  seqs.n_seqs = std::max(1, std::min({shape.max_seqs, shape.max_tokens, 65535}));
  seqs.n_tokens = shape.max_tokens;
  seqs.max_seq_tokens = shape.max_tokens;
  grow_workspace(&gdn_ws_, &gdn_ws_bytes_, gdn_ws_bytes(st, seqs, false), "chunked delta rule");
  // The fast wgmma prefill attention's F16 copy of one sequence's context, sized for a BF16
  // cache (CUDA's default; an F32 cache leaves it unused) up to the block table's capacity (a
  // long prompt's later chunks) within kKv16ContextBytes.
  if (shape.attn_kv_heads > 0 && prefill_precision_ == PrefillPrecision::kFast && gemv_ws_.wgmma) {
    const auto per_row = static_cast<size_t>(2 * shape.attn_kv_heads * shape.attn_head_dim) *
                         sizeof(uint16_t);  // F16 K and V of one position
    const int64_t rows =
        std::min<int64_t>(shape.max_context, static_cast<int64_t>(kKv16ContextBytes / per_row));
    if (rows > 0) {
      grow_workspace(&kv16_, &kv16_bytes_, static_cast<size_t>(rows) * per_row,
                     "prefill attention");
    }
  }
  step_reserved_ = true;
}

void CudaBackend::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  // Large uploads (weights) and any inside a recording (which would replay from the ring's
  // reused memory) copy from the caller's memory.
  if (bytes > kUploadRingHalf || recording_) {
    TM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    return;
  }
  UploadRing& r = upload_ring_;
  if (r.host == nullptr) {
    TM_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&r.host), 2 * kUploadRingHalf,
                          cudaHostAllocDefault));
    for (CUevent_st*& e : r.left) {
      cudaEvent_t ev = nullptr;
      TM_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      e = ev;
    }
  }
  if (r.used + bytes > kUploadRingHalf) {
    TM_CUDA(cudaEventRecord(r.left[r.half], stream_));
    r.half ^= 1;
    r.used = 0;
    TM_CUDA(cudaEventSynchronize(r.left[r.half]));  // at once if never recorded
  }
  char* staged = r.host + static_cast<size_t>(r.half) * kUploadRingHalf + r.used;
  std::memcpy(staged, src, bytes);
  TM_CUDA(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, stream_));
  r.used += (bytes + 255) & ~size_t{255};
}

// Synchronous with respect to the host: the caller reads `dst` right after.
void CudaBackend::download(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  TM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  TM_CUDA(cudaStreamSynchronize(stream_));
}

int64_t CudaBackend::begin_download(void* dst, const void* src, size_t bytes) {
  TM_CHECK(!recording_, "begin_download inside a recording");
  const int64_t ticket = next_ticket_++;
  PendingDownload& d = downloads_[ticket % kDownloadSlots];
  if (d.ticket >= 0) finish_download(d.ticket);  // the slot's earlier download, never finished
  if (d.capacity < bytes) {
    if (d.staging != nullptr) TM_CUDA(cudaFreeHost(d.staging));
    d.staging = nullptr;
    d.capacity = 0;
    const size_t cap = std::max(bytes, size_t{4096});
    TM_CUDA(cudaHostAlloc(&d.staging, cap, cudaHostAllocDefault));
    d.capacity = cap;
  }
  if (d.done == nullptr) {
    cudaEvent_t ev = nullptr;
    TM_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    d.done = ev;
  }
  if (bytes) TM_CUDA(cudaMemcpyAsync(d.staging, src, bytes, cudaMemcpyDeviceToHost, stream_));
  TM_CUDA(cudaEventRecord(d.done, stream_));
  d.dst = dst;
  d.bytes = bytes;
  d.ticket = ticket;
  return ticket;
}

void CudaBackend::finish_download(int64_t ticket) {
  TM_CHECK(ticket >= 0, "finish_download: invalid ticket {}", ticket);
  PendingDownload& d = downloads_[ticket % kDownloadSlots];
  TM_CHECK(d.ticket == ticket, "finish_download: ticket {} is not pending", ticket);
  d.ticket = -1;
  TM_CUDA(cudaEventSynchronize(d.done));
  if (d.bytes) std::memcpy(d.dst, d.staging, d.bytes);
}

void CudaBackend::register_host(void* p, size_t bytes) {
  if (p != nullptr && bytes > 0) TM_CUDA(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
}

void CudaBackend::unregister_host(void* p) {
  if (p != nullptr) TM_CUDA(cudaHostUnregister(p));
}

void CudaBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) TM_CUDA(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) TM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::synchronize() {
  TM_CUDA(cudaStreamSynchronize(stream_));
}

Weight CudaBackend::upload_weight(const Weight& host) {
  Weight d = host;
  const size_t data_bytes = host.data_bytes(), sb_bytes = host.scale_bytes();
  auto put = [&](const void* src, size_t bytes) -> const void* {
    if (src == nullptr || bytes == 0) return nullptr;
    void* p = alloc(bytes);
    owned_.push_back(p);
    // Synchronous copy: the host weight may be a mapping or a temporary that goes away.
    TM_CUDA(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
    return p;
  };
  d.data = put(host.data, data_bytes);
  if (host.quantized()) {
    d.scales = put(host.scales, sb_bytes);
    d.biases = put(host.biases, sb_bytes);
  }
  const Weight packed = pack_weight(d);
  release_replaced(*this, d, packed, owned_);  // the checkpoint-layout copies were its input
  return packed;
}

}  // namespace tokenmill

namespace tokenmill {

void CudaBackend::begin_recording() {
  TM_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  recording_ = true;
}

int64_t CudaBackend::end_recording(bool keep) {
  cudaGraph_t graph = nullptr;
  recording_ = false;
  const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  if (!keep || err != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (keep) TM_CUDA(err);
    return -1;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ierr = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TM_CUDA(ierr);
  graphs_.push_back(exec);
  return static_cast<int64_t>(graphs_.size()) - 1;
}

void CudaBackend::replay(int64_t id) {
  TM_CUDA_REQUIRE(id >= 0 && id < static_cast<int64_t>(graphs_.size()) && graphs_[id] != nullptr,
                  "replay of an unknown recording");
  l2_chain_.sync(stream_);  // entries learned while it was recorded
  TM_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphs_[id]), stream_));
}

void CudaBackend::forget_recording(int64_t id) {
  if (id < 0 || id >= static_cast<int64_t>(graphs_.size()) || graphs_[id] == nullptr) return;
  TM_CUDA(cudaStreamSynchronize(stream_));  // it may still be running
  TM_CUDA(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graphs_[id])));
  graphs_[id] = nullptr;
}

}  // namespace tokenmill
