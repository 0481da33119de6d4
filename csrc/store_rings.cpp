#include "store_rings.h"

#include <algorithm>
#include <stdexcept>

#include "arrays.h"
#include "slots.h"

namespace rlflow {

namespace nb = nanobind;

StoreRings::StoreRings(nb::handle written, nb::handle episode_id, nb::handle episode_step, nb::handle next_episode,
                       nb::handle next_step, int64_t reach) {
  written_ = array_data<int64_t>(written, NPY_INT64, -1, "written");
  lanes_ = PyArray_SIZE(reinterpret_cast<PyArrayObject*>(written.ptr()));
  capacity_ = array_dim(episode_id, 1);
  if (lanes_ < 1 || capacity_ < 1 || reach < 0) {
    throw std::invalid_argument("StoreRings: expected at least one lane and row, and reach >= 0");
  }
  episode_id_ = array_data<int64_t>(episode_id, NPY_INT64, lanes_ * capacity_, "episode_id");
  episode_step_ = array_data<int64_t>(episode_step, NPY_INT64, lanes_ * capacity_, "episode_step");
  next_episode_ = array_data<int64_t>(next_episode, NPY_INT64, lanes_, "next_episode");
  next_step_ = array_data<int64_t>(next_step, NPY_INT64, lanes_, "next_step");
  reach_ = reach;
  nb::handle arrays[5] = {written, episode_id, episode_step, next_episode, next_step};
  for (int i = 0; i < 5; ++i) owned_[i] = nb::borrow(arrays[i]);
}

int64_t StoreRings::episode_step(int64_t lane, int64_t row) const {
  return episode_step_[lane * capacity_ + ring_pos(row, capacity_)];
}

int64_t StoreRings::mark(int64_t lane, bool first) {
  const int64_t row = written_[lane];
  if (first || row == 0) {
    next_episode_[lane] += 1;
    next_step_[lane] = 0;
  }
  const int64_t at = lane * capacity_ + ring_pos(row, capacity_);
  episode_id_[at] = next_episode_[lane] - 1;
  episode_step_[at] = next_step_[lane];
  next_step_[lane] += 1;
  written_[lane] = row + 1;
  return row;
}

int64_t StoreRings::overwritten(const int64_t* lanes, const int64_t* new_rows, int64_t n, int64_t* ranges) const {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lane = lanes[i];
    const int64_t c = written_[lane];
    const int64_t lo = std::max<int64_t>(c - capacity_, 0);
    const int64_t hi = c + new_rows[i] - capacity_;
    if (hi <= lo) continue;
    int64_t end = hi;
    while (end < c && end - hi < reach_ && episode_step(lane, end) > end - hi) ++end;
    ranges[3 * m] = lane;
    ranges[3 * m + 1] = lo;
    ranges[3 * m + 2] = end;
    ++m;
  }
  return m;
}

int64_t StoreRings::check_windows(const int64_t* lanes, const int64_t* starts, const int64_t* lengths, int64_t n,
                                  bool cross_episodes, int64_t* valid) const {
  int64_t first_bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {  // other lanes' rows are far apart: requested ahead of use
      const int64_t ahead_lane = lanes[i + kAhead];
      if (0 <= ahead_lane && ahead_lane < lanes_) {
        prefetch(episode_id_ + ahead_lane * capacity_ + ring_pos(starts[i + kAhead], capacity_));
      }
    }
    const int64_t lane = lanes[i], start = starts[i], length = lengths[i];
    bool ok = lane >= 0 && lane < lanes_ && length >= 1 && length <= capacity_;
    if (ok) {
      const int64_t c = written_[lane];
      const int64_t oldest = std::max<int64_t>(c - capacity_, 0);
      ok = oldest <= start && start <= c - length;
      if (ok && reach_) ok = start - std::min(reach_, episode_step(lane, start)) >= oldest;
    }
    if (!ok) {
      valid[i] = 0;
      if (first_bad < 0) first_bad = i;
      continue;
    }
    if (cross_episodes) {
      valid[i] = length;
      continue;
    }
    const int64_t* ids = episode_id_ + lane * capacity_;
    const int64_t episode = ids[ring_pos(start, capacity_)];
    if (ids[ring_pos(start + length - 1, capacity_)] == episode) {
      valid[i] = length;
      continue;
    }
    int64_t k = 1;
    while (k < length && ids[ring_pos(start + k, capacity_)] == episode) ++k;
    valid[i] = k;
  }
  return first_bad;
}

}  // namespace rlflow
