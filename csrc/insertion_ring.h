// InsertionRing: the FIFO and LIFO selectors' items in insertion order.
//
// Entries (slot, seq) sit in a ring of a power-of-two size at least twice the capacity, between absolute
// positions head and tail; an entry is live while seq_of[slot] == seq. Removing an item only marks its
// slot (O(1)), then drops dead entries at both ends while they are cache-hot; a push that finds no room
// drops the dead entries at the head, and compacts the ring when that is not enough (amortised O(1): the
// ring is at least twice the capacity). Batches are applied in order.
#pragma once

#include <cstdint>
#include <vector>

namespace rlflow {

class InsertionRing {
 public:
  // A ring for slots 0 .. capacity - 1 (capacity >= 1), holding no item; throws std::invalid_argument.
  explicit InsertionRing(int64_t capacity);

  int64_t capacity() const { return static_cast<int64_t>(seq_of_.size()); }
  // Each slot's insertion number while it is held, -1 otherwise.
  const int64_t* seq_of() const { return seq_of_.data(); }

  // Appends items slots[j] with insertion numbers seqs[j]. Slots are checked first (std::out_of_range);
  // std::length_error when the entries would not fit the ring even once compacted (more items than slots).
  // The items held do not change on an error.
  void push(const int64_t* slots, const int64_t* seqs, int64_t n);
  // Marks held items as gone (slots checked first, std::out_of_range).
  void remove(const int64_t* slots, int64_t n);
  // Writes the first n live slots (oldest first, or newest first) to out; returns how many there were.
  int64_t first(int64_t n, bool newest, int64_t* out);
  // Holds no item.
  void clear();

 private:
  int64_t at(int64_t position) const { return position & (ring_size() - 1); }
  int64_t ring_size() const { return static_cast<int64_t>(ring_slot_.size()); }
  bool live(int64_t position) const { return seq_of_[ring_slot_[at(position)]] == ring_seq_[at(position)]; }
  void trim_head();
  void trim_tail();
  void compact();

  std::vector<int64_t> ring_slot_;
  std::vector<int64_t> ring_seq_;
  std::vector<int64_t> seq_of_;
  int64_t head_ = 0;
  int64_t tail_ = 0;
};

}  // namespace rlflow
