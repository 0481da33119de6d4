// A StepStore's ring cursors and episode marks (rlflow.replay.StepStore documents the addressing model): the
// rows written per lane, each row's episode id and step, and which rows a write overwrites.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

namespace rlflow {

class StoreRings {
 public:
  // written, next_episode, next_step: [lanes] int64; episode_id, episode_step: [lanes, capacity] int64 (arrays
  // the store owns); reach: the rows before a row that its frame stacks read, at most.
  StoreRings(nanobind::handle written, nanobind::handle episode_id, nanobind::handle episode_step,
             nanobind::handle next_episode, nanobind::handle next_step, int64_t reach);

  int64_t lanes() const { return lanes_; }
  int64_t capacity() const { return capacity_; }
  int64_t episode_step(int64_t lane, int64_t row) const;
  int64_t written(int64_t lane) const { return written_[lane]; }
  // Each row's step in its episode, flat ([lanes * capacity]: lane * capacity + row % capacity).
  const int64_t* episode_steps() const { return episode_step_; }
  // Record the episode id and step of the next row of `lane` (first: it starts an episode) and advance the
  // cursors; the row.
  int64_t mark(int64_t lane, bool first);
  // The rows that writing new_rows[i] rows to each of lanes[i] overwrites, as ranges[m] = (lane, lo, hi): rows
  // lo .. hi - 1, going on over the rows after them whose stacks read an overwritten row (rows of the same
  // episode, up to reach). Returns how many lanes overwrite any.
  int64_t overwritten(const int64_t* lanes, const int64_t* new_rows, int64_t n, int64_t* ranges) const;
  // Check n item windows (lanes[i], rows starts[i] .. starts[i] + lengths[i] - 1) are stored in full and set
  // each one's valid length: the rows from its start that belong to its first row's episode (all rows when
  // cross_episodes). A bad window (valid 0): a lane out of range, a length outside [1, capacity], a row not
  // stored, or, with frame stacks, a first row whose stacks read a row no longer stored. Returns the first bad
  // window, or -1.
  int64_t check_windows(const int64_t* lanes, const int64_t* starts, const int64_t* lengths, int64_t n,
                        bool cross_episodes, int64_t* valid) const;

 private:
  nanobind::object owned_[5];
  int64_t *written_ = nullptr, *episode_id_ = nullptr, *episode_step_ = nullptr, *next_episode_ = nullptr,
          *next_step_ = nullptr;
  int64_t lanes_ = 0, capacity_ = 0, reach_ = 0;
};

}  // namespace rlflow
