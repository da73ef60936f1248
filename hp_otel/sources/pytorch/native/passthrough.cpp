// hp_otel's optional native collective kernels: the Python kernels of kernels.py behind a C++ gate.
//
// The Python kernels sit on each collective op's BackendSelect key. Every call into one is a round
// trip into Python (boxing the arguments, a ProcessGroup crosses as a TorchScript object), paid even
// when the kernel only passes the call on: by a functional collective's inner c10d op (recorded as
// part of the outer one), and by every collective while hooks are kept but no window records. This
// kernel takes the BackendSelect key instead and decides in C++: pass the call on (no window records,
// a meta tensor, or an inner call of a collective already being recorded on this thread), or call the
// Python kernel with the same (keyset, *args, **kwargs) torch's own Python kernels get. Python decides
// everything else, so the two paths record the same collectives.
//
// The same module carries the op hook's filter (op_hook.py): DTensor's `__torch_function__` while a
// window records ops, deciding in C what records nothing (an attribute read or write, a context with
// no window, a call inside backward) and handing only the rest to the Python hook.
//
// Built by `hp-otel build-native` (native/__init__.py: torch.utils.cpp_extension, once per machine, into
// the cache folder); windows use it when it is there (HP_OTEL_TORCH_NATIVE=off: not); never required.

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/graph_task.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

// Exported by libtorch_python (torch/csrc/jit/python/pybind_utils.h); declared here rather than
// including that header, whose build takes minutes.
namespace torch::jit {
py::object toPyObject(c10::IValue ivalue);
c10::IValue toIValue(py::handle obj, const c10::TypePtr& type, std::optional<int32_t> N);
}  // namespace torch::jit

namespace {

std::atomic<bool> recording{false};  // a window records through the kernels (kernels.acquire/release)
thread_local int recording_depth = 0;  // this thread is inside a collective handed to Python

// Python's (keyset, *args) and kwargs for the call: keyword-only arguments by name, the rest by position.
std::pair<py::tuple, py::dict> to_python(
    const c10::FunctionSchema& schema, c10::DispatchKeySet keyset, torch::jit::Stack& stack) {
  const auto& arguments = schema.arguments();
  const size_t n = arguments.size();
  const size_t first = stack.size() - n;
  size_t positional = 0;
  while (positional < n && !arguments[positional].kwarg_only()) {
    ++positional;
  }
  py::tuple args(positional + 1);
  args[0] = py::cast(keyset);
  py::dict kwargs;
  for (size_t i = 0; i < n; ++i) {
    py::object value = torch::jit::toPyObject(std::move(stack[first + i]));
    if (i < positional) {
      PyTuple_SET_ITEM(args.ptr(), i + 1, value.release().ptr());
    } else {
      kwargs[py::str(arguments[i].name())] = std::move(value);
    }
  }
  stack.resize(first);
  return {std::move(args), std::move(kwargs)};
}

void push_results(const c10::FunctionSchema& schema, torch::jit::Stack& stack, const py::object& out) {
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack.push_back(torch::jit::toIValue(out, returns[0].real_type(), std::nullopt));
  } else if (!returns.empty()) {
    auto items = py::cast<py::sequence>(out);
    TORCH_CHECK(items.size() == returns.size(), "hp_otel kernel: ", returns.size(), " results expected");
    for (size_t i = 0; i < returns.size(); ++i) {
      stack.push_back(torch::jit::toIValue(items[i], returns[i].real_type(), std::nullopt));
    }
  }
}

class Gate final : public c10::OperatorKernel {
 public:
  Gate(py::object kernel, bool collective) : kernel_(kernel.release().ptr()), collective_(collective) {}
  ~Gate() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      Py_XDECREF(kernel_);
    }  // else: the interpreter is gone, and the reference with it
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
    c10::DispatchKeySet below = keyset.remove(c10::DispatchKey::BackendSelect);
    if (!recording.load(std::memory_order_relaxed) || recording_depth > 0 || below.has(c10::DispatchKey::Meta)) {
      op.redispatchBoxed(below, stack);  // not recorded: as if no kernel were there
      return;
    }
    const auto& schema = op.schema();
    struct Depth {  // restored however the call ends
      bool counted;
      explicit Depth(bool c) : counted(c) { recording_depth += counted; }
      ~Depth() { recording_depth -= counted; }
    } depth(collective_);
    py::gil_scoped_acquire gil;
    auto [args, kwargs] = to_python(schema, keyset, *stack);
    PyObject* result = PyObject_Call(kernel_, args.ptr(), kwargs.empty() ? nullptr : kwargs.ptr());
    if (result == nullptr) {
      throw py::error_already_set();
    }
    py::object out = py::reinterpret_steal<py::object>(result);
    push_results(schema, *stack, out);
  }

 private:
  PyObject* kernel_;
  bool collective_;  // an inner call of this one passes through (wait_tensor's do not nest)
};

