// TournamentTree: the MinHeap and MaxHeap selectors' items, smallest key (k1, k2) first.
//
// Stored heap-style over a power-of-two number of leaves `size`: node i has children 2i and 2i + 1, the root
// is node 1, leaf of slot s is node size + s. Every node holds the winning slot of its subtree under the
// lexicographic order of (k1[slot], k2[slot]) (smallest wins; ties by k2), or -1 for an empty subtree.
// Batches are applied in order (a repeated slot keeps its last keys).
#pragma once

#include <cstdint>
#include <vector>

namespace rlflow {

class TournamentTree {
 public:
  // A tree for slots 0 .. capacity - 1 (capacity >= 1), holding no item; throws std::invalid_argument.
  explicit TournamentTree(int64_t capacity);

  int64_t capacity() const { return static_cast<int64_t>(k1_.size()); }
  const double* k1() const { return k1_.data(); }
  const int64_t* k2() const { return k2_.data(); }
  // The number of leaves (capacity rounded up to a power of two).
  int64_t tree_size() const { return size_; }
  // Each leaf (tree_size of them): its slot while that is held, -1 otherwise.
  const int64_t* leaves() const { return win_.data() + size_; }

  // Holds slots[j] with keys (k1[j], k2[j]). Slots are checked first (std::out_of_range).
  void set(const int64_t* slots, const double* k1, const int64_t* k2, int64_t n);
  // Gives held slots[j] the first key k1[j], keeping their second key.
  void set_k1(const int64_t* slots, const double* k1, int64_t n);
  // Lets go of slots (checked first).
  void clear(const int64_t* slots, int64_t n);
  // Writes the n best held slots in order to out (fewer if fewer are held); returns how many.
  int64_t top(int64_t n, int64_t* out);
  // Replaces every leaf (tree_size entries: its slot or -1, checked), k1 and k2 (capacity entries each), and
  // rebuilds; std::invalid_argument with nothing changed when a leaf holds anything else.
  void load(const int64_t* leaves, const double* k1, const int64_t* k2);

 private:
  int64_t better(int64_t a, int64_t b) const;
  void fix(int64_t node);  // recomputes the ancestors of `node`
  void put(int64_t s, int64_t value);

  int64_t size_;
  std::vector<int64_t> win_;
  std::vector<double> k1_;
  std::vector<int64_t> k2_;
};

}  // namespace rlflow
