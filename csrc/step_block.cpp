#include "step_block.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "arrays.h"

namespace rlflow {

namespace nb = nanobind;

namespace {

// The flags of `count` steps handed in with them ([E] for one step, [count, E] or for one lane [count] for several),
// or nullptr.
const bool* flags_of(PyObject* o, int64_t count, int64_t lanes, bool stepped) {
  if (!stepped) return one_flag_each(o, lanes);
  if (!PyArray_Check(o)) return nullptr;
  auto* a = reinterpret_cast<PyArrayObject*>(o);
  const bool shaped = (PyArray_NDIM(a) == 2 && PyArray_DIM(a, 0) == count && PyArray_DIM(a, 1) == lanes) ||
                      (lanes == 1 && PyArray_NDIM(a) == 1 && PyArray_DIM(a, 0) == count);
  if (PyArray_TYPE(a) != NPY_BOOL || !shaped || !PyArray_IS_C_CONTIGUOUS(a)) return nullptr;
  return static_cast<const bool*>(PyArray_DATA(a));
}

// Whether one lane's value of `column` (its bytes at `row`) fails the column's check.
bool row_fault(const BlockColumn& c, const uint8_t* row) {
  const int64_t n = c.itemsize ? c.row_bytes / c.itemsize : 0;
  return values_fail(row, n, c.kind, c.itemsize, c.check, c.low, c.high);
}

// Whether the first `n` bytes at x and y differ.
bool differ(const uint8_t* x, const uint8_t* y, int64_t n) { return n > 0 && std::memcmp(x, y, n) != 0; }

}  // namespace

BlockColumn block_column(nb::handle array, int64_t steps, int64_t lanes) {
  PyArrayObject* a = checked_array(array, -1, -1, "block column");
  if (PyArray_NDIM(a) < 2 || PyArray_DIM(a, 0) != steps || PyArray_DIM(a, 1) != lanes) {
    throw std::invalid_argument("block column: expected an array [" + std::to_string(steps) + ", " +
                                std::to_string(lanes) + ", ...]");
  }
  BlockColumn c;
  c.array = nb::borrow(array);
  c.data = static_cast<uint8_t*>(PyArray_DATA(a));
  c.type_num = PyArray_TYPE(a);
  c.descr = PyArray_DESCR(a);
  c.kind = PyArray_DESCR(a)->kind;
  c.itemsize = PyArray_ITEMSIZE(a);
  c.row_bytes = c.itemsize;
  for (int i = 2; i < PyArray_NDIM(a); ++i) {
    c.shape.push_back(PyArray_DIM(a, i));
    c.row_bytes *= PyArray_DIM(a, i);
  }
  return c;
}

bool fits(PyObject* leaf, const BlockColumn& c, int64_t lanes) {
  return c.exact && has_layout(leaf, c.descr, {lanes}, c.shape);
}

bool fits_steps(PyObject* leaf, const BlockColumn& c, int64_t count, int64_t lanes) {
  return c.exact && (has_layout(leaf, c.descr, {count, lanes}, c.shape) ||
                     (lanes == 1 && has_layout(leaf, c.descr, {count}, c.shape)));
}

void StepBlockCore::set_columns(Part part, std::vector<BlockColumn> columns) {
  parts_[static_cast<int>(part)] = std::move(columns);
}

void StepBlockCore::set_flags(nb::handle first, nb::handle terminated, nb::handle truncated, nb::handle is_open) {
  first_ = array_data<bool>(first, NPY_BOOL, steps_ * lanes_, "first");
  terminated_ = array_data<bool>(terminated, NPY_BOOL, steps_ * lanes_, "terminated");
  truncated_ = array_data<bool>(truncated, NPY_BOOL, steps_ * lanes_, "truncated");
  is_open_ = array_data<bool>(is_open, NPY_BOOL, lanes_, "is_open");
  nb::handle arrays[4] = {first, terminated, truncated, is_open};
  for (int i = 0; i < 4; ++i) owned_[i] = nb::borrow(arrays[i]);
}

void StepBlockCore::set_lanes(nb::handle lanes) {
  lane_ids_ = array_data<int64_t>(lanes, NPY_INT64, lanes_, "lanes");
  lane_array_ = nb::borrow(lanes);
}

void StepBlockCore::add_stack(int column, nb::handle open) {
  const auto& obs = parts_[static_cast<int>(Part::Observation)];
  if (column < 0 || column >= static_cast<int>(obs.size()) || obs[column].shape.empty()) {
    throw std::out_of_range("stacks: observation column " + std::to_string(column) + " holds no stacks");
  }
  const BlockColumn& c = obs[column];
  if (c.shape[0] < 2 || c.row_bytes % c.shape[0] != 0) {
    throw std::invalid_argument("stacks: a stacked column holds at least two frames");
  }
  PyArrayObject* a = checked_array(open, -1, -1, "stacks");
  if (PyArray_TYPE(a) != c.type_num || PyArray_NBYTES(a) != lanes_ * c.row_bytes) {
    throw std::invalid_argument("stacks: expected one open stack per lane of the column's dtype");
  }
  StackColumn s;
  s.column = column;
  s.frames = c.shape[0];
  s.open = static_cast<uint8_t*>(PyArray_DATA(a));
  s.array = nb::borrow(open);
  stacks_.push_back(std::move(s));
}

void StepBlockCore::set_agents(int column, nb::handle active, std::vector<int> zeroed) {
  const auto& obs = parts_[static_cast<int>(Part::Observation)];
  if (column < 0 || column >= static_cast<int>(obs.size()) || obs[column].type_num != NPY_BOOL ||
      obs[column].shape.size() != 1) {
    throw std::out_of_range("agents: observation column " + std::to_string(column) + " is not [E, A] bool");
  }
  agents_ = obs[column].shape[0];
  if (agents_ < 1) throw std::invalid_argument("agents: expected at least one agent");
  active_ = array_data<bool>(active, NPY_BOOL, lanes_ * agents_, "active");
  active_array_ = nb::borrow(active);
  const auto& act = parts_[static_cast<int>(Part::Action)];
  for (int j : zeroed) {
    if (j < 0 || j >= static_cast<int>(act.size()) || act[j].shape.empty() || act[j].shape[0] != agents_) {
      throw std::out_of_range("agents: action column " + std::to_string(j) + " does not lead with the agents");
    }
  }
  active_column_ = column;
  zeroed_ = std::move(zeroed);
}

const bool* StepBlockCore::step_flags(PyObject* flags, int64_t count, bool stepped) const {
  return flags_of(flags, count, lanes_, stepped);
}

bool StepBlockCore::resolve(Part part, PyObject* leaves, int64_t count, bool stepped, Source& src) {
  src.resolved = true;
  src.written = leaves == Py_None;  // converted, written and checked by the caller
  if (src.written) return true;
  const auto& cols = parts_[static_cast<int>(part)];
  fault_part = part;
  fault_column = -1;
  if (!PyTuple_Check(leaves) || PyTuple_GET_SIZE(leaves) != static_cast<Py_ssize_t>(cols.size())) return false;
  src.data.assign(cols.size(), nullptr);
  for (std::size_t j = 0; j < cols.size(); ++j) {
    PyObject* leaf = PyTuple_GET_ITEM(leaves, j);
    if (!(stepped ? fits_steps(leaf, cols[j], count, lanes_) : fits(leaf, cols[j], lanes_))) {
      fault_column = static_cast<int>(j);
      return false;
    }
    src.data[j] = static_cast<const uint8_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(leaf)));
  }
  return true;
}

