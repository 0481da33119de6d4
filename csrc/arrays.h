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
  if ((type_num >= 0 && PyArray_TYPE(a) != type_num) || (size >= 0 && PyArray_SIZE(a) != size)) {
    throw std::invalid_argument(std::string(what) + ": expected " + (size >= 0 ? std::to_string(size) : "any") +
                                " entries of its dtype");
  }
  return a;
}

template <class T>
T* array_data(nanobind::handle h, int type_num, int64_t size, const char* what) {
  return static_cast<T*>(PyArray_DATA(checked_array(h, type_num, size, what)));
}

// The data of an array the call only reads (array_data's checks, writeable or not).
template <class T>
const T* array_in(nanobind::handle h, int type_num, int64_t size, const char* what) {
  return static_cast<const T*>(PyArray_DATA(checked_array(h, type_num, size, what, true)));
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

// A 1-D C-contiguous bool array of `n` flags handed in with a call (one per lane or env), or nullptr.
inline const bool* one_flag_each(PyObject* o, int64_t n) {
  if (!PyArray_Check(o)) return nullptr;
  auto* a = reinterpret_cast<PyArrayObject*>(o);
  if (PyArray_TYPE(a) != NPY_BOOL || PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != n || !PyArray_IS_C_CONTIGUOUS(a)) {
    return nullptr;
  }
  return static_cast<const bool*>(PyArray_DATA(a));
}

// x mod capacity, for any x.
inline int64_t ring_pos(int64_t x, int64_t capacity) {
  const int64_t r = x % capacity;
  return r < 0 ? r + capacity : r;
}

}  // namespace rlflow
