// The numpy arrays the core keeps or is handed on each call, read through numpy's C API: checked where they
// enter (ValueError naming what was expected), then used as raw data.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "numpy_api.h"

namespace rlflow {

// `h` as an aligned, C-contiguous numpy array of `type_num` (-1: any) and `size` entries (-1: any), writeable
// unless `read_only`; ValueError naming `what` otherwise. (Columns of any byte order are copied as bytes; the
// arrays whose values the core reads are rlflow's own, native, or checked where they are taken.)
inline PyArrayObject* checked_array(nanobind::handle h, int type_num, int64_t size, const char* what,
                                    bool read_only = false) {
  if (!PyArray_Check(h.ptr())) throw std::invalid_argument(std::string(what) + ": expected a numpy array");
  auto* a = reinterpret_cast<PyArrayObject*>(h.ptr());
  if (!PyArray_IS_C_CONTIGUOUS(a) || !(read_only || PyArray_ISWRITEABLE(a)) || !PyArray_ISALIGNED(a)) {
    throw std::invalid_argument(std::string(what) + ": expected " + (read_only ? "an" : "a writeable,") +
                                " aligned, C-contiguous array");
  }
  // A typed array is read as native values: int64 spelled longlong is the same, a byte-swapped one is not.
  const bool typed = type_num < 0 || (PyArray_ISNOTSWAPPED(a) && (PyArray_TYPE(a) == type_num ||
                                                                 PyArray_EquivTypenums(PyArray_TYPE(a), type_num)));
  if (!typed || (size >= 0 && PyArray_SIZE(a) != size)) {
    throw std::invalid_argument(std::string(what) + ": expected " + (size >= 0 ? std::to_string(size) : "any") +
                                " entries of its native dtype");
  }
  return a;
}

template <class T>
T* array_data(nanobind::handle h, int type_num, int64_t size, const char* what) {
  return static_cast<T*>(PyArray_DATA(checked_array(h, type_num, size, what)));
}

// An array the call only reads, as native, aligned, C-contiguous values of `type_num`: the array itself when it
// is already so, else a converted copy held as long as this object (a value that numpy cannot cast safely
// raises its TypeError). Reads as a `const T*`. `own_copy`: always a copy of the caller's values, for indices
// that are checked and then used with the GIL released (no other thread can change a checked index then).
template <class T>
class ArrayIn {
 public:
  ArrayIn(nanobind::handle h, int type_num, int64_t size, const char* what, bool own_copy = false) {
    if (!PyArray_Check(h.ptr())) throw std::invalid_argument(std::string(what) + ": expected a numpy array");
    PyObject* a = PyArray_FROMANY(h.ptr(), type_num, 0, 0, NPY_ARRAY_IN_ARRAY | (own_copy ? NPY_ARRAY_ENSURECOPY : 0));
    if (a == nullptr) throw nanobind::python_error();
    owner_ = nanobind::steal(a);
    auto* arr = reinterpret_cast<PyArrayObject*>(a);
    if (size >= 0 && PyArray_SIZE(arr) != size) {
      throw std::invalid_argument(std::string(what) + ": expected " + std::to_string(size) + " entries, got " +
                                  std::to_string(PyArray_SIZE(arr)));
    }
    data_ = static_cast<const T*>(PyArray_DATA(arr));
  }
  operator const T*() const { return data_; }
  const T* get() const { return data_; }

