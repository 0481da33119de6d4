#include "step_block.h"

#include <algorithm>
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

bool fits(PyObject* leaf, const BlockColumn& c, int64_t lanes, bool unbatched) {
  return c.exact && has_rows_layout(leaf, c.descr, lanes, c.shape, unbatched);
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

bool StepBlockCore::resolve(Part part, PyObject* leaves, int64_t rows, bool stepped, Source& src) {
  src.written = leaves == Py_None;  // converted, written and checked by the caller
  if (src.written) return true;
  const auto& cols = parts_[static_cast<int>(part)];
  fault_part = part;
  fault_column = -1;
  if (!PyTuple_Check(leaves) || PyTuple_GET_SIZE(leaves) != static_cast<Py_ssize_t>(cols.size())) return false;
  src.data.assign(cols.size(), nullptr);
  for (std::size_t j = 0; j < cols.size(); ++j) {
    PyObject* leaf = PyTuple_GET_ITEM(leaves, j);
    if (!(stepped ? fits_steps(leaf, cols[j], rows, lanes_) : fits(leaf, cols[j], lanes_, src.unbatched))) {
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
    const int64_t r = src.rows != nullptr ? src.rows[i] : i;
    const uint8_t* from = src.data[j] + r * lanes_ * c.row_bytes;
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
      if (first[e] && stack_not_repeated(obs.row(s, lanes_) + e * obs.row_bytes, sc.frames, w)) {
        fault_lane = e;
        return Put::StackStart;
      }
    }
  }
  return Put::Ok;
}

bool StepBlockCore::resolve_firsts(const Sources& sources, const bool* first, int64_t count, Firsts& out) const {
  const auto& cols = parts_[static_cast<int>(Part::Observation)];
  PyObject* leaves = sources.firsts;
  if (!PyTuple_Check(leaves) || PyTuple_GET_SIZE(leaves) != static_cast<Py_ssize_t>(cols.size())) return false;
  const int64_t k = std::count(first, first + count * lanes_, true);
  const int64_t n = sources.first_rows != nullptr ? sources.first_count : k;
  for (int64_t j = 0; sources.first_rows != nullptr && j < k; ++j) {
    if (sources.first_rows[j] < 0 || sources.first_rows[j] >= n) return false;
  }
  out.data.assign(cols.size(), nullptr);
  out.rows = sources.first_rows;
  for (std::size_t j = 0; j < cols.size(); ++j) {
    PyObject* leaf = PyTuple_GET_ITEM(leaves, j);
    if (!has_layout(leaf, cols[j].descr, {n}, cols[j].shape)) return false;
    out.data[j] = static_cast<const uint8_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(leaf)));
  }
  return true;
}

void StepBlockCore::put_firsts(int64_t s, const bool* first, Firsts& firsts) {
  if (firsts.data.empty()) return;
  const auto& cols = parts_[static_cast<int>(Part::Observation)];
  for (int64_t e = 0; e < lanes_; ++e) {
    if (!first[e]) continue;
    const int64_t r = firsts.rows != nullptr ? firsts.rows[firsts.next] : firsts.next;
    for (std::size_t j = 0; j < cols.size(); ++j) {
      const BlockColumn& c = cols[j];
      if (c.row_bytes) std::memcpy(c.row(s, lanes_) + e * c.row_bytes, firsts.data[j] + r * c.row_bytes, c.row_bytes);
    }
    ++firsts.next;
  }
}

Put StepBlockCore::start_at(const std::vector<const uint8_t*>& rows) {
  const auto& cols = parts_[static_cast<int>(Part::Observation)];
  if (lanes_ != 1 || rows.size() != cols.size()) {
    throw std::invalid_argument("start_at: expected a one-lane block and one row per observation column");
  }
  fault_part = Part::Observation;
  fault_lane = 0;
  for (std::size_t j = 0; j < cols.size(); ++j) {
    fault_column = static_cast<int>(j);
    if (row_fault(cols[j], rows[j])) return Put::Value;
  }
  for (const StackColumn& sc : stacks_) {
    fault_column = sc.column;
    if (stack_not_repeated(rows[sc.column], sc.frames, cols[sc.column].row_bytes / sc.frames)) return Put::StackStart;
  }
  fault_lane = -1;
  fault_column = -1;
  is_open_[0] = true;
  for (const StackColumn& sc : stacks_) std::memcpy(sc.open, rows[sc.column], cols[sc.column].row_bytes);
  if (active_ != nullptr) std::memcpy(active_, rows[active_column_], agents_);
  return Put::Ok;
}