// One op filter's state, the builtin's `self` (make_op_filter): a tuple, read without a lookup.
enum OpFilterItem : Py_ssize_t {
  kObserverVar, kHook, kOriginal, kMethodWrapper, kNameAttr, kNoKwargs, kOwner, kItems
};
// kObserverVar: op_hook's ContextVar (this context's window, or None); kHook: the Python hook
// (cls, func, types, args, kwargs); kOriginal: torch._C._disabled_torch_function_impl;
// kMethodWrapper: type(object().__str__), what an attribute access passes as func; kNameAttr: "__name__";
// kNoKwargs: the hook's own empty dict for a call without kwargs (never mutated: `**{}` copies it);
// kOwner: DTensor, the `cls` the Python hook is called with (the filter is a plain builtin on the
// class, as torch's own disabled impl is: no bound method made at each of torch's two lookups).

// CPython's `method-wrapper` object (descrobject.c's wrapperobject; private, so its layout is checked
// once on a known one, method_wrapper_layout_ok, and the name is read by attribute where it differs).
struct MethodWrapper {
  PyObject_HEAD
  PyWrapperDescrObject* descr;
  PyObject* self;
};
bool method_wrapper_layout_ok = false;

bool is_access_name(const char* name) {
  return std::strcmp(name, "__get__") == 0 || std::strcmp(name, "__set__") == 0 || std::strcmp(name, "__delete__") == 0;
}

// True when func is a getset descriptor's bound __get__ / __set__ / __delete__ (p.grad, x.shape).
bool is_attribute_access(PyObject* state, PyObject* func) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(func)) != PyTuple_GET_ITEM(state, kMethodWrapper)) {
    return false;
  }
  if (method_wrapper_layout_ok) {
    return is_access_name(reinterpret_cast<MethodWrapper*>(func)->descr->d_base->name);
  }
  PyObject* name = PyObject_GetAttr(func, PyTuple_GET_ITEM(state, kNameAttr));
  if (name == nullptr) {
    PyErr_Clear();
    return false;  // the Python hook decides
  }
  bool access = PyUnicode_Check(name) &&
      (PyUnicode_CompareWithASCIIString(name, "__get__") == 0 ||
       PyUnicode_CompareWithASCIIString(name, "__set__") == 0 ||
       PyUnicode_CompareWithASCIIString(name, "__delete__") == 0);
  Py_DECREF(name);
  return access;
}

// True when no window of this context records (its ContextVar holds None).
bool no_window_here(PyObject* state) {
  PyObject* value = nullptr;
  if (PyContextVar_Get(PyTuple_GET_ITEM(state, kObserverVar), Py_None, &value) < 0) {
    PyErr_Clear();
    return false;  // the Python hook decides
  }
  bool none = value == Py_None;
  Py_XDECREF(value);
  return none;
}

// DTensor.__torch_function__ (a plain builtin on the class): (func, types, args[, kwargs]); torch passes
// no kwargs for an attribute access, and the Python hook takes None or none as its empty dict.
PyObject* op_filter_call(PyObject* state, PyObject* const* argv, Py_ssize_t nargs, PyObject* kwnames) {
  // the Python hook's own first passes, in its order
  if ((nargs == 3 || nargs == 4) && kwnames == nullptr &&
      (is_attribute_access(state, argv[0]) || no_window_here(state) ||
       torch::autograd::get_current_graph_task_id() != -1)) {
    PyObject* call[4] = {argv[0], argv[1], argv[2], PyTuple_GET_ITEM(state, kNoKwargs)};
    if (nargs == 4 && argv[3] != Py_None) {
      call[3] = argv[3];
    }
    return PyObject_Vectorcall(PyTuple_GET_ITEM(state, kOriginal), call, 4, nullptr);
  }
  if (kwnames == nullptr && nargs <= 4) {  // the hook's (cls, func, types, args[, kwargs])
    PyObject* call[5] = {PyTuple_GET_ITEM(state, kOwner)};
    std::copy(argv, argv + nargs, call + 1);
    return PyObject_Vectorcall(PyTuple_GET_ITEM(state, kHook), call, static_cast<size_t>(nargs) + 1, nullptr);
  }
  try {  // another call shape (never torch's): the hook gets the same arguments, by tuple and dict
    py::list items;
    items.append(py::handle(PyTuple_GET_ITEM(state, kOwner)));
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      items.append(py::handle(argv[i]));
    }
    py::dict kwargs;
    for (Py_ssize_t i = nargs; i < total; ++i) {
      kwargs[py::handle(PyTuple_GET_ITEM(kwnames, i - nargs))] = py::handle(argv[i]);
    }
    return PyObject_Call(PyTuple_GET_ITEM(state, kHook), py::tuple(items).ptr(), kwargs.ptr());
  } catch (py::error_already_set& error) {
    error.restore();
    return nullptr;
  }
}