void StepBlockCore::copy_rows(Part part, const Source& src, int64_t s, int64_t i, const bool* only_lanes) {
  if (src.written) return;
  const auto& cols = parts_[static_cast<int>(part)];
  for (std::size_t j = 0; j < cols.size(); ++j) {
    const BlockColumn& c = cols[j];
    if (c.row_bytes == 0) continue;
    const uint8_t* from = src.data[j] + i * lanes_ * c.row_bytes;
    uint8_t* dst = c.row(s, lanes_);
    if (only_lanes == nullptr) {
      std::memcpy(dst, from, lanes_ * c.row_bytes);
      continue;
    }
    for (int64_t e = 0; e < lanes_; ++e) {
      if (only_lanes[e]) std::memcpy(dst + e * c.row_bytes, from + e * c.row_bytes, c.row_bytes);
    }
  }
}

bool StepBlockCore::value_fault(Part part, int64_t s, const bool* only_lanes) {
  const auto& cols = parts_[static_cast<int>(part)];
  for (std::size_t j = 0; j < cols.size(); ++j) {
    const BlockColumn& c = cols[j];
    if (c.check == ValueCheck::None) continue;
    const uint8_t* row = c.row(s, lanes_);
    for (int64_t e = 0; e < lanes_; ++e) {
      if ((only_lanes == nullptr || only_lanes[e]) && row_fault(c, row + e * c.row_bytes)) {
        fault_part = part;
        fault_column = static_cast<int>(j);
        fault_lane = e;
        return true;
      }
    }
  }
  return false;
}

