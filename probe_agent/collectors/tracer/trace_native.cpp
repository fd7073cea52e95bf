// The tracer's hot path in C++ (trace_native.py builds and loads it, after
// trace_native_backward.cpp, in one translation unit; trace_hot.py is the Python one it stands
// in for, and its docstring says what a record means). This file: the forward path, and the
// functions the tracer calls.
//
// Why: between a model's kernels the caches are cold, and the Python wrapper's ~40 bytecodes
// and a grad_fn pre-hook per module cost 2-4x their warm figure; this does the same work with
// a few hundred machine instructions.
// - forward: `call(module, args, kwargs)` runs the module and writes one record per call into
//   a buffer of int64 (the layout of trace_columns.FW_*), with no Python object but the lists of
//   modules and roots. It reads the output's grad_fn in C++ (no Python Node object) and names
//   that node for the backward callback.
// - backward: trace_native_backward.cpp.
// Everything that touches Python runs under the GIL (training thread, or `take` on the
// writer); the backward callback does not hold the GIL and only touches `bw` under its mutex.
namespace {

// Training-thread state (GIL).
PyObject* g_tracer = nullptr;  // the TorchTracer recording, or null: pass through
PyObject* g_orig_call = nullptr;  // nn.Module.__call__ as found
bool g_direct = false;  // it is torch's own: call self._call_impl directly
bool g_recording = false;
int64_t g_step = 1;
PyObject* g_root = nullptr;
int64_t g_depth = 0;
size_t g_fw_max = 0;
std::vector<int64_t> g_fw;
PyObject* g_objs = nullptr;  // list: the module of each forward record
PyObject* g_roots = nullptr;  // list: the root call around it
PyObject* g_on_input = nullptr;  // called (module, args) inside each traced call's span, or null
int64_t g_dropped = 0;
int64_t g_last_named = -1;  // the output node named last (the next call's input, mostly)
PyObject *s_on_root, *s_failed, *s_step, *s_recording, *s_root, *s_call_impl,
    *s_compiled_call_impl;

// Report an exception raised by our own bookkeeping to tracer.failed(exc); never raise.
void report_failure() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (g_tracer && value) {
    PyObject* r = PyObject_CallMethodOneArg(g_tracer, s_failed, value);
    Py_XDECREF(r);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
}

// Runs the module as nn.Module.__call__ would.
PyObject* call_module(PyObject* self, PyObject* args, PyObject* kwargs) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (g_direct) {
    PyObject* compiled = PyObject_GetAttr(self, s_compiled_call_impl);
    if (!compiled) PyErr_Clear();
    bool plain = !compiled || compiled == Py_None;
    Py_XDECREF(compiled);
    if (plain) {
      if (!kwargs && n < 8) {  // no bound method and no tuple: a vectorcall of the method
        PyObject* stack[9];
        stack[0] = self;
        for (Py_ssize_t i = 0; i < n; i++) stack[i + 1] = PyTuple_GET_ITEM(args, i);
        return PyObject_VectorcallMethod(s_call_impl, stack, size_t(n + 1), nullptr);
      }
      PyObject* m = PyObject_GetAttr(self, s_call_impl);
      if (!m) return nullptr;
      PyObject* r = PyObject_Call(m, args, kwargs);
      Py_DECREF(m);
      return r;
    }
  }
  PyObject* full = PyTuple_New(n + 1);
  if (!full) return nullptr;
  Py_INCREF(self);
  PyTuple_SET_ITEM(full, 0, self);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    Py_INCREF(a);
    PyTuple_SET_ITEM(full, i + 1, a);
  }
  PyObject* r = PyObject_Call(g_orig_call, full, kwargs);
  Py_DECREF(full);
  return r;
}

