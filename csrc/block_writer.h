// The block writer: a StepBlock's rows into the store's lane rings, lane after lane, with their episode marks
// (rlflow.adders.Adder documents the row model), and the n-step transition items the written rows complete.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <vector>

#include "step_block.h"
#include "store_rings.h"

namespace rlflow {

// What a step does on a lane: its open row gets the action and the lane goes on (Continue), its episode ends
// (End), ends and the next starts at once (EndStart), or a lane with no episode in progress starts one (Start).
enum class StepKind : int8_t { Continue = 0, End = 1, EndStart = 2, Start = 3 };

// What plan says of a block: it can be written (Ok); a step does not follow from its lane's state (Flow); a
// frame stack does not continue the one before it in its episode (StackBreak), or an episode's first stack is
// not its first frame repeated (StackStart). The writer's fault_* say where.
enum class PlanFault : int { Ok = 0, Flow = 1, StackBreak = 2, StackStart = 3 };

struct StoreColumn {  // one store column, [lanes * capacity rows]
  nanobind::object array;
  uint8_t* data = nullptr;
  int64_t row_bytes = 0;
  int64_t frames = 1;  // frames of a block row's stack (the store row keeps the newest)
};

class BlockWriter {
 public:
  // `act`: the store columns an action fills in (action, reward, extras), `obs`: the observation columns with
  // `frames` per stack (1: not stacked), each [lanes * capacity, ...]; `flags`: terminated, truncated, first,
  // last [lanes * capacity] bool; `rings`: the store's (kept alive by `rings_owner`); `open_rows`,
  // `episode_start`: the adder's lane state, [lanes] int64.
  BlockWriter(const std::vector<nanobind::handle>& act, const std::vector<nanobind::handle>& obs,
              const std::vector<int64_t>& frames, const std::vector<nanobind::handle>& flags, StoreRings& rings,
              nanobind::handle rings_owner, nanobind::handle open_rows, nanobind::handle episode_start);

  // Each kind of the block's steps a .. a + steps - 1 per lane (codes [steps, E] int8) and the rows each lane
  // writes (new_rows [E]); the frame stacks checked; the rows the write overwrites as (lane, lo, hi) in
  // ranges [E, 3] (their count: overwritten_lanes). Changes nothing in the store.
  PlanFault plan(const StepBlockCore& block, int64_t a, int64_t steps, nanobind::handle codes,
                 nanobind::handle new_rows, nanobind::handle ranges);
  // Write the planned steps, lane after lane; rows [steps, 3, E] gets per step and lane the final row, the
  // first row of the episode its action belongs to, and the new open row (-1: none).
  void write(const StepBlockCore& block, int64_t a, int64_t steps, nanobind::handle codes, nanobind::handle rows);

  int64_t fault_step = -1, fault_lane = -1, fault_column = -1, overwritten_lanes = 0;

 private:
  void check_block(const StepBlockCore& block, int64_t a, int64_t steps) const;
  PlanFault stack_fault(const StepBlockCore& block, const std::vector<int64_t>& lane_ids, int64_t a, int64_t steps,
                        const int8_t* codes);

  std::vector<StoreColumn> act_, obs_;
  bool *terminated_ = nullptr, *truncated_ = nullptr, *first_ = nullptr, *last_ = nullptr;
  StoreRings* rings_;
  int64_t *open_rows_ = nullptr, *episode_start_ = nullptr;
  int64_t lanes_ = 0, capacity_ = 0;
  std::vector<nanobind::object> owned_;
};

// The n-step rule over a store's rewards: the items that written steps complete (rlflow.adders.NStepTransition
// documents the semantics).
class NStepItems {
 public:
  // `rewards`: the store's reward column [lanes * capacity, ...] (any integer or float dtype); `powers`: the
  // discount's powers g^0 .. g^n, float64.
  NStepItems(nanobind::handle rewards, int64_t capacity, nanobind::handle powers);
  // Where the items go: lanes, starts, lengths int64, returns [items, reward values] and discounts float32.
  void set_out(nanobind::handle lanes, nanobind::handle starts, nanobind::handle lengths, nanobind::handle returns,
               nanobind::handle discounts);
  // The items of the written steps a .. a + steps - 1 (codes and rows of BlockWriter, from step a on;
  // terminated [T, E] the block's; lanes [E] the store lanes); their count.
  int64_t make(int64_t a, int64_t steps, nanobind::handle codes, nanobind::handle rows, nanobind::handle terminated,
               nanobind::handle lanes, bool final_was_open);

 private:
  double reward(int64_t row, int64_t c) const;
  void item(int64_t m, int64_t lane, int64_t start, int64_t k, double discount);

  nanobind::object rewards_array_, powers_array_;
  const uint8_t* rewards_ = nullptr;
  char kind_ = 0;  // the rewards' dtype kind
  int64_t reward_values_ = 0, itemsize_ = 0, rows_ = 0, capacity_ = 0, n_ = 0;
  const double* powers_ = nullptr;
  nanobind::object out_[5];
  int64_t *lanes_ = nullptr, *starts_ = nullptr, *lengths_ = nullptr;
  float *returns_ = nullptr, *discounts_ = nullptr;
  int64_t out_size_ = 0;
};

}  // namespace rlflow
