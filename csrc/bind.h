// Helpers shared by the binding files, and one bind_* function per concept.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlflow {

namespace nb = nanobind;

// A 1-D array handed in by Python, converted to T and made contiguous if it is not already.
template <class T>
using In1 = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A 1-D numpy array handed back to Python.
template <class T>
using Out1 = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A new numpy array of n elements, owned by Python once returned.
template <class T>
Out1<T> new_array(std::size_t n) {
  auto data = std::make_unique<T[]>(n == 0 ? 1 : n);
  nb::capsule owner(data.get(), [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return Out1<T>(data.release(), {n}, owner);
}

// A read-only numpy view of n values of an object's memory, with no owner of its own: returned from a
// property (whose reference_internal policy then keeps the object alive as long as the view).
template <class T>
nb::ndarray<nb::numpy, const T, nb::ndim<1>> view(const T* data, int64_t n) {
  return nb::ndarray<nb::numpy, const T, nb::ndim<1>>(data, {static_cast<std::size_t>(n)}, nb::handle());
}

// Throws ValueError unless `array` has `expected` entries.
template <class A>
void check_size(const A& array, std::size_t expected, const char* name) {
  if (array.shape(0) != expected) {
    throw std::invalid_argument(std::string(name) + " must have " + std::to_string(expected) + " entries, got " +
                                std::to_string(array.shape(0)));
  }
}

void bind_block_writer(nb::module_& m);
void bind_call_classifier(nb::module_& m);
void bind_gather(nb::module_& m);
void bind_items(nb::module_& m);
void bind_selection(nb::module_& m);
void bind_shuffle(nb::module_& m);
void bind_step_block(nb::module_& m);
void bind_store_rings(nb::module_& m);
void bind_sum_tree(nb::module_& m);

}  // namespace rlflow
