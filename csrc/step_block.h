// The block filler: one env step of every lane of a StepBlock, checked and copied into the block's columns in
// one call (rlflow.adders.StepBlock documents the semantics; the Python side converts what is not already an
// array of a column's dtype and shape, and words the errors).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "numpy_api.h"
#include "value_checks.h"

namespace rlflow {

// The parts of a step, in the order a step row holds them.
enum class Part : int { Action = 0, Reward = 1, Extras = 2, Observation = 3, Final = 4 };

// What put says of a step. Ok: it is in the block. Convert: a part's leaves are not arrays of its columns'
// dtypes and shapes (or a column's values are checked by Python): Python converts the part, writes it to the
// step's row and puts the step again with that part as None. Flags: the flags are not bool arrays of one
// entry per lane. The flag faults name a lane; the value faults a part, a column and a lane; the stack faults
// (frame stacks) a column and a lane.
enum class Put : int {
  Ok = 0,
  Convert,
  Flags,
  LastMismatch,
  NoEpisode,
  StartsInEpisode,
  EndsNoEpisode,
  FinalMissing,
  Value,
  StackBreak,
  StackStart,
};

// One block column: values [T, E, *shape] in a numpy array the block owns (the object holds a reference).
struct BlockColumn {
  nanobind::object array;  // keeps the array alive
  uint8_t* data = nullptr;
  int type_num = 0;
  PyArray_Descr* descr = nullptr;  // the array's dtype (alive with it)
  char kind = 0;              // 'f', 'i', 'u', 'b', ...
  int64_t itemsize = 1;
  int64_t row_bytes = 0;      // one lane's value
  std::vector<int64_t> shape;  // one lane's value shape
  bool exact = true;          // a leaf of this dtype and shape is copied as is and checked here
  ValueCheck check = ValueCheck::None;
  double low = 0.0, high = 0.0;

  uint8_t* row(int64_t s, int64_t lanes) const { return data + s * lanes * row_bytes; }
};

// A frame-stacked observation column: the open row's stack of each lane ([E, k, *frame]), which the lane's
// next row must continue.
struct StackColumn {
  int column = 0;     // index into the observation columns
  int64_t frames = 0;
  uint8_t* open = nullptr;
  nanobind::object array;
};

class StepBlockCore {
 public:
  StepBlockCore(int64_t steps, int64_t lanes) : steps_(steps), lanes_(lanes) {}

  int64_t steps() const { return steps_; }
  int64_t lanes() const { return lanes_; }
  // The steps put so far (rows 0 .. filled - 1): every put goes to row `filled` on and, when the steps are
  // good, counts them. Set to empty the block (0) or to keep the steps a loaded block holds.
  int64_t filled() const { return filled_; }
  void set_filled(int64_t n);
  // The store lane of each block lane, [E] (set_lanes), and the steps' flags, [T, E].
  const int64_t* lane_ids() const { return lane_ids_; }
  const bool* first() const { return first_; }
  const bool* terminated() const { return terminated_; }
  const bool* truncated() const { return truncated_; }
  void set_lanes(nanobind::handle lanes);
  void set_columns(Part part, std::vector<BlockColumn> columns);
  const std::vector<BlockColumn>& columns(Part part) const { return parts_[static_cast<int>(part)]; }
  // The step flags [T, E] and the lanes' states [E] (bool arrays the Python block owns and reads too).
  void set_flags(nanobind::handle first, nanobind::handle terminated, nanobind::handle truncated,
                 nanobind::handle is_open);
  // Observation column `column` holds frame stacks of `frames` frames; `open` [E, k, *frame] the open rows'.
  void add_stack(int column, nanobind::handle open);
  // Multi-agent rows: observation column `column` holds the agents' active flags; `active` [E, A] the flags
  // at each lane's open row; the action columns `zeroed` ([E, A, ...]) get zeros for the agents not active.
  void set_agents(int column, nanobind::handle active, std::vector<int> zeroed);

  // Where a stepped put reads: step i reads row rows[i] of its part leaves (rows nullptr: row i), which hold
  // `source_rows` rows (0: count); the lanes that start an episode take their observation from `firsts`
  // (nullptr: from the observation part), a tuple of observation leaves of the columns' dtypes and shapes,
  // checked by the caller: the j-th first flag (step then lane order) reads row first_rows[j] of it (first_rows
  // nullptr: row j), of its `first_count` rows (0: one per first flag).
  struct Sources {
    const int64_t* rows = nullptr;
    int64_t source_rows = 0;
    PyObject* firsts = nullptr;
    const int64_t* first_rows = nullptr;
    int64_t first_count = 0;
    bool unbatched = false;  // a one-lane step's leaves may leave the lane axis out (ReplayBuffer.add of one env)
  };

