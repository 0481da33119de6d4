// AlignedArray<T>: a fixed-size array of T starting on a 64-byte cache line, filled with one value.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>

namespace rlflow {

template <class T>
class AlignedArray {
 public:
  static constexpr std::size_t kAlign = 64;

  AlignedArray() = default;
  AlignedArray(std::size_t size, T fill)
      : size_(size), data_(static_cast<T*>(::operator new[](std::max<std::size_t>(size, 1) * sizeof(T),
                                                            std::align_val_t{kAlign}))) {
    std::fill(data_.get(), data_.get() + size_, fill);
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{kAlign}); }
  };
  std::size_t size_ = 0;
  std::unique_ptr<T[], Free> data_;
};

}  // namespace rlflow