// The tracer's on_root (step counting without an optimizer, samples, root); then re-read what
// it may have changed.
void on_root(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* r = PyObject_CallMethodObjArgs(g_tracer, s_on_root, self, args,
                                           kwargs ? kwargs : Py_None, nullptr);
  if (!r) {
    report_failure();
    return;
  }
  Py_DECREF(r);
  if (!g_tracer) return;  // it failed and unbound
  PyObject* step = PyObject_GetAttr(g_tracer, s_step);
  PyObject* rec = PyObject_GetAttr(g_tracer, s_recording);
  PyObject* root = PyObject_GetAttr(g_tracer, s_root);
  if (step && rec && root) {
    g_step = PyLong_AsLongLong(step);
    g_recording = PyObject_IsTrue(rec) == 1;
    Py_XSETREF(g_root, root);
    root = nullptr;
  }
  Py_XDECREF(step);
  Py_XDECREF(rec);
  Py_XDECREF(root);
  if (PyErr_Occurred()) report_failure();
}

// A tensor's grad_fn -> its key, or -1.
int64_t node_of(PyObject* o) {
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!t.defined()) return -1;
  const auto& gf = t.grad_fn();
  if (!gf) return -1;
  return node_key(gf->thread_id(), gf->sequence_nr());
}

// The call's input (its first argument, else its first keyword argument) -> its grad_fn's key,
// or -1: autograd reaching that node ends the call's backward. Read before the call (an
// in-place module replaces the input's grad_fn).
int64_t input_key(PyObject* args, PyObject* kwargs) {
  PyObject* a = nullptr;
  if (PyTuple_GET_SIZE(args)) {
    a = PyTuple_GET_ITEM(args, 0);
  } else if (kwargs) {
    Py_ssize_t pos = 0;
    PyObject* k;
    if (!PyDict_Next(kwargs, &pos, &k, &a)) return -1;
  }
  if (!a || !THPVariable_Check(a)) return -1;
  return node_of(a);
}

// The output's first tensor (a tensor, the first item of a tuple or list, or the first value of
// a dict such as a ModelOutput) -> its grad_fn's key, or -1.
int64_t output_key(PyObject* o) {
  if (!THPVariable_Check(o)) {
    if ((PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o)) ) {
      o = PyTuple_GET_ITEM(o, 0);
    } else if (PyList_CheckExact(o) && PyList_GET_SIZE(o)) {
      o = PyList_GET_ITEM(o, 0);
    } else if (PyDict_Check(o) && PyDict_GET_SIZE(o)) {
      Py_ssize_t pos = 0;
      PyObject *k, *v;
      if (!PyDict_Next(o, &pos, &k, &v)) return -1;
      o = v;
    } else {
      return -1;
    }
    if (!THPVariable_Check(o)) return -1;
  }
  return node_of(o);
}

