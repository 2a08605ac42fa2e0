// opforge.backends.cpu._fastcall: one cpu delegate call from Python with no Python per
// argument. A CPython extension (not part of the engine library, which loads with ctypes and
// needs no Python headers); fastcall.py builds and loads it, and the runtime falls back to
// its ctypes path where it cannot.
//
// A Call object stands for one engine bound to one method instance (engine.Binding). Called
// with the method's input tuple it checks each input against the bound dtype and shape (an
// exact ndarray, C-contiguous, aligned, native byte order), takes the method's busy lock
// without waiting, allocates the outputs, takes the delegate's lock, checks under it that
// the engine was not closed (closing takes the same lock), points the engine's
// pointer tables at the caller's inputs and the new outputs, runs ofc_execute without the GIL
// and puts the bound pointers back. It returns the outputs as a tuple, or None when the
// inputs do not qualify, the method is busy or the engine was closed: the caller's Python
// path then converts, copies, or raises the error it always raised. An engine error calls
// the `error` callable with the engine's message; it raises (the method names the
// instruction).

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using Entry = int32_t (*)(void*, void* const*, void* const*, char*, int32_t);

struct Spec {
  PyArray_Descr* dtype;  // owned reference
  std::vector<npy_intp> dims;
};

struct Call {
  PyObject_HEAD
  Entry entry;
  void* engine;
  void** ins;   // the binding's pointer tables (ctypes arrays the owner keeps alive)
  void** outs;
  std::vector<void*>* bound_ins;  // what the tables hold between calls
  std::vector<void*>* bound_outs;
  std::vector<Spec>* in_specs;
  std::vector<Spec>* out_specs;
  char* err;
  int32_t err_size;
  PyObject* busy;     // the method's threading.Lock (acquired without waiting)
  PyObject* lock;     // the delegate's threading.Lock (shared by the method's instances)
  PyObject* handle;   // the engine handle object: its `closed` is read per call
  PyObject* error;    // error(message) raises
  PyObject* owner;    // keeps the tables and the error buffer alive
};

PyObject* s_acquire;
PyObject* s_release;
PyObject* s_closed;

bool parse_specs(PyObject* seq, std::vector<Spec>& out) {
  PyObject* fast = PySequence_Fast(seq, "specs must be a sequence of (dtype, shape)");
  if (!fast) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    PyObject *dtype_obj, *shape;
    if (!PyArg_ParseTuple(item, "OO", &dtype_obj, &shape)) {
      Py_DECREF(fast);
      return false;
    }
    Spec spec{nullptr, {}};
    if (!PyArray_DescrConverter(dtype_obj, &spec.dtype)) {
      Py_DECREF(fast);
      return false;
    }
    out.push_back(spec);  // owns the reference from here (dealloc drops it)
    PyObject* dims = PySequence_Fast(shape, "a shape must be a sequence of ints");
    if (!dims) {
      Py_DECREF(fast);
      return false;
    }
    const Py_ssize_t nd = PySequence_Fast_GET_SIZE(dims);
    if (nd > NPY_MAXDIMS) {
      PyErr_SetString(PyExc_ValueError, "too many dimensions");
      Py_DECREF(dims);
      Py_DECREF(fast);
      return false;
    }
    for (Py_ssize_t d = 0; d < nd; ++d) {
      const Py_ssize_t v = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(dims, d), PyExc_OverflowError);
      if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(dims);
        Py_DECREF(fast);
        return false;
      }
      if (v < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative dimension");
        Py_DECREF(dims);
        Py_DECREF(fast);
        return false;
      }
      out.back().dims.push_back((npy_intp)v);
    }
    Py_DECREF(dims);
  }
  Py_DECREF(fast);
  return true;
}

bool read_addresses(PyObject* seq, std::vector<void*>& out) {
  PyObject* fast = PySequence_Fast(seq, "addresses must be a sequence of ints");
  if (!fast) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    void* p = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(fast, i));
    if (!p && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
    out.push_back(p);
  }
  Py_DECREF(fast);
  return true;
}