void StepBlockCore::zero_inactive(int64_t s) {
  const auto& act = parts_[static_cast<int>(Part::Action)];
  for (int j : zeroed_) {
    const BlockColumn& c = act[j];
    const int64_t agent_bytes = c.row_bytes / agents_;
    uint8_t* row = c.row(s, lanes_);
    for (int64_t e = 0; e < lanes_; ++e) {
      for (int64_t a = 0; a < agents_; ++a) {
        if (!active_[e * agents_ + a]) std::memset(row + e * c.row_bytes + a * agent_bytes, 0, agent_bytes);
      }
    }
  }
}

Put StepBlockCore::stack_fault(int64_t s, const bool* first, const bool* last, bool final_given) {
  for (const StackColumn& sc : stacks_) {
    const BlockColumn& obs = parts_[static_cast<int>(Part::Observation)][sc.column];
    const BlockColumn& fin = parts_[static_cast<int>(Part::Final)][sc.column];
    const int64_t w = obs.row_bytes / sc.frames;  // one frame
    const int64_t kept = (sc.frames - 1) * w;     // the frames a row shares with the stack before it
    fault_column = sc.column;
    for (int pass = 0; pass < 2; ++pass) {  // the rows that go on from the open row, then the final rows
      fault_part = pass == 0 ? Part::Observation : Part::Final;
      const BlockColumn& c = pass == 0 ? obs : fin;
      if (pass == 1 && !final_given) continue;
      for (int64_t e = 0; e < lanes_; ++e) {
        const bool goes_on = pass == 0 ? (!first[e] && !last[e]) : last[e];
        if (goes_on && differ(c.row(s, lanes_) + e * c.row_bytes, sc.open + e * obs.row_bytes + w, kept)) {
          fault_lane = e;
          return Put::StackBreak;
        }
      }
    }
    fault_part = Part::Observation;
    for (int64_t e = 0; e < lanes_; ++e) {
      if (!first[e]) continue;
      const uint8_t* row = obs.row(s, lanes_) + e * obs.row_bytes;
      for (int64_t f = 0; f + 1 < sc.frames; ++f) {
        if (differ(row + f * w, row + kept, w)) {
          fault_lane = e;
          return Put::StackStart;
        }
      }
    }
  }
  return Put::Ok;
}

Put StepBlockCore::put(int64_t s, int64_t count, bool stepped, PyObject* const parts[5], PyObject* const flags[4]) {
  if (count < 1 || count > steps_ || s < 0 || s > steps_ - count) {
    throw std::out_of_range("put: steps " + std::to_string(s) + ".." + std::to_string(s + count) +
                            " outside the block's " + std::to_string(steps_));
  }
  fault_lane = -1;
  fault_column = -1;
  fault_step = s;
  const bool* f[4];
  for (int k = 0; k < 4; ++k) {
    f[k] = step_flags(flags[k], count, stepped);
    if (f[k] == nullptr) return Put::Flags;
  }
  Source src[5];
  // The parts an action fills in come first: a step whose values need converting is converted before its
  // flags are judged.
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) {
    if (!resolve(p, parts[static_cast<int>(p)], count, stepped, src[static_cast<int>(p)])) return Put::Convert;
  }
  // The lanes' states before the steps, restored if a later one fails.
  const std::vector<bool> is_open(is_open_, is_open_ + lanes_);
  const std::vector<bool> active(active_, active_ + (active_ != nullptr ? lanes_ * agents_ : 0));
  std::vector<std::vector<uint8_t>> open_stacks;
  if (count > 1) {
    for (const StackColumn& sc : stacks_) {
      const int64_t bytes = lanes_ * parts_[static_cast<int>(Part::Observation)][sc.column].row_bytes;
      open_stacks.emplace_back(sc.open, sc.open + bytes);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    const bool* step[4];
    for (int k = 0; k < 4; ++k) step[k] = f[k] + i * lanes_;
    const Put r = put_step(s + i, i, src, parts, step, count, stepped);
    if (r == Put::Ok) continue;
    fault_step = s + i;
    if (i > 0) {  // the steps before it are taken back
      std::copy(is_open.begin(), is_open.end(), is_open_);
      if (active_ != nullptr) std::copy(active.begin(), active.end(), active_);
      for (std::size_t k = 0; k < open_stacks.size(); ++k) {
        std::copy(open_stacks[k].begin(), open_stacks[k].end(), stacks_[k].open);
      }
    }
    return r;
  }
  return Put::Ok;
}

