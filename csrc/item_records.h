// A table's item records (rlflow.replay.items documents them): one row of int64 per slot, a cache line of 8,
// whose first columns are the item's key, window, valid length and times sampled; the rest hold small item
// fields. Shared by both kinds of table (item_slots.h, row_slots.h) and the selectors' draws.
#pragma once

#include <cstdint>

#include "slots.h"

namespace rlflow {

enum MetaColumn : int64_t { KEY = 0, LANE = 1, START = 2, LENGTH = 3, VALID = 4, TIMES = 5, RECORD_COLUMNS = 6 };

// The records of `slots` slots, `width` int64 columns each (at least RECORD_COLUMNS).
struct Records {
  int64_t* rows = nullptr;
  int64_t slots = 0;
  int64_t width = 0;

  int64_t* at(int64_t slot) const { return rows + slot * width; }
  // Slot s's record of a new item: its key, window and valid length, never sampled.
  void set(int64_t s, int64_t key, int64_t lane, int64_t start, int64_t length, int64_t valid) const {
    int64_t* r = at(s);
    r[KEY] = key;
    r[LANE] = lane;
    r[START] = start;
    r[LENGTH] = length;
    r[VALID] = valid;
    r[TIMES] = 0;
  }
};

// The key of the item placed seq-th in `slot` of `slots`: a slot's next item gets another key, and
// key % slots is its slot.
inline int64_t item_key(int64_t seq, int64_t slots, int64_t slot) { return seq * slots + slot; }

// Count one sample of each drawn slot, in order; out[j] gets a copy of draw j's record as of that draw.
inline void draw_rows(const Records& r, const int64_t* slots, int64_t n, int64_t* out) {
  for (int64_t j = 0; j < n; ++j) prefetch_write(r.at(slots[j]));
  for (int64_t j = 0; j < n; ++j) {
    int64_t* row = r.at(slots[j]);
    row[TIMES] += 1;
    for (int64_t c = 0; c < r.width; ++c) out[j * r.width + c] = row[c];
  }
}

}  // namespace rlflow
