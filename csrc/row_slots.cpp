#include "row_slots.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "arrays.h"

namespace rlflow {

namespace nb = nanobind;

namespace {
constexpr int64_t kBlock = 256;  // draws whose rows are requested together
}  // namespace

RowSlots::RowSlots(nb::handle meta, int64_t lanes) : lanes_(lanes) {
  records_.slots = array_dim(meta, 0);
  records_.width = array_dim(meta, 1);
  if (lanes < 1 || records_.slots < lanes || records_.slots % lanes != 0 || records_.width < RECORD_COLUMNS) {
    throw std::invalid_argument("RowSlots: expected meta [capacity * lanes, >= 6] for " + std::to_string(lanes) +
                                " lanes");
  }
  records_.rows = array_data<int64_t>(meta, NPY_INT64, records_.slots * records_.width, "meta");
  capacity_ = records_.slots / lanes;
  owned_ = nb::borrow(meta);
}

PlaceResult RowSlots::place(const StoreRings& rings, bool cross_episodes, int64_t next_seq, const int64_t* lanes,
                            const int64_t* starts, const int64_t* lengths, int64_t n, int64_t* valid, int64_t* slots,
                            int64_t* keys) {
  const int64_t bad = rings.check_windows(lanes, starts, lengths, n, cross_episodes, valid);
  if (bad >= 0) return {bad, PlaceFault::Window};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = ring_pos(starts[i], capacity_) * lanes_ + lanes[i];
    const int64_t k = records_.at(s)[KEY];
    if (k != -1) {
      for (int64_t j = 0; j < i; ++j) records_.at(slots[j])[KEY] = -1;  // undo the marks: nothing changed
      return {i, k >= 0 ? PlaceFault::Taken : PlaceFault::Twice};
    }
    records_.at(s)[KEY] = -2;  // taken by this call
    slots[i] = s;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_write(records_.at(slots[i + kAhead]));
    const int64_t key = item_key(next_seq + i, records_.slots, slots[i]);
    records_.set(slots[i], key, lanes[i], starts[i], lengths[i], valid[i]);
    keys[i] = key;
  }
  return {};
}

int64_t RowSlots::evict(int64_t lane, int64_t lo, int64_t hi, int64_t* times) {
  int64_t removed = 0;
  for (int64_t r = lo; r < lo + std::min(hi - lo, capacity_); ++r) {
    int64_t* rec = records_.at(ring_pos(r, capacity_) * lanes_ + lane);
    if (rec[KEY] >= 0) {
      ++removed;
      *times += rec[TIMES];
      rec[KEY] = -1;
    }
  }
  return removed;
}

int64_t RowSlots::take(int64_t s, int64_t j, int64_t size, int64_t limit, Draws& d) {
  int64_t* rec = records_.at(s);
  rec[TIMES] += 1;
  std::copy(rec, rec + records_.width, d.rows + j * records_.width);
  d.slots[j] = s;
  d.probabilities[j] = 1.0 / static_cast<double>(size);
  if (limit > 0 && rec[TIMES] >= limit) {
    rec[KEY] = -1;
    return rec[TIMES];
  }
  return -1;
}

int64_t RowSlots::draw_stored(const StoreRings& rings, const double* uniforms, int64_t m, int64_t j, int64_t size,
                              int64_t limit, Draws& d) {
  std::vector<int64_t> cum(lanes_ + 1, 0);
  bool even = true;
  for (int64_t lane = 0; lane < lanes_; ++lane) {
    const int64_t stored = std::min(rings.written(lane), capacity_);
    cum[lane + 1] = cum[lane] + stored;
    even = even && stored == cum[1];
  }
  const int64_t total = cum[lanes_];
  const bool full = total == records_.slots;
  int64_t cand[kBlock];
  int64_t i = 0;
  while (i < m && j < d.n && size > 0 && total > 0) {
    const int64_t k = std::min(kBlock, m - i);
    for (int64_t q = 0; q < k; ++q) {  // the block's rows first, their lines requested: the checks then hit cache
      const int64_t x = std::min(static_cast<int64_t>(uniforms[i + q] * static_cast<double>(total)), total - 1);
      if (full) {  // every slot holds a stored row: x itself is a one-to-one, uniform map of rows to slots
        cand[q] = x;
      } else {
        int64_t lane;
        if (even) {
          lane = x / cum[1];
        } else {
          lane = static_cast<int64_t>(std::upper_bound(cum.begin(), cum.end(), x) - cum.begin()) - 1;
        }
        const int64_t row = std::max<int64_t>(rings.written(lane) - capacity_, 0) + x - cum[lane];
        cand[q] = ring_pos(row, capacity_) * lanes_ + lane;
      }
      prefetch(records_.at(cand[q]));
    }
    for (int64_t q = 0; q < k && j < d.n && size > 0; ++q) {  // in order: a draw sees earlier draws' retirements
      const int64_t s = cand[q];
      if (records_.at(s)[KEY] < 0) continue;
      const int64_t t = take(s, j, size, limit, d);
      if (t >= 0) {
        --size;
        ++d.retired;
        d.retired_times += t;
      }
      ++j;
    }
    i += k;
  }
  d.size = size;
  return j;
}

int64_t RowSlots::draw_live(const double* uniforms, int64_t* live, int64_t size, int64_t limit, Draws& d) {
  int64_t j = 0;
  for (; j < d.n && size > 0; ++j) {
    const int64_t k = std::min(static_cast<int64_t>(uniforms[j] * static_cast<double>(size)), size - 1);
    const int64_t t = take(live[k], j, size, limit, d);
    if (t >= 0) {
      --size;
      live[k] = live[size];
      ++d.retired;
      d.retired_times += t;
    }
  }
  d.size = size;
  return j;
}

}  // namespace rlflow