void Call_dealloc(Call* self) {
  for (auto* specs : {self->in_specs, self->out_specs}) {
    if (!specs) continue;
    for (Spec& s : *specs) Py_XDECREF(s.dtype);
    delete specs;
  }
  delete self->bound_ins;
  delete self->bound_outs;
  Py_XDECREF(self->busy);
  Py_XDECREF(self->lock);
  Py_XDECREF(self->handle);
  Py_XDECREF(self->error);
  Py_XDECREF(self->owner);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// Call(entry, engine, ins, outs, bound_ins, bound_outs, in_specs, out_specs, err, err_size,
//      busy, lock, handle, error, owner): addresses as ints, specs as (dtype, shape) pairs
int Call_init(Call* self, PyObject* args, PyObject* kwargs) {
  PyObject *entry, *engine, *ins, *outs, *bound_ins, *bound_outs, *in_specs, *out_specs, *err;
  int err_size;
  PyObject *busy, *lock, *handle, *error, *owner;
  if (kwargs && PyDict_Size(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "Call takes positional arguments only");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "OOOOOOOOOiOOOOO", &entry, &engine, &ins, &outs, &bound_ins,
                        &bound_outs, &in_specs, &out_specs, &err, &err_size, &busy, &lock,
                        &handle, &error, &owner))
    return -1;
  if (self->in_specs) {
    PyErr_SetString(PyExc_TypeError, "Call is initialised once");
    return -1;
  }
  self->in_specs = new std::vector<Spec>();
  self->out_specs = new std::vector<Spec>();
  self->bound_ins = new std::vector<void*>();
  self->bound_outs = new std::vector<void*>();
  self->entry = reinterpret_cast<Entry>(PyLong_AsVoidPtr(entry));
  self->engine = PyLong_AsVoidPtr(engine);
  self->ins = static_cast<void**>(PyLong_AsVoidPtr(ins));
  self->outs = static_cast<void**>(PyLong_AsVoidPtr(outs));
  self->err = static_cast<char*>(PyLong_AsVoidPtr(err));
  self->err_size = err_size;
  if (PyErr_Occurred()) return -1;
  if (!self->entry || !self->engine || !self->ins || !self->outs || !self->err || err_size < 1) {
    PyErr_SetString(PyExc_ValueError, "Call: a null address or an empty error buffer");
    return -1;
  }
  if (!parse_specs(in_specs, *self->in_specs) || !parse_specs(out_specs, *self->out_specs) ||
      !read_addresses(bound_ins, *self->bound_ins) || !read_addresses(bound_outs, *self->bound_outs))
    return -1;
  if (self->bound_ins->size() != self->in_specs->size() ||
      self->bound_outs->size() != self->out_specs->size()) {
    PyErr_SetString(PyExc_ValueError, "Call: one bound address per input and per output");
    return -1;
  }
  Py_INCREF(busy);
  self->busy = busy;
  Py_INCREF(lock);
  self->lock = lock;
  Py_INCREF(handle);
  self->handle = handle;
  Py_INCREF(error);
  self->error = error;
  Py_INCREF(owner);
  self->owner = owner;
  return 0;
}

// lock.acquire(False) (busy) or lock.acquire(): 1 taken, 0 not, -1 an exception
int acquire(PyObject* lock, bool wait) {
  PyObject* result = wait ? PyObject_CallMethodNoArgs(lock, s_acquire)
                          : PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
  if (!result) return -1;
  const int taken = PyObject_IsTrue(result);
  Py_DECREF(result);
  return taken;
}

void release(PyObject* lock) {
  PyObject* result = PyObject_CallMethodNoArgs(lock, s_release);
  if (result) {
    Py_DECREF(result);
  } else {
    PyErr_WriteUnraisable(lock);  // a lock we hold always releases
  }
}

// the handle's `closed`: 1 closed, 0 not, -1 an exception
int handle_closed(PyObject* handle) {
  PyObject* closed = PyObject_GetAttr(handle, s_closed);
  if (!closed) return -1;
  const int is_closed = PyObject_IsTrue(closed);
  Py_DECREF(closed);
  return is_closed;
}

bool qualifies(PyObject* a, const Spec& spec) {
  if (!PyArray_CheckExact(a)) return false;
  auto* arr = reinterpret_cast<PyArrayObject*>(a);
  const int flags = PyArray_FLAGS(arr);
  if ((flags & (NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED)) !=
      (NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED))
    return false;
  PyArray_Descr* d = PyArray_DESCR(arr);
  if (d != spec.dtype && !PyArray_EquivTypes(d, spec.dtype)) return false;
  const int nd = PyArray_NDIM(arr);
  if ((size_t)nd != spec.dims.size()) return false;
  const npy_intp* dims = PyArray_DIMS(arr);
  for (int k = 0; k < nd; ++k)
    if (dims[k] != spec.dims[(size_t)k]) return false;
  return true;
}

