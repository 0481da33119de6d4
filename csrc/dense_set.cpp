#include "dense_set.h"

#include <algorithm>

#include "slots.h"

namespace rlflow {

int64_t DenseSet::insert(const int64_t* slots, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) {  // the slots' cells are far apart: requested ahead of use
      prefetch_write(where + slots[j + kAhead]);
      prefetch_write(live + slots[j + kAhead]);
    }
    const int64_t s = slots[j];
    if (where[s] >= 0) continue;
    items[count] = s;
    where[s] = count;
    live[s] = true;
    ++count;
  }
  return count;
}

int64_t DenseSet::remove(const int64_t* slots, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    // Request each slot's position two strides ahead, and the hole it points to one stride ahead (a hint: a
    // position moved since is only a wasted request).
    if (j + 2 * kAhead < n) prefetch_write(where + slots[j + 2 * kAhead]);
    if (j + kAhead < n) prefetch_write(items + std::max<int64_t>(where[slots[j + kAhead]], 0));
    const int64_t s = slots[j];
    const int64_t p = where[s];
    if (p < 0) continue;
    --count;
    const int64_t last = items[count];
    items[p] = last;
    where[last] = p;
    where[s] = -1;
    live[s] = false;
  }
  return count;
}

void DenseSet::pick(const double* uniforms, int64_t n, int64_t* out) const {
  const double c = static_cast<double>(capacity), k = static_cast<double>(count);
  for (int64_t j = 0; j < n; ++j) {
    int64_t s = std::min(static_cast<int64_t>(uniforms[j] * c), capacity - 1);
    if (!live[s]) s = items[std::min(static_cast<int64_t>(uniforms[n + j] * k), count - 1)];
    out[j] = s;
  }
}

}  // namespace rlflow
