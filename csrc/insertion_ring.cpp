#include "insertion_ring.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "slots.h"

namespace rlflow {

InsertionRing::InsertionRing(int64_t capacity) {
  check_capacity(capacity);
  // Written in full now (not committed lazily): pushes go round the ring once per two capacities of inserts.
  ring_slot_.assign(static_cast<std::size_t>(power_of_two_at_least(2 * capacity)), 0);
  ring_seq_.assign(ring_slot_.size(), 0);
  seq_of_.assign(static_cast<std::size_t>(capacity), -1);
}

void InsertionRing::trim_head() {
  while (tail_ > head_ && !live(head_)) ++head_;
}

void InsertionRing::trim_tail() {
  while (tail_ > head_ && !live(tail_ - 1)) --tail_;
}

// Drops dead entries, keeping the live ones in order from position 0 (copied out first: in a wrapped ring,
// position 0 may hold an entry not yet read).
void InsertionRing::compact() {
  std::vector<int64_t> slots;
  std::vector<int64_t> seqs;
  for (int64_t q = head_; q < tail_; ++q) {
    if (live(q)) {
      slots.push_back(ring_slot_[at(q)]);
      seqs.push_back(ring_seq_[at(q)]);
    }
  }
  std::copy(slots.begin(), slots.end(), ring_slot_.begin());
  std::copy(seqs.begin(), seqs.end(), ring_seq_.begin());
  head_ = 0;
  tail_ = static_cast<int64_t>(slots.size());
}

void InsertionRing::push(const int64_t* slots, const int64_t* seqs, int64_t n) {
  check_slots(slots, n, capacity(), "selector", "slots");
  if (tail_ - head_ + n > ring_size()) {
    trim_head();
    if (tail_ - head_ + n > ring_size()) compact();  // leaves at most capacity entries, all live
    if (tail_ - head_ + n > ring_size()) {
      throw std::length_error("pushing " + std::to_string(n) + " items after the " + std::to_string(tail_ - head_) +
                              " held would hold more than the selector's " + std::to_string(capacity()) + " slots");
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    ring_slot_[at(tail_ + j)] = slots[j];
    ring_seq_[at(tail_ + j)] = seqs[j];
    seq_of_[slots[j]] = seqs[j];
  }
  tail_ += n;
}

void InsertionRing::remove(const int64_t* slots, int64_t n) {
  check_slots(slots, n, capacity(), "selector", "slots");
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_write(&seq_of_[slots[j + kAhead]]);  // cells far apart
    seq_of_[slots[j]] = -1;
  }
  trim_head();
  trim_tail();
}

int64_t InsertionRing::first(int64_t n, bool newest, int64_t* out) {
  int64_t m = 0;
  if (newest) {
    trim_tail();
    for (int64_t q = tail_ - 1; m < n && q >= head_; --q) {
      if (live(q)) out[m++] = ring_slot_[at(q)];
    }
  } else {
    trim_head();
    for (int64_t q = head_; m < n && q < tail_; ++q) {
      if (live(q)) out[m++] = ring_slot_[at(q)];
    }
  }
  return m;
}

void InsertionRing::clear() {
  std::fill(seq_of_.begin(), seq_of_.end(), -1);
  head_ = tail_ = 0;
}

}  // namespace rlflow