  // Check `count` steps from row `filled` and put them (one leaf tuple per part, each leaf [E, ...] for one step, or with
  // `stepped` [count, E, ...] (one lane: [count, ...]); None: the part's rows are written and checked already;
  // the flags: bool arrays [E], or stepped [count, E] (one lane: [count])). A step that fails leaves the lanes'
  // states as they were before it, and `filled` as it was.
  Put put(int64_t count, bool stepped, PyObject* const parts[5], PyObject* const flags[4],
          const Sources& sources);
  // The same with the flags given as `count * E` bools each (first, last, terminated, truncated).
  Put put_flags(int64_t count, bool stepped, PyObject* const parts[5], const bool* const flags[4],
                const Sources& sources);
  // The lanes' open rows are observation `rows` (one pointer per observation column, one lane's row each) of a
  // one-lane block: an episode starts there before the block's steps. Value faults and a frame stack that is
  // not its first frame repeated (StackStart) are faults of the observation part, nothing changed.
  Put start_at(const std::vector<const uint8_t*>& rows);

  int64_t fault_step = -1;
  int64_t fault_lane = -1;
  int fault_column = -1;
  Part fault_part = Part::Action;

 private:
  struct Source {  // a part's leaves: each column's first row (a step's rows follow each other), or written
    bool written = false;
    std::vector<const uint8_t*> data;
    const int64_t* rows = nullptr;  // step i reads row rows[i] (nullptr: row i)
    bool unbatched = false;         // one lane's leaves may come without the lane axis
  };
  // What one put works with, kept from put to put so that a put of one step allocates nothing.
  struct Scratch {
    Source src[5];
    std::vector<uint8_t> open, needs_obs, needs_final;
  };
  struct Firsts {  // where the lanes that start an episode take their observation (put's sources.firsts)
    std::vector<const uint8_t*> data;
    const int64_t* rows = nullptr;
    int64_t next = 0;
  };
  bool resolve_firsts(const Sources& sources, const bool* first, int64_t count, Firsts& out) const;
  void put_firsts(int64_t s, const bool* first, Firsts& firsts);
  bool resolve(Part part, PyObject* leaves, int64_t rows, bool stepped, Source& src);
  void copy_rows(Part part, const Source& src, int64_t s, int64_t i, const bool* only_lanes);
  struct Fault {  // a fault a pass over a put's steps found: its step (in the put), what, and where
    int64_t step;
    Put status;
    Part part;
    int column;
    int64_t lane;
  };
  // Copy part `part` of the put's steps 0 .. n-1 to block rows s .. s+n-1 (the steps where want[i], when given).
  void copy_steps(Part part, const Source& src, int64_t s, int64_t n, const uint8_t* want);
  // The first value fault of part `part` in block rows s .. s+n-1 (the steps where want[i], the lanes where
  // only_lanes[i * E + e], when given) that comes before `found` (an earlier step), into `found`.
  void first_value_fault(Part part, int64_t s, int64_t n, const uint8_t* want, const bool* only_lanes,
                         Fault& found) const;
  Put stack_fault(int64_t s, const bool* first, const bool* last, bool final_given);
  void zero_inactive(int64_t s);

  int64_t steps_, lanes_;
  int64_t filled_ = 0;
  Scratch scratch_;
  const int64_t* lane_ids_ = nullptr;
  nanobind::object lane_array_;
  std::vector<BlockColumn> parts_[5];
  nanobind::object owned_[4];  // first, terminated, truncated, is_open
  bool* first_ = nullptr;
  bool* terminated_ = nullptr;
  bool* truncated_ = nullptr;
  bool* is_open_ = nullptr;
  std::vector<StackColumn> stacks_;
  int active_column_ = -1;  // the observation column of the agents' active flags (multi-agent rows)
  int64_t agents_ = 0;
  bool* active_ = nullptr;  // [E, A]: the agents active at each lane's open row
  nanobind::object active_array_;
  std::vector<int> zeroed_;  // action columns [E, A, ...] whose inactive agents' values are zeroed
};

// A numpy array as a block column (ValueError unless it is a writeable, aligned, C-contiguous, native-order
// array [steps, lanes, ...]).
BlockColumn block_column(nanobind::handle array, int64_t steps, int64_t lanes);
// Whether a frame stack of `frames` frames of `w` bytes each is not its newest frame repeated, as an episode's
// first stack must be (the block filler's and the block writer's check).
inline bool stack_not_repeated(const uint8_t* stack, int64_t frames, int64_t w) {
  const uint8_t* newest = stack + (frames - 1) * w;
  for (int64_t f = 0; f + 1 < frames; ++f) {
    if (std::memcmp(stack + f * w, newest, w) != 0) return true;
  }
  return false;
}

// Whether `leaf` is an array of the column's dtype and shape [lanes, *shape] (with `unbatched`, one lane's may
// leave the lane axis out), C-contiguous: copied as is.
bool fits(PyObject* leaf, const BlockColumn& column, int64_t lanes, bool unbatched);
// The same for `count` steps: [count, lanes, *shape], or for one lane [count, *shape].
bool fits_steps(PyObject* leaf, const BlockColumn& column, int64_t count, int64_t lanes);

}  // namespace rlflow
