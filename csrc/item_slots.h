// A Table's item slots (rlflow.replay.items.Items documents them): the records, priorities, a free-slot stack
// whose top is at num_free - 1, and the index from each store row to the slot of an item starting there (-1:
// none; further items starting at a taken row are in Python's overflow lists). The arrays are Python's; this
// object holds them and changes them in place.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "item_records.h"

namespace rlflow {

// Items to place: their windows, valid lengths and priorities (n each).
struct NewItems {
  const int64_t* lanes;
  const int64_t* starts;
  const int64_t* lengths;
  const int64_t* valid;
  const double* priorities;
  int64_t n;
};

// Where place() put each new item: its slot, key, and whether its start row's index cell was taken already.
struct Placed {
  int64_t* slots;
  int64_t* keys;
  bool* clash;
};

class ItemSlots {
 public:
  // meta: [slots, width >= 6] int64; priority: [slots] float64; row_slot: [lanes, capacity] int64; free:
  // [slots] int64.
  ItemSlots(nanobind::handle meta, nanobind::handle priority, nanobind::handle row_slot, nanobind::handle free);

  int64_t slots() const { return records_.slots; }
  int64_t lanes() const { return lanes_; }
  const Records& records() const { return records_; }

  // Place items in the top free slots (n <= num_free); index each by its start row unless that cell is taken.
  // Returns how many clashed.
  int64_t place(int64_t num_free, int64_t next_seq, const NewItems& in, const Placed& out);
  // Free live, distinct slots onto the free stack from num_free; clear their index cells. indirect[i]: the item
  // was not in its index cell. Returns the times sampled they had, summed.
  int64_t remove(int64_t num_free, const int64_t* slots, int64_t n, bool* indirect);
  // The slots indexed at rows lo .. hi - 1 of `lane` (empty cells skipped) into `out`; how many.
  int64_t indexed(int64_t lane, int64_t lo, int64_t hi, int64_t* out) const;
  // Store the priorities of live keys, in order (a repeated key keeps its last value); the live keys' slots
  // and values go to the outputs in order. Returns how many.
  int64_t set_priorities(const int64_t* keys, const double* values, int64_t n, int64_t* slots_out,
                         double* values_out);

 private:
  nanobind::object owned_[4];
  Records records_;
  double* priority_ = nullptr;
  int64_t* row_slot_ = nullptr;
  int64_t* free_ = nullptr;
  int64_t lanes_ = 0, capacity_ = 0;

  int64_t* cell(int64_t lane, int64_t row) const;
};

}  // namespace rlflow