PyMethodDef op_filter_def = {
    "hp_otel_op_filter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(op_filter_call)),
    METH_FASTCALL | METH_KEYWORDS, "hp_otel's op hook filter (sources/pytorch/op_hook.py)"};

py::object make_op_filter(
    py::object observer_var, py::object hook, py::object original, py::object method_wrapper, py::dict no_kwargs,
    py::object owner) {
  TORCH_CHECK(PyContextVar_CheckExact(observer_var.ptr()), "hp_otel op filter: a ContextVar expected");
  TORCH_CHECK(PyType_Check(method_wrapper.ptr()), "hp_otel op filter: a type expected");
  py::tuple state = py::make_tuple(observer_var, hook, original, method_wrapper, py::str("__name__"), no_kwargs, owner);
  static_assert(kItems == 7, "the state tuple's items");
  // the layout check: object().__str__ is a method-wrapper of object's __str__ slot wrapper
  py::object object_type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  py::object probe = object_type();
  py::object bound = probe.attr("__str__");
  py::object slot = object_type.attr("__dict__")["__str__"];
  method_wrapper_layout_ok = Py_TYPE(bound.ptr()) == reinterpret_cast<PyTypeObject*>(method_wrapper.ptr()) &&
      reinterpret_cast<MethodWrapper*>(bound.ptr())->descr == reinterpret_cast<PyWrapperDescrObject*>(slot.ptr()) &&
      reinterpret_cast<MethodWrapper*>(bound.ptr())->self == probe.ptr() &&
      std::strcmp(reinterpret_cast<PyWrapperDescrObject*>(slot.ptr())->d_base->name, "__str__") == 0;
  PyObject* filter = PyCFunction_New(&op_filter_def, state.ptr());
  if (filter == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(filter);
}

// namespace -> the library its kernels are registered through; destroying it unregisters them.
std::unordered_map<std::string, std::unique_ptr<torch::Library>> libraries;

void register_kernel(const std::string& ns, const std::string& name, py::object kernel, bool collective) {
  auto& library = libraries[ns];
  if (!library) {
    library = std::make_unique<torch::Library>(
        torch::Library::IMPL, ns, c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
  }
  library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Gate>(kernel, collective)));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hp_otel's native gate in front of its Python collective kernels (sources/pytorch/native)";
  m.def("register", &register_kernel, py::arg("namespace"), py::arg("name"), py::arg("kernel"), py::arg("collective"),
        "Put `kernel` (keyset, *args, **kwargs) behind a C++ gate on the op's BackendSelect key");
  m.def("unregister_all", [] { libraries.clear(); }, "Take every gate out: torch's own kernels again");
  m.def("set_recording", [](bool on) { recording.store(on, std::memory_order_relaxed); },
        "Whether a window records: when not, every call passes through in C++");
  m.def("op_filter", &make_op_filter, py::arg("observer_var"), py::arg("hook"), py::arg("original"),
        py::arg("method_wrapper"), py::arg("no_kwargs"), py::arg("owner"),
        "A builtin (func, types, args, kwargs) that runs `original` for what records nothing, `hook` otherwise");
  m.def("op_filter_fast_names", [] { return method_wrapper_layout_ok; },
        "Whether the filter reads a method-wrapper's name from its slot (the layout checked), not by attribute");
  m.def("recording_depth", [] { return recording_depth; }, "This thread's collectives now in Python (tests)");
}