void StepBlockCore::set_filled(int64_t n) {
  if (n < 0 || n > steps_) {
    throw std::out_of_range("filled: " + std::to_string(n) + " steps outside the block's 0.." + std::to_string(steps_));
  }
  filled_ = n;
}

Put StepBlockCore::put(int64_t count, bool stepped, PyObject* const parts[5], PyObject* const flags[4],
                       const Sources& sources) {
  const bool* f[4];
  for (int k = 0; k < 4; ++k) {
    f[k] = flags_of(flags[k], count, lanes_, stepped);
    if (f[k] == nullptr) {
      fault_step = filled_;
      fault_lane = -1;
      fault_column = -1;
      return Put::Flags;
    }
  }
  return put_flags(count, stepped, parts, f, sources);
}

Put StepBlockCore::put_flags(int64_t count, bool stepped, PyObject* const parts[5], const bool* const flags[4],
                             const Sources& sources) {
  const int64_t s = filled_;
  if (count < 1 || count > steps_ - s) {
    throw std::out_of_range("put: steps " + std::to_string(s) + ".." + std::to_string(s + count) +
                            " outside the block's " + std::to_string(steps_));
  }
  const int64_t source_rows = sources.source_rows > 0 ? sources.source_rows : count;
  if (sources.rows != nullptr) {
    if (!stepped) throw std::invalid_argument("put: source rows are for stepped puts");
    for (int64_t i = 0; i < count; ++i) {
      if (sources.rows[i] < 0 || sources.rows[i] >= source_rows) {
        throw std::out_of_range("put: source row " + std::to_string(sources.rows[i]) + " outside the " +
                                std::to_string(source_rows) + " rows");
      }
    }
  } else if (source_rows != count) {
    throw std::invalid_argument("put: sources of other than `count` rows need their rows");
  }
  fault_lane = -1;
  fault_column = -1;
  fault_step = s;
  Source* src = scratch_.src;
  for (int k = 0; k < 5; ++k) {
    src[k].written = false;
    src[k].rows = sources.rows;
    src[k].unbatched = sources.unbatched;
  }
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) {
    if (!resolve(p, parts[static_cast<int>(p)], source_rows, stepped, src[static_cast<int>(p)])) return Put::Convert;
  }
  const bool *first = flags[0], *last = flags[1], *terminated = flags[2], *truncated = flags[3];
  Firsts first_rows;
  if (sources.firsts != nullptr && sources.firsts != Py_None && !resolve_firsts(sources, first, count, first_rows)) {
    throw std::invalid_argument("put: firsts must be a tuple of observation leaves of the columns' dtypes and "
                                "shapes, one row per first flag (or rows of it within its rows)");
  }

  // 1. The flags, step by step: each lane's must follow from its state. The steps before the first that does
  // not (n of them) are copied and checked further.
  std::vector<uint8_t>& open = scratch_.open;
  std::vector<uint8_t>& needs_obs = scratch_.needs_obs;
  std::vector<uint8_t>& needs_final = scratch_.needs_final;
  open.assign(is_open_, is_open_ + lanes_);
  needs_obs.assign(count, 0);
  needs_final.assign(count, 0);
  int64_t n = count;
  Put flow = Put::Ok;
  int64_t flow_lane = -1;
  for (int64_t i = 0; i < count && flow == Put::Ok; ++i) {
    const int64_t at = i * lanes_;
    for (int64_t e = 0; e < lanes_; ++e) {
      const bool fi = first[at + e], la = last[at + e];
      if (la != (terminated[at + e] || truncated[at + e])) {
        flow = Put::LastMismatch;
      } else if (open[e]) {
        if (fi && !la) flow = Put::StartsInEpisode;
      } else if (!fi) {
        flow = Put::NoEpisode;
      } else if (la) {
        flow = Put::EndsNoEpisode;
      }
      if (flow != Put::Ok) {
        n = i;
        flow_lane = e;
        break;
      }
      needs_final[i] = needs_final[i] || la;
      needs_obs[i] = needs_obs[i] || fi || !la;
    }
    if (flow != Put::Ok) break;
    for (int64_t e = 0; e < lanes_; ++e) open[e] = (open[e] && !last[at + e]) || first[at + e];
  }
  const int64_t obs_at = std::find(needs_obs.begin(), needs_obs.begin() + n, 1) - needs_obs.begin();
  const int64_t final_at = std::find(needs_final.begin(), needs_final.begin() + n, 1) - needs_final.begin();
  Source& obs = src[static_cast<int>(Part::Observation)];
  Source& fin = src[static_cast<int>(Part::Final)];
  if (obs_at < n && !resolve(Part::Observation, parts[static_cast<int>(Part::Observation)], source_rows, stepped, obs)) {
    fault_step = s + obs_at;
    return Put::Convert;
  }
  if (final_at < n) {
    PyObject* leaves = parts[static_cast<int>(Part::Final)];
    if (leaves != Py_None && PyTuple_Check(leaves) && PyTuple_GET_SIZE(leaves) == 0 &&
        !parts_[static_cast<int>(Part::Final)].empty()) {
      fault_step = s + final_at;
      return Put::FinalMissing;
    }
    if (!resolve(Part::Final, leaves, source_rows, stepped, fin)) {
      fault_step = s + final_at;
      return Put::Convert;
    }
  }

  // 2. The rows of steps 0 .. n-1: what an action fills in, the observations of the steps that need them (the
  // first observations of the lanes that start an episode from `firsts`), the final observations of the lanes
  // that end one.
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) copy_steps(p, src[static_cast<int>(p)], s, n, nullptr);
  if (obs_at < n) {
    copy_steps(Part::Observation, obs, s, n, needs_obs.data());
    for (int64_t i = 0; i < n; ++i) put_firsts(s + i, first + i * lanes_, first_rows);
  }
  if (final_at < n) {
    for (int64_t i = final_at; i < n; ++i) {
      if (needs_final[i]) copy_rows(Part::Final, fin, s + i, i, last + i * lanes_);
    }
  }
  // Multi-agent rows: an agent not active at its open row takes no action there (zeroed before the checks); the
  // flags at each lane's open row follow the rows the steps open.
  const std::vector<uint8_t> active_before(active_, active_ + (active_ != nullptr ? lanes_ * agents_ : 0));
  if (active_ != nullptr) {
    const BlockColumn& flags_column = parts_[static_cast<int>(Part::Observation)][active_column_];
    for (int64_t i = 0; i < n; ++i) {
      if (!src[static_cast<int>(Part::Action)].written) zero_inactive(s + i);
      for (int64_t e = 0; e < lanes_; ++e) {
        const int64_t at = i * lanes_ + e;
        if (first[at] || !last[at]) {
          std::memcpy(active_ + e * agents_, flags_column.row(s + i, lanes_) + e * flags_column.row_bytes, agents_);
        }
      }
    }
  }

  // 3. The values, part by part: the first fault in step order (within a step, in part, column, lane order).
  Fault found{n, Put::Ok, Part::Action, -1, -1};
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) {
    if (!src[static_cast<int>(p)].written) first_value_fault(p, s, n, nullptr, nullptr, found);
  }
  if (obs_at < n) {
    if (!obs.written) {
      first_value_fault(Part::Observation, s, n, needs_obs.data(), nullptr, found);
    } else if (!first_rows.data.empty()) {  // the first observations put over rows the caller wrote
      first_value_fault(Part::Observation, s, n, needs_obs.data(), first, found);
    }
  }
  if (final_at < n && !fin.written) first_value_fault(Part::Final, s, n, needs_final.data(), last, found);

  // 4. Frame stacks, step by step up to the first value fault: each row continues its lane's open stack, and
  // an episode's first stack is its first frame repeated.
  std::vector<std::vector<uint8_t>> stacks_before;
  for (const StackColumn& sc : stacks_) {
    const int64_t bytes = lanes_ * parts_[static_cast<int>(Part::Observation)][sc.column].row_bytes;
    stacks_before.emplace_back(sc.open, sc.open + bytes);
  }
  for (int64_t i = 0; !stacks_.empty() && i < found.step; ++i) {
    const bool* fi = first + i * lanes_;
    const bool* la = last + i * lanes_;
    const Put r = stack_fault(s + i, fi, la, needs_final[i] != 0);
    if (r != Put::Ok) {
      found = Fault{i, r, fault_part, fault_column, fault_lane};
      break;
    }
    for (int64_t e = 0; e < lanes_; ++e) {
      if (!fi[e] && la[e]) continue;  // no new open row
      for (const StackColumn& sc : stacks_) {
        const BlockColumn& c = parts_[static_cast<int>(Part::Observation)][sc.column];
        std::memcpy(sc.open + e * c.row_bytes, c.row(s + i, lanes_) + e * c.row_bytes, c.row_bytes);
      }
    }
  }
  if (found.status == Put::Ok && flow != Put::Ok) found = Fault{n, flow, Part::Action, -1, flow_lane};
  if (found.status != Put::Ok) {  // nothing changes: the lanes' states as they were before step s
    if (active_ != nullptr) std::copy(active_before.begin(), active_before.end(), active_);
    for (std::size_t k = 0; k < stacks_.size(); ++k) {
      std::copy(stacks_before[k].begin(), stacks_before[k].end(), stacks_[k].open);
    }
    fault_step = s + found.step;
    fault_part = found.part;
    fault_column = found.column;
    fault_lane = found.lane;
    return found.status;
  }

  // 5. The steps are good: their flags and the lanes' new states.
  for (int64_t i = 0; i < count * lanes_; ++i) {
    first_[s * lanes_ + i] = first[i];
    terminated_[s * lanes_ + i] = terminated[i];
    truncated_[s * lanes_ + i] = truncated[i] && !terminated[i];  // a step both terminated and truncated is terminated
  }
  std::copy(open.begin(), open.end(), is_open_);
  fault_lane = -1;
  fault_column = -1;
  filled_ = s + count;
  return Put::Ok;
}

