// The value checks a column's values get where they enter (finite floats, integers within bounds), on values
// read as raw native bytes: the block filler checks each step's row with them, Python's spec validation whole
// arrays (rlflow.specs documents the semantics).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace rlflow {

// How a column's values are checked: not at all, finite (floats), or within [low, high] (integers).
enum class ValueCheck : int { None = 0, Finite = 1, Bounds = 2 };

namespace detail {

template <class T>
bool not_finite(const uint8_t* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, values + i * sizeof(T), sizeof(T));
    if (!std::isfinite(v)) return true;
  }
  return false;
}

template <class T>
bool out_of_bounds(const uint8_t* values, int64_t n, double low, double high) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, values + i * sizeof(T), sizeof(T));
    const double x = static_cast<double>(v);
    if (x < low || x > high) return true;
  }
  return false;
}

}  // namespace detail

// Whether a check of kind (numpy's dtype kind: 'f', 'i', 'u') and itemsize can be made on raw values: finite
// on float32/float64, bounds on 1-8 byte integers.
inline bool checkable(ValueCheck check, char kind, int64_t itemsize) {
  const bool sized = itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8;
  switch (check) {
    case ValueCheck::None: return true;
    case ValueCheck::Finite: return kind == 'f' && (itemsize == 4 || itemsize == 8);
    case ValueCheck::Bounds: return (kind == 'i' || kind == 'u') && sized;
  }
  return false;
}

// Whether any of the n values at `values` (native bytes of a checkable kind and itemsize) fails `check`;
// integers are compared with the bounds as float64 (exact below 2**53).
inline bool values_fail(const uint8_t* values, int64_t n, char kind, int64_t itemsize, ValueCheck check,
                        double low, double high) {
  if (check == ValueCheck::Finite) {
    return itemsize == 8 ? detail::not_finite<double>(values, n) : detail::not_finite<float>(values, n);
  }
  if (check == ValueCheck::Bounds) {
    const bool s = kind == 'i';
    switch (itemsize) {
      case 1: return s ? detail::out_of_bounds<int8_t>(values, n, low, high)
                       : detail::out_of_bounds<uint8_t>(values, n, low, high);
      case 2: return s ? detail::out_of_bounds<int16_t>(values, n, low, high)
                       : detail::out_of_bounds<uint16_t>(values, n, low, high);
      case 4: return s ? detail::out_of_bounds<int32_t>(values, n, low, high)
                       : detail::out_of_bounds<uint32_t>(values, n, low, high);
      default: return s ? detail::out_of_bounds<int64_t>(values, n, low, high)
                        : detail::out_of_bounds<uint64_t>(values, n, low, high);
    }
  }
  return false;
}

}  // namespace rlflow