// call(module, args, kwargs): nn.Module.__call__ while a traced step runs (trace_hot's shim).
PyObject* hot_call(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 3 || !PyTuple_Check(a[1])) {
    PyErr_SetString(PyExc_TypeError, "call(module, args: tuple, kwargs: dict | None)");
    return nullptr;
  }
  PyObject* self = a[0];
  PyObject* args = a[1];
  PyObject* kwargs = (PyDict_Check(a[2]) && PyDict_GET_SIZE(a[2])) ? a[2] : nullptr;
  if (!g_tracer) return call_module(self, args, kwargs);
  int64_t depth = g_depth;
  if (depth == 0 && g_in_backward.load(std::memory_order_relaxed) == FORWARD)
    on_root(self, args, kwargs);
  if (!g_tracer || !g_recording) {
    g_depth = depth + 1;
    PyObject* r = call_module(self, args, kwargs);
    g_depth = depth;
    return r;
  }
  int64_t kind = g_in_backward.load(std::memory_order_relaxed);
  int64_t in_key = -1;
  try {
    in_key = input_key(args, kwargs);
  } catch (...) {  // a tensor subclass whose grad_fn cannot be read: no end event
    in_key = -1;
  }
  g_depth = depth + 1;
  int64_t t0 = now_ns();
  if (g_on_input) {  // the saved-bytes accounting's input record (it never raises)
    PyObject* r = PyObject_CallFunctionObjArgs(g_on_input, self, args, nullptr);
    if (r) {
      Py_DECREF(r);
    } else {
      report_failure();
    }
  }
  PyObject* out = call_module(self, args, kwargs);
  int64_t t1 = now_ns();
  g_depth = depth;
  if (!out || !g_tracer) return out;
  if (g_fw.size() + FW_N > g_fw_max) {
    g_dropped++;
    return out;
  }
  int64_t key = -1;
  try {
    key = output_key(out);
  } catch (...) {  // a tensor subclass whose grad_fn cannot be read: no backward row
    key = -1;
  }
  // objects first, record last: the writer takes as many objects as records, so a failure
  // takes back what it appended
  Py_ssize_t n_objs = PyList_GET_SIZE(g_objs), n_roots = PyList_GET_SIZE(g_roots);
  bool ok = PyList_Append(g_objs, self) == 0 && PyList_Append(g_roots, g_root) == 0;
  if (ok) {
    int64_t rec[FW_N] = {t0, t1, g_step, kind, depth, key, 0, in_key};
    try {
      g_fw.insert(g_fw.end(), rec, rec + FW_N);
    } catch (...) {  // out of memory: a C++ exception must not cross into Python
      ok = false;
      PyErr_NoMemory();
    }
  }
  if (!ok) {
    report_failure();
    PyList_SetSlice(g_objs, n_objs, PyList_GET_SIZE(g_objs), nullptr);
    PyList_SetSlice(g_roots, n_roots, PyList_GET_SIZE(g_roots), nullptr);
  } else {
    // most inputs are the output of the call recorded just before: named already
    if (key != -1) name_node(g_step, key);
    if (in_key != -1 && in_key != g_last_named) name_node(g_step, in_key);
    if (key != -1) g_last_named = key;
  }
  return out;
}

PyObject* bytes_of(const int64_t* p, size_t n) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(p), Py_ssize_t(n * 8));
}

// take() -> (backward events up to the last pass end, forward records, objects, roots,
// dropped forward records, dropped backward events): the writer's share, in that order (every
// event taken names forward records taken with it or before). Called with the GIL.
PyObject* take(PyObject*, PyObject*) {
  PyObject* bw;
  {
    std::lock_guard<std::mutex> lock(g_bw_mu);
    size_t n = g_bw.size() / BW_N, cut = 0;
    for (size_t i = n; i > 0; i--) {
      if (g_bw[(i - 1) * BW_N + 1] == PASS_END) {
        cut = i;
        break;
      }
    }
    if (cut == 0 && n * BW_N > g_bw_max / 2) cut = n;  // a pass that never ends: do not grow
    bw = bytes_of(g_bw.data(), cut * BW_N);
    if (bw) g_bw.erase(g_bw.begin(), g_bw.begin() + cut * BW_N);
  }
  if (!bw) return nullptr;
  PyObject* fw = bytes_of(g_fw.data(), g_fw.size());
  PyObject* objs = PyList_New(0);
  PyObject* roots = PyList_New(0);
  if (!fw || !objs || !roots) {
    Py_XDECREF(fw);
    Py_XDECREF(objs);
    Py_XDECREF(roots);
    Py_DECREF(bw);
    return nullptr;
  }
  g_fw.clear();
  std::swap(objs, g_objs);
  std::swap(roots, g_roots);
  int64_t dropped = g_dropped;
  g_dropped = 0;
  return Py_BuildValue("(NNNNLL)", bw, fw, objs, roots, (long long)dropped,
                       (long long)g_bw_dropped.exchange(0));
}