 private:
  nanobind::object owner_;
  const T* data_ = nullptr;
};

template <class T>
ArrayIn<T> array_in(nanobind::handle h, int type_num, int64_t size, const char* what) {
  return ArrayIn<T>(h, type_num, size, what);
}

// Indices (or other values checked where they enter) that the call reads after releasing the GIL: a copy.
template <class T>
ArrayIn<T> indices_in(nanobind::handle h, int type_num, int64_t size, const char* what) {
  return ArrayIn<T>(h, type_num, size, what, true);
}

// Uniform draws in [0, 1) handed in (a value outside, NaN included, would pick outside what it draws from).
inline ArrayIn<double> uniforms_in(nanobind::handle h, int64_t size, const char* what) {
  ArrayIn<double> u(h, NPY_FLOAT64, size, what, true);
  for (int64_t i = 0; i < size; ++i) {
    if (!(u[i] >= 0.0 && u[i] < 1.0)) {
      throw std::invalid_argument(std::string(what) + ": expected values in [0, 1), got " + std::to_string(u[i]) +
                                  " at entry " + std::to_string(i));
    }
  }
  return u;
}

// Like array_data, for arrays of at least `size` entries (outputs that may be larger than one call needs).
template <class T>
T* array_at_least(nanobind::handle h, int type_num, int64_t size, const char* what, bool read_only = false) {
  PyArrayObject* a = checked_array(h, type_num, -1, what, read_only);
  if (PyArray_SIZE(a) < size) {
    throw std::invalid_argument(std::string(what) + ": expected at least " + std::to_string(size) + " entries");
  }
  return static_cast<T*>(PyArray_DATA(a));
}

// Dimension `i` of a numpy array (ValueError if `array` is not one, or has fewer dimensions).
inline int64_t array_dim(nanobind::handle array, int i) {
  if (!PyArray_Check(array.ptr()) || PyArray_NDIM(reinterpret_cast<PyArrayObject*>(array.ptr())) <= i) {
    throw std::invalid_argument("expected a numpy array of more than " + std::to_string(i) + " dimensions");
  }
  return PyArray_DIM(reinterpret_cast<PyArrayObject*>(array.ptr()), i);
}

// Whether `leaf` is a C-contiguous array of exactly the dtype `descr` (byte order and item size included) shaped
// [*lead, *shape]: its bytes can be copied as rows.
inline bool has_layout(PyObject* leaf, PyArray_Descr* descr, std::initializer_list<int64_t> lead,
                       const std::vector<int64_t>& shape) {
  if (!PyArray_Check(leaf)) return false;
  auto* a = reinterpret_cast<PyArrayObject*>(leaf);
  if (!PyArray_IS_C_CONTIGUOUS(a) || PyArray_NDIM(a) != static_cast<int>(lead.size() + shape.size()) ||
      !(PyArray_DESCR(a) == descr || PyArray_EquivTypes(PyArray_DESCR(a), descr))) {
    return false;
  }
  int d = 0;
  for (int64_t n : lead) {
    if (PyArray_DIM(a, d++) != n) return false;
  }
  for (int64_t n : shape) {
    if (PyArray_DIM(a, d++) != n) return false;
  }
  return true;
}

// has_layout for one row of each of `rows` lanes or envs, [rows, *shape]; with `unbatched`, one row may also
// come without that axis.
inline bool has_rows_layout(PyObject* leaf, PyArray_Descr* descr, int64_t rows, const std::vector<int64_t>& shape,
                            bool unbatched) {
  return has_layout(leaf, descr, {rows}, shape) || (unbatched && rows == 1 && has_layout(leaf, descr, {}, shape));
}

// A 1-D C-contiguous bool array of `n` flags handed in with a call (one per lane or env), or nullptr.
inline const bool* one_flag_each(PyObject* o, int64_t n) {
  if (!PyArray_Check(o)) return nullptr;
  auto* a = reinterpret_cast<PyArrayObject*>(o);
  if (PyArray_TYPE(a) != NPY_BOOL || PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != n || !PyArray_IS_C_CONTIGUOUS(a)) {
    return nullptr;
  }
  return static_cast<const bool*>(PyArray_DATA(a));
}

inline bool is_ndarray(PyObject* o) { return PyArray_Check(o); }

// A numpy array the core hands back (so named in the module's stubs).
class NdArray : public nanobind::object {
 public:
  NB_OBJECT_DEFAULT(NdArray, object, "numpy.ndarray", is_ndarray)
};

// A new, uninitialised numpy array of `type_num` and `shape`, owned by Python.
inline NdArray new_numpy(std::initializer_list<npy_intp> shape, int type_num) {
  std::vector<npy_intp> dims(shape);
  PyObject* a = PyArray_SimpleNew(static_cast<int>(dims.size()), dims.data(), type_num);
  if (a == nullptr) throw nanobind::python_error();
  return nanobind::steal<NdArray>(a);
}

// The data of an array made by new_numpy.
template <class T>
T* numpy_data(const nanobind::object& array) {
  return static_cast<T*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(array.ptr())));
}

// The first m entries of a 1-D array (a view).
inline NdArray first_entries(const nanobind::object& array, int64_t m) {
  PyObject* v = PySequence_GetSlice(array.ptr(), 0, static_cast<Py_ssize_t>(m));
  if (v == nullptr) throw nanobind::python_error();
  return nanobind::steal<NdArray>(v);
}

// The number of entries of a numpy array (ValueError if `array` is not one).
inline int64_t array_size(nanobind::handle array) {
  if (!PyArray_Check(array.ptr())) throw std::invalid_argument("expected a numpy array");
  return PyArray_SIZE(reinterpret_cast<PyArrayObject*>(array.ptr()));
}

// x mod capacity, for any x.
inline int64_t ring_pos(int64_t x, int64_t capacity) {
  const int64_t r = x % capacity;
  return r < 0 ? r + capacity : r;
}

}  // namespace rlflow
