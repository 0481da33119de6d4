// The uniform selector's set of live slots (rlflow.replay.Uniform documents it): the live slots packed in
// items[0 .. count), where[slot] a slot's position there (-1: not held) and live[slot] a one-byte flag. The
// arrays are Python's, handed in with each call. A batch applies in order, as the same calls one by one would.
#pragma once

#include <cstdint>

namespace rlflow {

struct DenseSet {
  int64_t* items;
  int64_t* where;
  bool* live;
  int64_t capacity;
  int64_t count;

  // Append the slots not held yet; the new count.
  int64_t insert(const int64_t* slots, int64_t n);
  // Remove the held slots (the last element moves into each hole); the new count.
  int64_t remove(const int64_t* slots, int64_t n);
  // n slots, each uniform over the count held ones, from 2n uniforms: draw j takes slot floor(u_j * capacity)
  // when it is held (reading a one-byte flag), else the packed slot items[floor(u_{n+j} * count)]; a held slot
  // is then chosen with probability 1 / capacity + (1 - count / capacity) / count = 1 / count.
  void pick(const double* uniforms, int64_t n, int64_t* out) const;
};

}  // namespace rlflow
