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

// Whether any of n floats (T: float or double, read as their bits U) is NaN or infinite: all exponent bits set.
// Branch-free over the values, so that the compiler vectorises it.
template <class T, class U>
bool not_finite(const uint8_t* values, int64_t n) {
  static_assert(sizeof(T) == sizeof(U), "bits of the float's size");
  constexpr U exponent = sizeof(T) == 4 ? static_cast<U>(0x7F800000u) : static_cast<U>(0x7FF0000000000000ull);
  U bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    U bits;
    std::memcpy(&bits, values + i * sizeof(T), sizeof(T));
    bad |= static_cast<U>((bits & exponent) == exponent);
  }
  return bad != 0;
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
    return itemsize == 8 ? detail::not_finite<double, uint64_t>(values, n) : detail::not_finite<float, uint32_t>(values, n);
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