// bind(tracer, orig_call, direct, fw_max, bw_max): record into tracer's buffers from now on.
PyObject* bind(PyObject*, PyObject* args) {
  PyObject *tracer, *orig;
  int direct;
  Py_ssize_t fw_max, bw_max;
  if (!PyArg_ParseTuple(args, "OOpnn", &tracer, &orig, &direct, &fw_max, &bw_max))
    return nullptr;
  Py_INCREF(tracer);
  Py_XSETREF(g_tracer, tracer);
  Py_INCREF(orig);
  Py_XSETREF(g_orig_call, orig);
  g_direct = direct;
  g_fw_max = size_t(fw_max);
  g_bw_max = size_t(bw_max);
  Py_RETURN_NONE;
}

// inputs(fn or None): call fn(module, args) inside each traced call's span from now on, or stop.
PyObject* inputs(PyObject*, PyObject* fn) {
  if (fn == Py_None) {
    Py_CLEAR(g_on_input);
  } else {
    Py_INCREF(fn);
    Py_XSETREF(g_on_input, fn);
  }
  Py_RETURN_NONE;
}

// unbind(): pass through from now on (the tracer stopped or failed; also a forked child).
PyObject* unbind(PyObject*, PyObject*) {
  Py_CLEAR(g_tracer);
  g_recording = false;
  Py_RETURN_NONE;
}

// sync(step, recording, root, boundary): the tracer's step state; at a step boundary also
// depth 0 and no backward running (as TorchTracer._apply does for the Python path).
PyObject* sync(PyObject*, PyObject* args) {
  long long step;
  int recording, boundary;
  PyObject* root;
  if (!PyArg_ParseTuple(args, "LpOp", &step, &recording, &root, &boundary)) return nullptr;
  g_step = step;
  g_recording = recording && g_tracer;
  Py_INCREF(root);
  Py_XSETREF(g_root, root);
  if (boundary) {
    g_depth = 0;
    g_in_backward = FORWARD;
  }
  Py_RETURN_NONE;
}

// state() -> (depth, in_backward, callback installed, buffered forward records, events)
PyObject* state(PyObject*, PyObject*) {
  size_t nbw;
  {
    std::lock_guard<std::mutex> lock(g_bw_mu);
    nbw = g_bw.size() / BW_N;
  }
  return Py_BuildValue("(LLOnn)", (long long)g_depth, (long long)g_in_backward.load(),
                       g_handle ? Py_True : Py_False, Py_ssize_t(g_fw.size() / FW_N),
                       Py_ssize_t(nbw));
}

// layout() -> (FW_N, BW_N, PASS_END, FORWARD, RECOMPUTE, KEEP_STEPS): trace_native.py checks
// them against trace_columns.py before using this build.
PyObject* layout(PyObject*, PyObject*) {
  return Py_BuildValue("(LLLLLL)", (long long)FW_N, (long long)BW_N, (long long)PASS_END,
                       (long long)FORWARD, (long long)RECOMPUTE, (long long)KEEP_STEPS);
}

PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))hot_call, METH_FASTCALL, nullptr},
    {"take", take, METH_NOARGS, nullptr},
    {"bind", bind, METH_VARARGS, nullptr},
    {"unbind", unbind, METH_NOARGS, nullptr},
    {"inputs", inputs, METH_O, nullptr},
    {"sync", sync, METH_VARARGS, nullptr},
    {"backward", backward, METH_O, nullptr},
    {"state", state, METH_NOARGS, nullptr},
    {"layout", layout, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  s_on_root = PyUnicode_InternFromString("on_root");
  s_failed = PyUnicode_InternFromString("failed");
  s_step = PyUnicode_InternFromString("step");
  s_recording = PyUnicode_InternFromString("recording");
  s_root = PyUnicode_InternFromString("root");
  s_call_impl = PyUnicode_InternFromString("_call_impl");
  s_compiled_call_impl = PyUnicode_InternFromString("_compiled_call_impl");
  g_objs = PyList_New(0);
  g_roots = PyList_New(0);
  Py_INCREF(Py_None);
  g_root = Py_None;
  for (PyMethodDef* d = methods; d->ml_name; d++) {
    m.add_object(d->ml_name, py::reinterpret_steal<py::object>(PyCFunction_New(d, nullptr)));
  }
}
