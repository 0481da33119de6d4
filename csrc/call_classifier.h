// ReplayBuffer.add's call classifier: sorts each env's call (a transition that goes on from the env's last
// next_obs, one that starts an episode, gymnasium's NEXT_STEP reset step) in one call, against the env's last
// next_obs it keeps (rlflow.buffer.ReplayBuffer documents the semantics).
#pragma once

#include <nanobind/nanobind.h>

#include "numpy_api.h"

#include <cstdint>
#include <vector>

namespace rlflow {

// What an env's last call left: no episode in progress, one in progress (its last next_obs is the open row),
// or one that ended at that call (a NEXT_STEP reset step may follow).
enum class CallState : int8_t { NoEpisodeYet = 0, InEpisode = 1, Ended = 2 };

// The rows of the classifier's output ([5, E] bool): the flags as given (the block filler keeps a step flagged
// both ways terminated),
// `last`, a reset step (next_obs starts the env's next episode, no transition), and an episode that starts at
// obs before the transition.
enum class CallRow : int { Terminated = 0, Truncated = 1, Last = 2, Reset = 3, Starts = 4 };

// classify's bits: some env starts an episode before its transition, some env's episode ends. Convert: an
// observation leaf is not a C-contiguous array of its column's dtype and shape [E, ...], or the reward not a
// C-contiguous native one: the caller converts them and classifies again (nothing changed). add's further
// bits: the step is in the block (StepPut), and next_obs is kept as each env's last (NextKept).
enum CallBits : int { AnyStart = 1, AnyLast = 2, StepPut = 4, NextKept = 8, Convert = 16 };

class StepBlockCore;
enum class Put : int;

// ReplayBuffer.extend's T steps of one env: leaf tuples [T, ...] of obs and next_obs (the observation
// columns), of the action and the extras (the block filler's parts), the reward [T, ...], and the flags [T].
struct StepsCall {
  PyObject* obs;
  PyObject* action;
  PyObject* reward;
  PyObject* extras;
  PyObject* next_obs;
  const bool* terminated;
  const bool* truncated;
  int64_t t;
};

// What extend did. judged false: obs, next_obs or the reward are not as the classifier compares them (nothing
// done: the caller converts them). Else `reset` holds each step's judgement (a NEXT_STEP reset step) and
// `status` the block filler's: Ok: `steps` transitions are in the block, the call's steps first_step ..
// last_step less its reset steps; `starts`: an episode starts at obs[first_step] before them (the caller writes
// that start before the block); `ended`: the last one ends its episode. A fault names the call's step
// (fault_step) and whether it is in an observation that starts an episode there (obs[fault_step]) rather than
// in the step's own parts; the block filler's fault_part and fault_column say the rest.
struct StepsPut {
  bool judged = false;
  Put status{};
  bool starts = false, ended = false, fault_first = false;
  int64_t steps = 0, first_step = -1, last_step = -1, fault_step = -1;
  std::vector<bool> reset;
};

// What add() puts a step of: the leaf tuples of the action, the extras and next_obs (the step's observation),
// the reward as classify reads it, and the views of the classifier's Reset, Last, Terminated and Truncated
// rows (the step's first, last, terminated and truncated flags).
struct CallStep {
  PyObject* action;
  PyObject* extras;
  PyObject* next_obs;
  PyObject* reward;
  PyObject* flag_rows[4];
};

struct LastColumn {  // one observation column's last next_obs of every env, [E, *shape]
  nanobind::object array;
  uint8_t* data = nullptr;
  PyArray_Descr* descr = nullptr;  // the array's dtype (alive with it)
  int64_t row_bytes = 0;
  std::vector<int64_t> shape;
};

class CallClassifier {
 public:
  // `last`: per observation column, an array [E, *shape] of the envs' last next_obs; `state`, `was`: int8
  // [E]; `calls`: bool [5, E] (arrays the Python side owns and reads).
  CallClassifier(const std::vector<nanobind::handle>& last, nanobind::handle state, nanobind::handle was,
                 nanobind::handle calls);

  // Sort each env's call (obs: a tuple of leaves, or None: not any env's last next_obs; terminated and
  // truncated: bool [E]; reward: [E, ...] of the reward's dtype, or anything else: judged zero) and advance
  // the states (the states before go to `was`). Returns the CallBits, or Convert.
  int classify(PyObject* obs, PyObject* terminated, PyObject* truncated, PyObject* reward);
  // Keep next_obs (a tuple of leaves) as each env's last; false (nothing kept) where a leaf is not an array of
  // its column's dtype and shape.
  bool remember(PyObject* next_obs);
  // classify, then, when no env starts an episode before its transition, put the step into `block` as its next
  // step and remember next_obs: one call for a step that goes on. Returns classify's bits (or Convert) with StepPut
  // when the step is in the block (else nothing was put: the caller puts it, converting what the filler
  // refuses) and NextKept when next_obs was kept. The states are restored if the put raises.
  int add(StepBlockCore& block, PyObject* obs, PyObject* terminated, PyObject* truncated,
          const CallStep& step);
  // The same judgement for t consecutive calls of env `env` at once (ReplayBuffer.extend), from its state and
  // last next_obs, changing nothing: obs and next_obs are tuples of leaves [t, *shape] of its columns' dtypes,
  // reward [t, ...] (as classify reads it), terminated and truncated [t]. Per step, reset[i] (a NEXT_STEP
  // reset step) and starts[i] (an episode starts at obs[i] before its transition). False (nothing judged)
  // where a leaf or the reward is not as it compares them.
  int64_t envs() const { return envs_; }
  bool judge_steps(int64_t env, PyObject* obs, PyObject* next_obs, PyObject* reward, const bool* terminated,
                   const bool* truncated, int64_t t, bool* reset, bool* starts) const;
  // extend's T steps of env `env`, judged as judge_steps judges them and put into one-lane `block` (empty,
  // started at the env's open row): the reset steps are left out, an episode starts at the obs of each step
  // that starts one (the step before it ends its episode there, truncated where it did not end), read in place
  // from the call's arrays; nothing is written to the store and the env's state is unchanged.
  StepsPut extend(StepBlockCore& block, int64_t env, const StepsCall& call) const;

 private:
  bool fits(PyObject* leaf, const LastColumn& c) const;
  bool fits_steps(PyObject* leaves, int64_t t) const;

  int64_t envs_ = 0;
  std::vector<LastColumn> last_;
  nanobind::object owned_[3];
  int8_t* state_ = nullptr;
  int8_t* was_ = nullptr;
  bool* calls_ = nullptr;
};

}  // namespace rlflow