PyObject* Call_call(Call* self, PyObject* args, PyObject* kwargs) {
  PyObject* inputs;
  if ((kwargs && PyDict_Size(kwargs)) || !PyArg_ParseTuple(args, "O!", &PyTuple_Type, &inputs)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "call(inputs: tuple)");
    return nullptr;
  }
  const std::vector<Spec>& in_specs = *self->in_specs;
  const std::vector<Spec>& out_specs = *self->out_specs;
  const size_t n_in = in_specs.size(), n_out = out_specs.size();
  if ((size_t)PyTuple_GET_SIZE(inputs) != n_in) Py_RETURN_NONE;
  for (size_t k = 0; k < n_in; ++k)
    if (!qualifies(PyTuple_GET_ITEM(inputs, (Py_ssize_t)k), in_specs[k])) Py_RETURN_NONE;
  const int free_now = acquire(self->busy, false);
  if (free_now <= 0) {
    if (free_now < 0) return nullptr;
    Py_RETURN_NONE;  // another thread is inside: the Python path raises ConcurrentCallError
  }
  PyObject* outputs = PyTuple_New((Py_ssize_t)n_out);
  if (!outputs) {
    release(self->busy);
    return nullptr;
  }
  for (size_t k = 0; k < n_out; ++k) {
    const Spec& s = out_specs[k];
    Py_INCREF(s.dtype);  // PyArray_Empty steals it
    PyObject* a = PyArray_Empty((int)s.dims.size(), const_cast<npy_intp*>(s.dims.data()), s.dtype, 0);
    if (!a) {
      Py_DECREF(outputs);
      release(self->busy);
      return nullptr;
    }
    PyTuple_SET_ITEM(outputs, (Py_ssize_t)k, a);
  }
  const int locked = acquire(self->lock, true);
  if (locked <= 0) {
    Py_DECREF(outputs);
    release(self->busy);
    if (locked == 0) PyErr_SetString(PyExc_RuntimeError, "the delegate's lock was not taken");
    return nullptr;
  }
  // read under the delegate's lock, which closing the delegate takes before it frees the
  // engine: read before it, a close between the two freed the engine under this call
  const int is_closed = handle_closed(self->handle);
  if (is_closed != 0) {
    Py_DECREF(outputs);
    release(self->lock);
    release(self->busy);
    if (is_closed < 0) return nullptr;
    Py_RETURN_NONE;  // the Python path raises the closed-delegate error
  }
  for (size_t k = 0; k < n_in; ++k)
    self->ins[k] = PyArray_DATA(reinterpret_cast<PyArrayObject*>(PyTuple_GET_ITEM(inputs, (Py_ssize_t)k)));
  for (size_t k = 0; k < n_out; ++k)
    self->outs[k] = PyArray_DATA(reinterpret_cast<PyArrayObject*>(PyTuple_GET_ITEM(outputs, (Py_ssize_t)k)));
  int32_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = self->entry(self->engine, self->ins, self->outs, self->err, self->err_size);
  Py_END_ALLOW_THREADS
  for (size_t k = 0; k < n_in; ++k) self->ins[k] = (*self->bound_ins)[k];
  for (size_t k = 0; k < n_out; ++k) self->outs[k] = (*self->bound_outs)[k];
  release(self->lock);
  release(self->busy);
  if (rc == 0) return outputs;
  Py_DECREF(outputs);
  self->err[self->err_size - 1] = '\0';
  PyObject* message = PyUnicode_DecodeUTF8(self->err, (Py_ssize_t)strlen(self->err), "replace");
  if (!message) return nullptr;
  PyObject* raised = PyObject_CallOneArg(self->error, message);
  Py_DECREF(message);
  if (raised) {  // error() returned instead of raising
    Py_DECREF(raised);
    PyErr_SetString(PyExc_RuntimeError, "cpu backend: the engine failed and error() did not raise");
  }
  return nullptr;
}

PyTypeObject CallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_fastcall",
                          "One cpu delegate call from Python without per-argument Python.",
                          -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__fastcall(void) {
  import_array();
  s_acquire = PyUnicode_InternFromString("acquire");
  s_release = PyUnicode_InternFromString("release");
  s_closed = PyUnicode_InternFromString("closed");
  if (!s_acquire || !s_release || !s_closed) return nullptr;
  CallType.tp_name = "opforge.backends.cpu._fastcall.Call";
  CallType.tp_basicsize = sizeof(Call);
  CallType.tp_flags = Py_TPFLAGS_DEFAULT;
  CallType.tp_doc = "One engine bound to one method instance: call(inputs) -> outputs or None.";
  CallType.tp_new = PyType_GenericNew;
  CallType.tp_init = reinterpret_cast<initproc>(Call_init);
  CallType.tp_dealloc = reinterpret_cast<destructor>(Call_dealloc);
  CallType.tp_call = reinterpret_cast<ternaryfunc>(Call_call);
  if (PyType_Ready(&CallType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&CallType);
  if (PyModule_AddObject(m, "Call", reinterpret_cast<PyObject*>(&CallType)) < 0) {
    Py_DECREF(&CallType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
