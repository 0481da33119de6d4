// SumTree: sums and minimum over `capacity` non-negative leaves, with batched updates and searches.
//
// The tree is kBranch-ary (8 children a node): a million leaves need 8 levels instead of 21, and the 8
// float64 child sums of a node fill one 64-byte cache line, so a descent or an update touches about one
// memory line per level. Levels are stored top to bottom in one flat array; level d starts at offsets[d];
// the children of node j of level d are nodes j * kBranch .. j * kBranch + kBranch - 1 of level d + 1; the
// last level holds the leaves. Every level starts on a multiple of kBranch and both arrays start on a cache
// line, so each node's children share one line.
//
// Every internal node is recomputed as the sum (min) of its children in a fixed order, never by adding a
// delta: values do not drift however many updates are made, and the tree is a pure function of its leaves
// (a rebuild gives it bit for bit). The min tree covers internal nodes only and counts positive leaves
// only, so its root is the smallest positive leaf (inf when there is none). A batch of updates is applied
// in order (a repeated leaf keeps its last value).
//
// Every call takes the tree's mutex, so threads that share a tree (with Python's GIL released) take turns.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "aligned.h"

namespace rlflow {

class SumTree {
 public:
  static constexpr int64_t kBranch = 8;

  // A tree of `capacity` >= 1 leaves, all zero; throws std::invalid_argument otherwise.
  explicit SumTree(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  double total() const { return sums_[0]; }
  // The smallest positive leaf, inf when none is positive.
  double min() const { return mins_[0]; }

  // The layout, for reading: offsets (depth + 1 entries), sums (offsets.back()), mins (internal nodes).
  int64_t depth() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const double* sums() const { return sums_.data(); }
  int64_t sums_size() const { return offsets_.back(); }
  const double* mins() const { return mins_.data(); }
  int64_t mins_size() const { return offsets_[offsets_.size() - 2]; }
  const double* leaves() const { return sums_.data() + leaf0(); }

  // Sets leaves slots[i] to values[i] ** exponent (zero stays zero, also for exponent 0; with exponent 1
  // the value as given), in order, then recomputes their ancestors. Every slot is checked before any leaf
  // changes: throws std::out_of_range naming the first slot outside [0, capacity).
  void update(const int64_t* slots, const double* values, int64_t n, double exponent);

  // Replaces every leaf by values[0 .. capacity) and rebuilds the tree.
  void set_leaves(const double* values);

  // For each of n targets: the leaf where the running sum passes it (never a zero leaf while total > 0).
  void find(const double* targets, int64_t n, int64_t* leaves_out) const;

  // n leaves drawn by mass from uniforms in [0, 1): target j is (j + u_j) / n of the total when stratified,
  // else u_j of it. Writes each leaf, its probability m / total and its weight (min / m) ** beta.
  void sample(const double* uniforms, int64_t n, bool stratified, double beta, int64_t* leaves_out,
              double* probabilities, float* weights) const;

  // Probabilities and weights of draws leaves[0 .. n) made one after another, where a draw with retires[j]
  // set takes its leaf out of the draws after it. The tree is left bit for bit as it was. Leaves are
  // checked as in update.
  void sequential(const int64_t* leaves, const bool* retires, int64_t n, double beta, double* probabilities,
                  float* weights);

  // sum(limit - times[i]) over the leaves i of positive mass (times has capacity entries), counted until it
  // reaches `enough`.
  int64_t draws_left(const int64_t* times, int64_t limit, int64_t enough) const;

 private:
  int64_t leaf0() const { return offsets_[offsets_.size() - 2]; }
  void update_locked(const int64_t* slots, const double* values, int64_t n, double exponent);
  void find_locked(const double* targets, int64_t n, int64_t* leaves_out) const;
  void recompute(int64_t d, int64_t j);

  int64_t capacity_;
  std::vector<int64_t> offsets_;
  AlignedArray<double> sums_;
  AlignedArray<double> mins_;
  std::vector<int64_t> scratch_;  // the nodes of an update's batch, level by level
  mutable std::mutex mutex_;
};

}  // namespace rlflow
