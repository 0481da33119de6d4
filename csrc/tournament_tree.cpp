#include "tournament_tree.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "slots.h"

namespace rlflow {

TournamentTree::TournamentTree(int64_t capacity) : size_(power_of_two_at_least(capacity)) {
  check_capacity(capacity);
  win_.assign(static_cast<std::size_t>(2 * size_), -1);
  k1_.assign(static_cast<std::size_t>(capacity), 0.0);
  k2_.assign(static_cast<std::size_t>(capacity), 0);
}

int64_t TournamentTree::better(int64_t a, int64_t b) const {
  if (a < 0) return b;
  if (b < 0) return a;
  return k1_[a] < k1_[b] || (k1_[a] == k1_[b] && k2_[a] < k2_[b]) ? a : b;
}

void TournamentTree::fix(int64_t node) {
  for (int64_t i = node >> 1; i >= 1; i >>= 1) win_[i] = better(win_[2 * i], win_[2 * i + 1]);
}

// Leaf of slot s holds `value` (s, or -1), and its ancestors are recomputed.
void TournamentTree::put(int64_t s, int64_t value) {
  win_[size_ + s] = value;
  fix(size_ + s);
}

void TournamentTree::set(const int64_t* slots, const double* k1, const int64_t* k2, int64_t n) {
  check_slots(slots, n, capacity(), "selector", "slots");
  for (int64_t j = 0; j < n; ++j) {
    k1_[slots[j]] = k1[j];
    k2_[slots[j]] = k2[j];
    put(slots[j], slots[j]);
  }
}

void TournamentTree::set_k1(const int64_t* slots, const double* k1, int64_t n) {
  check_slots(slots, n, capacity(), "selector", "slots");
  for (int64_t j = 0; j < n; ++j) {
    k1_[slots[j]] = k1[j];
    put(slots[j], slots[j]);
  }
}

void TournamentTree::clear(const int64_t* slots, int64_t n) {
  check_slots(slots, n, capacity(), "selector", "slots");
  for (int64_t j = 0; j < n; ++j) put(slots[j], -1);
}

// Takes the winner out n times, then puts every one back: the tree is left as it was.
int64_t TournamentTree::top(int64_t n, int64_t* out) {
  int64_t m = 0;
  while (m < n && win_[1] >= 0) {
    const int64_t s = win_[1];
    out[m++] = s;
    put(s, -1);
  }
  for (int64_t j = 0; j < m; ++j) put(out[j], out[j]);
  return m;
}

void TournamentTree::load(const int64_t* leaves, const double* k1, const int64_t* k2) {
  for (int64_t s = 0; s < size_; ++s) {
    if (leaves[s] != -1 && (leaves[s] != s || s >= capacity())) {
      throw std::invalid_argument("leaf " + std::to_string(s) + " must hold its slot or -1, got " +
                                  std::to_string(leaves[s]));
    }
  }
  std::fill(win_.begin(), win_.end(), -1);
  std::copy(leaves, leaves + size_, win_.begin() + size_);
  std::copy(k1, k1 + capacity(), k1_.begin());
  std::copy(k2, k2 + capacity(), k2_.begin());
  for (int64_t i = size_ - 1; i >= 1; --i) win_[i] = better(win_[2 * i], win_[2 * i + 1]);
}

}  // namespace rlflow
