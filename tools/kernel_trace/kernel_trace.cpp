// A CUDA injection library that records when every kernel ran (CUPTI's concurrent-kernel
// activity records: start and end on the GPU's clock, graph node, grid and block) and writes
// them as CSV when the process exits. Kernels are not serialized, so a replayed decode step
// shows its real timeline: the gaps between kernels and what programmatic dependent launches
// overlapped. tools/kernel_timeline.py summarizes the file.
//
//   CUDA_INJECTION64_PATH=build/tools/kernel_trace/libtm_kernel_trace.so
//   TM_KERNEL_TRACE=trace.csv tokenmill bench ...   (both in the environment)
//
// The driver loads the library at cuInit and calls InitializeInjection; nothing in the traced
// program changes. A row per kernel, in completion-buffer order, names demangled.
//
// Names: the records' own name pointers do not survive until their buffer completes (read
// then, most were other strings), so names are taken while the launch happens: from the kernel
// node when a graph node is created or cloned (by its CUPTI node id) and from the launch call's
// symbol otherwise (by correlation id).
#include <cuda.h>
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct KernelRow {
  uint64_t start_ns, end_ns, graph_node;
  uint32_t graph_id, stream_id, name_id;
  int32_t grid, block, shared_bytes;
};

// The process-wide trace: CUPTI's C callbacks carry no user pointer, so the one recorder lives
// here for the life of the process (this library is a development tool, not part of tokenmill).
struct Recorder {
  std::mutex mu;
  std::vector<KernelRow> rows;
  std::vector<std::string> names;
  std::unordered_map<std::string, uint32_t> name_ids;
  std::unordered_map<uint64_t, uint32_t> node_names;  // CUPTI graph node id -> name id
  std::unordered_map<uint32_t, uint32_t> call_names;  // launch correlation id -> name id
  size_t dropped = 0;

  uint32_t intern(const char* mangled) {
    std::string key = mangled != nullptr ? mangled : "?";
    auto it = name_ids.find(key);
    if (it != name_ids.end()) return it->second;
    int status = 0;
    char* plain = abi::__cxa_demangle(key.c_str(), nullptr, nullptr, &status);
    names.push_back(status == 0 && plain != nullptr ? plain : key);
    std::free(plain);
    const auto id = static_cast<uint32_t>(names.size() - 1);
    name_ids.emplace(std::move(key), id);
    return id;
  }
};

// Never destroyed: the trace is written by an atexit handler, which may run after the static
// destructors of objects made later than it was registered.
Recorder& recorder() {
  static Recorder* r = new Recorder;
  return *r;
}

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      // Copies join the timeline as rows named by direction and size (grid = bytes).
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      static const char* kinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                    "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
      const char* kind = m->copyKind < 11 ? kinds[m->copyKind] : "?";
      const bool pageable = m->srcKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE ||
                            m->dstKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
      std::string name = std::string("memcpy_") + kind + (pageable ? "_pageable" : "");
      r.rows.push_back(KernelRow{m->start, m->end, m->graphNodeId, m->graphId, m->streamId,
                                 r.intern(name.c_str()), static_cast<int>(m->bytes), 0, 0});
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    uint32_t name = r.intern("?");
    if (auto it = r.node_names.find(k->graphNodeId);
        k->graphNodeId != 0 && it != r.node_names.end()) {
      name = it->second;
    } else if (auto c = r.call_names.find(k->correlationId); c != r.call_names.end()) {
      name = c->second;
    }
    r.rows.push_back(KernelRow{k->start, k->end, k->graphNodeId, k->graphId, k->streamId, name,
                               k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                               k->staticSharedMemory + k->dynamicSharedMemory});
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) {
    r.dropped += dropped;
  }
  std::free(buffer);
}

// Names go last and quoted: template arguments hold commas.
void write_trace() {
  cuptiActivityFlushAll(1);
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  const char* path = std::getenv("TM_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') path = "kernel_trace.csv";
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s: %s\n", path, std::strerror(errno));
    return;
  }
  std::fprintf(f, "start_ns,end_ns,graph_id,graph_node,stream,grid,block,shared_bytes,name\n");
  for (const KernelRow& k : r.rows) {
    std::string name = r.names[k.name_id];
    for (char& c : name) {
      if (c == '"') c = '\'';
    }
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%d,%d,%d,\"%s\"\n",
                 static_cast<unsigned long long>(k.start_ns),
                 static_cast<unsigned long long>(k.end_ns), k.graph_id,
                 static_cast<unsigned long long>(k.graph_node), k.stream_id, k.grid, k.block,
                 k.shared_bytes, name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "kernel_trace: %zu kernels to %s (%zu records dropped)\n", r.rows.size(),
               path, r.dropped);
}

// Names at launch time: kernel graph nodes as they are created or cloned, direct launches by
// their correlation id.
void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                          const void* data) {
  Recorder& r = recorder();
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    const auto* rd = static_cast<const CUpti_ResourceData*>(data);
    const auto* gd = static_cast<const CUpti_GraphData*>(rd->resourceDescriptor);
    if (gd == nullptr || gd->node == nullptr) return;
    CUgraphNodeType type;
    if (cuGraphNodeGetType(gd->node, &type) != CUDA_SUCCESS || type != CU_GRAPH_NODE_TYPE_KERNEL) {
      return;
    }
    CUDA_KERNEL_NODE_PARAMS params{};
    const char* fname = nullptr;
    uint64_t id = 0;
    if (cuGraphKernelNodeGetParams(gd->node, &params) != CUDA_SUCCESS || params.func == nullptr ||
        cuFuncGetName(&fname, params.func) != CUDA_SUCCESS ||
        cuptiGetGraphNodeId(gd->node, &id) != CUPTI_SUCCESS) {
      return;
    }
    std::lock_guard<std::mutex> lock(r.mu);
    r.node_names[id] = r.intern(fname);
    (void)cbid;
  } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    const auto* cd = static_cast<const CUpti_CallbackData*>(data);
    if (cd->callbackSite != CUPTI_API_ENTER || cd->symbolName == nullptr) return;
    std::lock_guard<std::mutex> lock(r.mu);
    r.call_names[cd->correlationId] = r.intern(cd->symbolName);
  }
}

bool check(CUptiResult rc, const char* what) {
  if (rc == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(rc, &msg);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg != nullptr ? msg : "?");
  return false;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  CUpti_SubscriberHandle sub = nullptr;
  if (!check(cuptiSubscribe(&sub, on_callback, nullptr), "cuptiSubscribe") ||
      !check(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                                 CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED),
             "cuptiEnableCallback(GRAPHNODE_CREATED)") ||
      !check(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                                 CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED),
             "cuptiEnableCallback(GRAPHNODE_CLONED)")) {
    return 0;
  }
  for (CUpti_CallbackId id :
       {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz}) {
    if (!check(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id),
               "cuptiEnableCallback(launch)")) {
      return 0;
    }
  }
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
             "cuptiActivityRegisterCallbacks") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
             "cuptiActivityEnable(CONCURRENT_KERNEL)") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)")) {
    return 0;
  }
  std::atexit(write_trace);
  return 1;
}