Put StepBlockCore::put_step(int64_t s, int64_t i, Source src[5], PyObject* const parts[5], const bool* const f[4],
                            int64_t count, bool stepped) {
  const bool *first = f[0], *last = f[1], *terminated = f[2], *truncated = f[3];
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) copy_rows(p, src[static_cast<int>(p)], s, i, nullptr);
  bool needs_obs = false, needs_final = false;
  for (int64_t e = 0; e < lanes_; ++e) {
    fault_lane = e;
    if (last[e] != (terminated[e] || truncated[e])) return Put::LastMismatch;
    if (is_open_[e]) {
      if (first[e] && !last[e]) return Put::StartsInEpisode;
    } else if (!first[e]) {
      return Put::NoEpisode;
    } else if (last[e]) {
      return Put::EndsNoEpisode;
    }
    needs_final = needs_final || last[e];
    needs_obs = needs_obs || first[e] || !last[e];
  }
  fault_lane = -1;
  if (active_ != nullptr && !src[static_cast<int>(Part::Action)].written) zero_inactive(s);
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) {
    if (!src[static_cast<int>(p)].written && value_fault(p, s, nullptr)) return Put::Value;
  }
  Source& obs = src[static_cast<int>(Part::Observation)];
  if (needs_obs) {
    if (!obs.resolved && !resolve(Part::Observation, parts[static_cast<int>(Part::Observation)], count, stepped, obs)) {
      return Put::Convert;
    }
    copy_rows(Part::Observation, obs, s, i, nullptr);
    if (!obs.written && value_fault(Part::Observation, s, nullptr)) return Put::Value;
  }
  Source& fin = src[static_cast<int>(Part::Final)];
  if (needs_final) {
    PyObject* leaves = parts[static_cast<int>(Part::Final)];
    if (leaves != Py_None && PyTuple_Check(leaves) && PyTuple_GET_SIZE(leaves) == 0 &&
        !parts_[static_cast<int>(Part::Final)].empty()) {
      return Put::FinalMissing;
    }
    if (!fin.resolved && !resolve(Part::Final, leaves, count, stepped, fin)) return Put::Convert;
    copy_rows(Part::Final, fin, s, i, last);
    if (!fin.written && value_fault(Part::Final, s, last)) return Put::Value;
  }
  if (!stacks_.empty()) {
    const Put stack = stack_fault(s, first, last, needs_final);
    if (stack != Put::Ok) return stack;
  }
  // The step is good: its flags and the lanes' new states.
  const int64_t at = s * lanes_;
  for (int64_t e = 0; e < lanes_; ++e) {
    first_[at + e] = first[e];
    terminated_[at + e] = terminated[e];
    truncated_[at + e] = truncated[e] && !terminated[e];  // a step both terminated and truncated is terminated
    is_open_[e] = (is_open_[e] && !last[e]) || first[e];
    if (!first[e] && last[e]) continue;  // no new open row
    if (active_ != nullptr) {
      const BlockColumn& c = parts_[static_cast<int>(Part::Observation)][active_column_];
      std::memcpy(active_ + e * agents_, c.row(s, lanes_) + e * c.row_bytes, agents_);
    }
    for (const StackColumn& sc : stacks_) {
      const BlockColumn& c = parts_[static_cast<int>(Part::Observation)][sc.column];
      std::memcpy(sc.open + e * c.row_bytes, c.row(s, lanes_) + e * c.row_bytes, c.row_bytes);
    }
  }
  return Put::Ok;
}

}  // namespace rlflow
