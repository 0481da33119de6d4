#include "item_slots.h"

#include <algorithm>
#include <stdexcept>

#include "arrays.h"

namespace rlflow {

namespace nb = nanobind;

ItemSlots::ItemSlots(nb::handle meta, nb::handle priority, nb::handle row_slot, nb::handle free) {
  records_.slots = array_dim(meta, 0);
  records_.width = array_dim(meta, 1);
  if (records_.slots < 1 || records_.width < RECORD_COLUMNS) {
    throw std::invalid_argument("ItemSlots: expected meta of at least one slot and 6 columns");
  }
  records_.rows = array_data<int64_t>(meta, NPY_INT64, records_.slots * records_.width, "meta");
  priority_ = array_data<double>(priority, NPY_FLOAT64, records_.slots, "priority");
  lanes_ = array_dim(row_slot, 0);
  capacity_ = array_dim(row_slot, 1);
  if (lanes_ < 1 || capacity_ < 1) throw std::invalid_argument("ItemSlots: expected row_slot [lanes, capacity]");
  row_slot_ = array_data<int64_t>(row_slot, NPY_INT64, lanes_ * capacity_, "row_slot");
  free_ = array_data<int64_t>(free, NPY_INT64, records_.slots, "free");
  nb::handle arrays[4] = {meta, priority, row_slot, free};
  for (int i = 0; i < 4; ++i) owned_[i] = nb::borrow(arrays[i]);
}

int64_t* ItemSlots::cell(int64_t lane, int64_t row) const { return row_slot_ + lane * capacity_ + ring_pos(row, capacity_); }

int64_t ItemSlots::place(int64_t num_free, int64_t next_seq, const NewItems& in, const Placed& out) {
  int64_t clashes = 0;
  for (int64_t i = 0; i < in.n; ++i) {
    if (i + kAhead < in.n) {
      const int64_t j = i + kAhead;
      prefetch_write(records_.at(free_[num_free - 1 - j]));
      prefetch_write(cell(in.lanes[j], in.starts[j]));
    }
    const int64_t s = free_[num_free - 1 - i];
    const int64_t key = item_key(next_seq + i, records_.slots, s);
    out.slots[i] = s;
    out.keys[i] = key;
    records_.set(s, key, in.lanes[i], in.starts[i], in.lengths[i], in.valid[i]);
    priority_[s] = in.priorities[i];
    int64_t* c = cell(in.lanes[i], in.starts[i]);
    out.clash[i] = *c >= 0;
    if (*c < 0) {
      *c = s;
    } else {
      ++clashes;
    }
  }
  return clashes;
}

int64_t ItemSlots::remove(int64_t num_free, const int64_t* slots, int64_t n, bool* indirect) {
  int64_t total = 0;
  for (int64_t i = 0; i < std::min(kAhead, n); ++i) prefetch_write(records_.at(slots[i]));
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_write(records_.at(slots[i + kAhead]));
    const int64_t s = slots[i];
    int64_t* r = records_.at(s);
    int64_t* c = cell(r[LANE], r[START]);
    indirect[i] = *c != s;
    if (*c == s) *c = -1;
    total += r[TIMES];
    r[KEY] = -1;
    free_[num_free + i] = s;
  }
  return total;
}

int64_t ItemSlots::indexed(int64_t lane, int64_t lo, int64_t hi, int64_t* out) const {
  int64_t m = 0;
  for (int64_t row = lo; row < hi; ++row) {
    const int64_t s = *cell(lane, row);
    if (s >= 0) out[m++] = s;
  }
  return m;
}

int64_t ItemSlots::set_priorities(const int64_t* keys, const double* values, int64_t n, int64_t* slots_out,
                                  double* values_out) {
  const int64_t total = records_.slots;
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] >= 0) {
      prefetch(records_.at(keys[i] % total));
      prefetch(priority_ + keys[i] % total);
    }
  }
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    if (k < 0) continue;
    const int64_t s = k % total;
    if (records_.at(s)[KEY] != k) continue;
    priority_[s] = values[i];
    slots_out[m] = s;
    values_out[m] = values[i];
    ++m;
  }
  return m;
}

}  // namespace rlflow