void StepBlockCore::copy_steps(Part part, const Source& src, int64_t s, int64_t n, const uint8_t* want) {
  if (src.written || n <= 0) return;
  const auto& cols = parts_[static_cast<int>(part)];
  if (src.rows == nullptr && want == nullptr) {  // the steps' rows follow each other in the source and the block
    for (std::size_t j = 0; j < cols.size(); ++j) {
      const BlockColumn& c = cols[j];
      if (c.row_bytes) std::memcpy(c.row(s, lanes_), src.data[j], n * lanes_ * c.row_bytes);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (want == nullptr || want[i]) copy_rows(part, src, s + i, i, nullptr);
  }
}

void StepBlockCore::first_value_fault(Part part, int64_t s, int64_t n, const uint8_t* want, const bool* only_lanes,
                                      Fault& found) const {
  const auto& cols = parts_[static_cast<int>(part)];
  for (std::size_t j = 0; j < cols.size(); ++j) {
    const BlockColumn& c = cols[j];
    if (c.check == ValueCheck::None || c.row_bytes == 0) continue;
    const int64_t per_row = c.row_bytes / c.itemsize;
    const int64_t end = std::min(n, found.step + 1);  // a fault after the one found changes nothing
    const bool every_row = only_lanes == nullptr && (want == nullptr || std::all_of(want, want + end, [](uint8_t w) {
                                                       return w != 0;
                                                     }));
    if (every_row && !values_fail(c.row(s, lanes_), end * lanes_ * per_row, c.kind, c.itemsize, c.check, c.low,
                                  c.high)) {
      continue;  // every value of the steps passes
    }
    for (int64_t i = 0; i < end; ++i) {
      if (want != nullptr && !want[i]) continue;
      const uint8_t* row = c.row(s + i, lanes_);
      for (int64_t e = 0; e < lanes_; ++e) {
        if (only_lanes != nullptr && !only_lanes[i * lanes_ + e]) continue;
        if (values_fail(row + e * c.row_bytes, per_row, c.kind, c.itemsize, c.check, c.low, c.high) &&
            i < found.step) {
          found = Fault{i, Put::Value, part, static_cast<int>(j), e};
        }
        if (found.step == i) break;
      }
      if (found.step <= i) break;
    }
  }
}

}  // namespace rlflow
