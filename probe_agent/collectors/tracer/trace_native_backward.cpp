// The tracer's backward path in C++ (the first part of trace_native.cpp's translation unit:
// the includes, the record constants and the clock are here).
//
// A RecordFunction callback scoped to BACKWARD_FUNCTION records the start of every autograd
// node (no per-node registration, no Python, no GIL), and queues the pass-end callback on the
// pass's first node. It keeps only the nodes that forward records of the last KEEP_STEPS steps
// name (the grad_fns of calls' outputs and inputs): the others would join nothing in the resolver's
// SQL, and dropping them here cut its CPU by ~45% on the bench GPT. Nodes are named by
// (forward thread id, sequence number), which no two threads share.
#include <torch/extension.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <time.h>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

// trace_columns.py: FW_N, BW_N, PASS_END, FORWARD, RECOMPUTE, KEEP_STEPS (checked by
// `layout()`)
constexpr int64_t FW_N = 8, BW_N = 3, PASS_END = -1, FORWARD = 0, RECOMPUTE = 1, KEEP_STEPS = 3;
constexpr int64_t SEQ_BITS = 48;

// The clock of Python's time.perf_counter_ns, so native and Python records share one timeline.
inline int64_t now_ns() {
  struct timespec ts;
#ifdef __APPLE__
  clock_gettime(CLOCK_UPTIME_RAW, &ts);
#else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// A node's name in records: forward thread id above the sequence number (both as autograd
// sets them), so nodes made by two threads never share one.
inline int64_t node_key(uint64_t thread_id, uint64_t seq) {
  return int64_t(((thread_id & 0x7fff) << SEQ_BITS) | (seq & ((1ULL << SEQ_BITS) - 1)));
}

// Backward state (any thread, no GIL).
std::atomic<int64_t> g_in_backward{FORWARD};  // the kind of forward records now
std::mutex g_bw_mu;
std::vector<int64_t> g_bw;  // guarded by g_bw_mu
size_t g_bw_max = 0;
std::atomic<int64_t> g_bw_dropped{0};
at::CallbackHandle g_handle = 0;
// The nodes forward records named in the last KEEP_STEPS steps, oldest first (guarded by
// g_bw_mu: the training thread adds, autograd's threads look up).
std::unordered_set<int64_t> g_named;
std::deque<std::pair<int64_t, int64_t>> g_named_order;  // (step, key)

// A forward record names node `key` at `step`; names older than KEEP_STEPS steps before it (or
// beyond the buffer's size, for a job whose step never advances) are forgotten. Out of memory,
// the node stays unnamed: its call gets no backward row.
void name_node(int64_t step, int64_t key) noexcept {
  std::lock_guard<std::mutex> lock(g_bw_mu);
  while (!g_named_order.empty() &&
         (g_named_order.front().first < step - KEEP_STEPS ||
          g_named_order.size() * BW_N >= g_bw_max)) {
    g_named.erase(g_named_order.front().second);
    g_named_order.pop_front();
  }
  try {
    if (g_named.insert(key).second) {
      try {
        g_named_order.emplace_back(step, key);
      } catch (...) {
        g_named.erase(key);
      }
    }
  } catch (...) {
  }
}

// Never throws: it runs inside autograd, where an exception would fail the user's backward.
// `named`: keep the event only if a forward record names the node.
void push_bw(int64_t t, int64_t key, bool named) noexcept {
  std::lock_guard<std::mutex> lock(g_bw_mu);
  if (named && !g_named.count(key)) return;
  if (g_bw.size() + BW_N > g_bw_max) {
    g_bw_dropped++;
    return;
  }
  try {
    int64_t ev[BW_N] = {t, key, 0};
    g_bw.insert(g_bw.end(), ev, ev + BW_N);
  } catch (...) {  // out of memory: the event is lost and counted
    g_bw_dropped++;
  }
}

void pass_end() noexcept {
  push_bw(now_ns(), PASS_END, false);
  g_in_backward = FORWARD;
}

std::unique_ptr<at::ObserverContext> on_node(const at::RecordFunction& fn) {
  push_bw(now_ns(), node_key(fn.forwardThreadId(), uint64_t(fn.seqNr())), true);
  if (g_in_backward.load(std::memory_order_relaxed) == FORWARD &&
      torch::autograd::get_current_graph_task_id() != -1) {
    // a node run by the engine (not called by hand): its pass ends with a queued callback
    try {
      torch::autograd::Engine::get_default_engine().queue_callback(pass_end);
      g_in_backward = RECOMPUTE;  // forward calls until the pass ends are recompute
    } catch (...) {
    }
  }
  return nullptr;
}

// backward(on): add or remove the RecordFunction callback (only while steps are traced).
PyObject* backward(PyObject*, PyObject* arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  if (on && !g_handle) {
    g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_node)
                                         .scopes({at::RecordScope::BACKWARD_FUNCTION})
                                         .needsInputs(false)
                                         .needsOutputs(false)
                                         .needsIds(false));
  } else if (!on && g_handle) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
  Py_RETURN_NONE;
}

}  // namespace
