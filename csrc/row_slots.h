// A RowTable's item slots (rlflow.replay.RowTable documents them): the item starting at row r of lane l lives
// in slot (r % capacity) * lanes + l, so a record needs no index; an empty slot has key -1. The records array
// is Python's; this object holds it and changes it in place.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "item_records.h"
#include "store_rings.h"

namespace rlflow {

// Why place() refused an item: a window not stored, its slot taken by a live item, or a start row given twice.
enum class PlaceFault : int { None = 0, Window = 1, Taken = 2, Twice = 3 };

struct PlaceResult {
  int64_t item = -1;  // the first item refused, or -1
  PlaceFault fault = PlaceFault::None;
};

// Uniform draws into: the drawn slots, copies of their records, their probabilities; and after the draws, the
// live items left, how many the draws retired (max_times_sampled) and the times sampled those had.
struct Draws {
  int64_t* slots;
  int64_t* rows;
  double* probabilities;
  int64_t n;  // draws wanted
  int64_t size = 0, retired = 0, retired_times = 0;
};

class RowSlots {
 public:
  // meta: [capacity * lanes, width >= 6] int64.
  RowSlots(nanobind::handle meta, int64_t lanes);

  int64_t lanes() const { return lanes_; }
  int64_t capacity() const { return capacity_; }
  int64_t width() const { return records_.width; }

  // Check the windows against the store's rings (valid[i] gets each window's valid length), then place each
  // item in its start row's slot, keyed (next_seq + i) * slots + slot. A refusal changes nothing.
  PlaceResult place(const StoreRings& rings, bool cross_episodes, int64_t next_seq, const int64_t* lanes,
                    const int64_t* starts, const int64_t* lengths, int64_t n, int64_t* valid, int64_t* slots,
                    int64_t* keys);
  // Empty the slots of rows lo .. hi - 1 of `lane`; how many held an item, and their times sampled (added).
  int64_t evict(int64_t lane, int64_t lo, int64_t hi, int64_t* times);
  // Draws j, j + 1, ... until d.n draws are made or the uniforms run out; returns the next draw's index. Each
  // uniform picks one of the stored rows (rings), every lane's equally likely, and is a draw when an item
  // starts there: each draw is uniform over the `size` live items. limit > 0 retires an item at that many
  // samples. d.size and the retired counts are set.
  int64_t draw_stored(const StoreRings& rings, const double* uniforms, int64_t m, int64_t j, int64_t size,
                      int64_t limit, Draws& d);
  // d.n draws, each uniform over the live slots `live` (size of them; one uniform each); a retired item leaves
  // `live` at once. Returns how many draws were made (fewer once no item is left).
  int64_t draw_live(const double* uniforms, int64_t* live, int64_t size, int64_t limit, Draws& d);

 private:
  nanobind::object owned_;
  Records records_;
  int64_t lanes_ = 0, capacity_ = 0;

  // Count draw j of slot s (one of size live items); retire it at limit samples. Its times sampled when
  // retired, else -1.
  int64_t take(int64_t s, int64_t j, int64_t size, int64_t limit, Draws& d);
};

}  // namespace rlflow
