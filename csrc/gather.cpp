#include "gather.h"

#include <algorithm>
#include <cstring>

#include "arrays.h"
#include "item_records.h"

namespace rlflow {

int64_t longest_window(const int64_t* records, int64_t b_count, int64_t width) {
  int64_t length = 0;
  for (int64_t b = 0; b < b_count; ++b) length = std::max(length, records[b * width + LENGTH]);
  return length;
}

bool window_index(const int64_t* records, int64_t b_count, int64_t width, int64_t length, int64_t capacity,
                  int64_t* idx, bool* mask) {
  bool full = true;
  for (int64_t b = 0; b < b_count; ++b) {
    const int64_t* r = records + b * width;
    const int64_t base = r[LANE] * capacity, start = r[START], valid = r[VALID];
    for (int64_t i = 0; i < length; ++i) {
      const bool in = i < valid;
      idx[b * length + i] = base + ring_pos(in ? start + i : start, capacity);
      mask[b * length + i] = in;
      full = full && in;
    }
  }
  return full;
}

void window_ends(const int64_t* records, int64_t b_count, int64_t width, int64_t capacity, int64_t* ends) {
  for (int64_t b = 0; b < b_count; ++b) {
    const int64_t* r = records + b * width;
    const int64_t base = r[LANE] * capacity;
    ends[b] = base + ring_pos(r[START], capacity);
    ends[b_count + b] = base + ring_pos(r[START] + r[LENGTH] - 1, capacity);
  }
}

void prefetch_rows(const std::vector<ByteColumn>& columns, const int64_t* idx, int64_t n) {
  int64_t i = 0;
  while (i < n) {
    int64_t j = i + 1;
    while (j < n && idx[j] == idx[j - 1] + 1) ++j;
    for (const ByteColumn& c : columns) {
      const int64_t lo = idx[i] * c.width, hi = (idx[j - 1] + 1) * c.width;
      for (int64_t o = lo; o < hi; o += 64) prefetch(c.data + o);
      if (hi > lo) prefetch(c.data + hi - 1);
    }
    i = j;
  }
}

void take_rows(const ByteColumn& column, const int64_t* idx, int64_t n, uint8_t* out) {
  const int64_t w = column.width;
  for (int64_t i = 0; i < n; ++i) {
    prefetch(column.data + idx[i] * w);
    if (w > 1) prefetch(column.data + idx[i] * w + w - 1);
  }
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * w, column.data + idx[i] * w, w);
}

void take_stacks(const ByteColumn& column, const int64_t* index, int64_t a, int64_t m, const int64_t* episode_steps,
                 int64_t capacity, int64_t k, bool by_column, uint8_t* out) {
  const int64_t w = column.width;
  const int64_t outer_n = by_column ? m : a, inner_n = by_column ? a : m;
  for (int64_t outer = 0; outer < outer_n; ++outer) {
    for (int64_t inner = 0; inner < inner_n; ++inner) {
      const int64_t r = by_column ? inner : outer, c = by_column ? outer : inner;
      const int64_t f = index[r * m + c];
      const int64_t pos = ring_pos(f, capacity), base = f - pos;
      const int64_t back = episode_steps[f];
      uint8_t* at = out + (r * m + c) * k * w;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = base + ring_pos(pos - std::min(k - 1 - j, back), capacity);
        std::memcpy(at + j * w, column.data + src * w, w);
      }
    }
  }
}

}  // namespace rlflow
