#include "sum_tree.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "slots.h"

namespace rlflow {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

SumTree::SumTree(int64_t capacity) : capacity_(capacity) {
  check_capacity(capacity);
  // Levels top-down: the root's level padded to kBranch, then kBranch children for every node in use above.
  int64_t depth = 1;
  for (int64_t span = 1; span < capacity; span *= kBranch) ++depth;
  depth = std::max<int64_t>(depth, 2);
  offsets_.assign(1, 0);
  offsets_.push_back(kBranch);
  for (int64_t d = 1; d < depth; ++d) {
    int64_t below = 1;  // leaves under one node of level d
    for (int64_t k = d; k < depth - 1; ++k) below *= kBranch;
    const int64_t nodes = (capacity + below * kBranch - 1) / (below * kBranch) * kBranch;
    offsets_.push_back(offsets_.back() + nodes);
  }
  sums_ = AlignedArray<double>(static_cast<std::size_t>(offsets_.back()), 0.0);
  mins_ = AlignedArray<double>(static_cast<std::size_t>(leaf0()), kInf);
}

// Node j of level d from its children; leaves count in the min only when positive.
void SumTree::recompute(int64_t d, int64_t j) {
  const int64_t first = offsets_[d + 1] + j * kBranch;
  double s = 0.0;
  double m = kInf;
  if (d == depth() - 2) {  // the children are leaves: their min is read from the sums
    for (int64_t c = 0; c < kBranch; ++c) {
      const double v = sums_[first + c];
      s += v;
      if (v > 0.0) m = std::min(m, v);
    }
  } else {
    for (int64_t c = 0; c < kBranch; ++c) {
      s += sums_[first + c];
      m = std::min(m, mins_[first + c]);
    }
  }
  sums_[offsets_[d] + j] = s;
  mins_[offsets_[d] + j] = m;
}

void SumTree::update(const int64_t* slots, const double* values, int64_t n, double exponent) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_slots(slots, n, capacity_, "tree", "leaves");
  update_locked(slots, values, n, exponent);
}

// Level by level, the batch's memory reads are independent of each other and are all prefetched before any
// is used, so their cache misses overlap; a parent shared with the previous entry is recomputed once.
void SumTree::update_locked(const int64_t* slots, const double* values, int64_t n, double exponent) {
  const int64_t first_leaf = leaf0();
  for (int64_t i = 0; i < n; ++i) prefetch(&sums_[first_leaf + slots[i]]);
  for (int64_t i = 0; i < n; ++i) {
    double v = values[i];
    if (exponent != 1.0) v = v > 0.0 ? std::pow(v, exponent) : 0.0;
    sums_[first_leaf + slots[i]] = v;
  }
  scratch_.assign(slots, slots + n);
  for (int64_t d = depth() - 2; d >= 0; --d) {
    for (int64_t i = 0; i < n; ++i) {
      prefetch(&sums_[offsets_[d] + scratch_[i] / kBranch]);
      prefetch(&mins_[offsets_[d] + scratch_[i] / kBranch]);
    }
    int64_t previous = -1;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = scratch_[i] / kBranch;
      scratch_[i] = j;
      if (j != previous) {
        recompute(d, j);
        previous = j;
      }
    }
  }
}

void SumTree::set_leaves(const double* values) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(sums_.data(), sums_.data() + sums_.size(), 0.0);
  std::copy(values, values + capacity_, sums_.data() + leaf0());
  for (int64_t d = depth() - 2; d >= 0; --d) {
    const int64_t used = (offsets_[d + 2] - offsets_[d + 1]) / kBranch;  // nodes of level d in use
    for (int64_t j = 0; j < used; ++j) recompute(d, j);
  }
}

void SumTree::find(const double* targets, int64_t n, int64_t* leaves_out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  find_locked(targets, n, leaves_out);
}

// At each node: the first child whose running sum exceeds what is left of the target (counted without
// branches: the number of running sums at or below it), which always has positive mass. If rounding leaves
// the target at or past the children's total, the last child with positive mass is taken, and the rest of
// the descent follows last positive children. All targets descend together, level by level, and each
// level's nodes are prefetched before any is read, so their cache misses overlap.
void SumTree::find_locked(const double* targets, int64_t n, int64_t* leaves_out) const {
  std::vector<double> left(targets, targets + n);
  std::vector<uint8_t> overflow(static_cast<std::size_t>(n), 0);
  std::fill(leaves_out, leaves_out + n, 0);
  for (int64_t d = 1; d < depth(); ++d) {
    for (int64_t i = 0; i < n; ++i) prefetch(&sums_[offsets_[d] + leaves_out[i] * kBranch]);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t first = offsets_[d] + leaves_out[i] * kBranch;
      int64_t pick = 0;
      if (!overflow[i]) {
        const double target = left[i];
        double running = 0.0;
        double below = 0.0;
        for (int64_t c = 0; c < kBranch; ++c) {
          running += sums_[first + c];
          const bool passed = running <= target;
          pick += passed;
          below = passed ? running : below;
        }
        left[i] = target - below;
      }
      if (pick == kBranch || overflow[i]) {
        overflow[i] = 1;
        pick = 0;
        for (int64_t c = 0; c < kBranch; ++c) {
          if (sums_[first + c] > 0.0) pick = c;
        }
      }
      leaves_out[i] = leaves_out[i] * kBranch + pick;
    }
  }
}

void SumTree::sample(const double* uniforms, int64_t n, bool stratified, double beta, int64_t* leaves_out,
                     double* probabilities, float* weights) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const double total = sums_[0];
  std::vector<double> targets(static_cast<std::size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    targets[j] = stratified ? (static_cast<double>(j) + uniforms[j]) * (total / static_cast<double>(n))
                            : uniforms[j] * total;
  }
  find_locked(targets.data(), n, leaves_out);
  const double min_mass = mins_[0];
  for (int64_t j = 0; j < n; ++j) {
    const double m = sums_[leaf0() + leaves_out[j]];
    probabilities[j] = m / total;
    weights[j] = static_cast<float>(std::pow(min_mass / m, beta));
  }
}

// Each retiring leaf is set to 0 in turn (a leaf retires at most once), and every one is put back at the
// end: the tree is a pure function of its leaves, so it is left bit for bit as it was.
void SumTree::sequential(const int64_t* leaves, const bool* retires, int64_t n, double beta,
                         double* probabilities, float* weights) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_slots(leaves, n, capacity_, "tree", "leaves");
  std::vector<double> masses(static_cast<std::size_t>(n));
  for (int64_t j = 0; j < n; ++j) masses[j] = sums_[leaf0() + leaves[j]];
  std::vector<int64_t> retired;
  std::vector<double> retired_masses;
  const double zero = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double m = masses[j];
    probabilities[j] = m / sums_[0];
    weights[j] = static_cast<float>(std::pow(mins_[0] / m, beta));
    if (retires[j]) {
      update_locked(&leaves[j], &zero, 1, 1.0);
      retired.push_back(leaves[j]);
      retired_masses.push_back(m);
    }
  }
  update_locked(retired.data(), retired_masses.data(), static_cast<int64_t>(retired.size()), 1.0);
}

int64_t SumTree::draws_left(const int64_t* times, int64_t limit, int64_t enough) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const double* leaf = leaves();
  int64_t total = 0;
  for (int64_t i = 0; i < capacity_; ++i) {
    if (leaf[i] > 0.0) {
      total += limit - times[i];
      if (total >= enough) break;
    }
  }
  return total;
}

}  // namespace rlflow
