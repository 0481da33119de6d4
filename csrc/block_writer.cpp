#include "block_writer.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "arrays.h"

namespace rlflow {

namespace nb = nanobind;

namespace {

StoreColumn store_column(nb::handle h, int64_t rows, const char* what) {
  PyArrayObject* a = checked_array(h, -1, -1, what);
  if (PyArray_NDIM(a) < 1 || PyArray_DIM(a, 0) != rows) {
    throw std::invalid_argument(std::string(what) + ": expected a column of " + std::to_string(rows) + " rows");
  }
  StoreColumn c;
  c.array = nb::borrow(h);
  c.data = static_cast<uint8_t*>(PyArray_DATA(a));
  c.row_bytes = rows ? PyArray_NBYTES(a) / rows : 0;
  return c;
}

}  // namespace

BlockWriter::BlockWriter(const std::vector<nb::handle>& act, const std::vector<nb::handle>& obs,
                         const std::vector<int64_t>& frames, const std::vector<nb::handle>& flags, StoreRings& rings,
                         nb::handle rings_owner, nb::handle open_rows, nb::handle episode_start)
    : rings_(&rings), lanes_(rings.lanes()), capacity_(rings.capacity()) {
  const int64_t rows = lanes_ * capacity_;
  open_rows_ = array_data<int64_t>(open_rows, NPY_INT64, lanes_, "open_rows");
  episode_start_ = array_data<int64_t>(episode_start, NPY_INT64, lanes_, "episode_start");
  if (flags.size() != 4) throw std::invalid_argument("BlockWriter: expected the four flag columns");
  bool** flag_data[4] = {&terminated_, &truncated_, &first_, &last_};
  for (int i = 0; i < 4; ++i) {
    *flag_data[i] = array_data<bool>(flags[i], NPY_BOOL, rows, "flags");
    owned_.push_back(nb::borrow(flags[i]));
  }
  for (nb::handle h : {rings_owner, open_rows, episode_start}) {
    owned_.push_back(nb::borrow(h));
  }
  for (nb::handle h : act) act_.push_back(store_column(h, rows, "act"));
  if (frames.size() != obs.size()) throw std::invalid_argument("BlockWriter: expected frames per observation column");
  for (std::size_t j = 0; j < obs.size(); ++j) {
    obs_.push_back(store_column(obs[j], rows, "obs"));
    if (frames[j] < 1) throw std::invalid_argument("BlockWriter: frames must be >= 1");
    obs_.back().frames = frames[j];
  }
}

void BlockWriter::check_block(const StepBlockCore& block, int64_t a, int64_t steps) const {
  if (a < 0 || steps < 0 || a > block.filled() || steps > block.filled() - a) {
    throw std::out_of_range("write: steps " + std::to_string(a) + ".." + std::to_string(a + steps) +
                            " outside the block's " + std::to_string(block.filled()) + " steps put");
  }
  std::vector<const BlockColumn*> act;
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) {
    for (const BlockColumn& c : block.columns(p)) act.push_back(&c);
  }
  const auto& obs = block.columns(Part::Observation);
  bool fits = act.size() == act_.size() && obs.size() == obs_.size() && block.lane_ids() != nullptr;
  for (std::size_t j = 0; fits && j < act.size(); ++j) fits = act[j]->row_bytes == act_[j].row_bytes;
  for (std::size_t j = 0; fits && j < obs.size(); ++j) fits = obs[j].row_bytes == obs_[j].row_bytes * obs_[j].frames;
  if (!fits) throw std::invalid_argument("write: the block's columns are not the store's");
  std::vector<char> seen(lanes_, 0);
  for (int64_t e = 0; e < block.lanes(); ++e) {
    const int64_t lane = block.lane_ids()[e];
    if (lane < 0 || lane >= lanes_ || seen[lane]) {
      throw std::out_of_range("write: block lane " + std::to_string(e) + " is store lane " + std::to_string(lane) +
                              ": expected distinct lanes in [0, " + std::to_string(lanes_) + ")");
    }
    seen[lane] = 1;
  }
}

PlanFault BlockWriter::plan(const StepBlockCore& block, int64_t a, int64_t steps, nb::handle codes_h,
                            nb::handle new_rows_h, nb::handle ranges_h) {
  check_block(block, a, steps);
  const int64_t E = block.lanes();
  auto* codes = array_at_least<int8_t>(codes_h, NPY_INT8, steps * E, "codes");
  auto* new_rows = array_at_least<int64_t>(new_rows_h, NPY_INT64, E, "new_rows");
  auto* ranges = array_at_least<int64_t>(ranges_h, NPY_INT64, 3 * E, "ranges");
  const std::vector<int64_t> lane_ids(block.lane_ids(), block.lane_ids() + E);  // read once: outputs may alias them
  nb::gil_scoped_release release;
  fault_step = fault_lane = fault_column = -1;
  overwritten_lanes = 0;
  const bool* first = block.first();
  const bool* terminated = block.terminated();
  const bool* truncated = block.truncated();
  for (int64_t e = 0; e < E; ++e) {
    bool is_open = open_rows_[lane_ids[e]] >= 0;
    int64_t rows = 0;
    for (int64_t k = 0; k < steps; ++k) {
      const int64_t at = (a + k) * E + e;
      const bool f = first[at], l = terminated[at] || truncated[at];
      StepKind kind;
      if (is_open && f && l) {
        kind = StepKind::EndStart;
        rows += 2;
      } else if (is_open && !f) {
        kind = l ? StepKind::End : StepKind::Continue;
        rows += 1;
        is_open = !l;
      } else if (!is_open && f && !l) {
        kind = StepKind::Start;
        rows += 1;
        is_open = true;
      } else {
        fault_step = a + k;
        fault_lane = e;
        return PlanFault::Flow;
      }
      codes[k * E + e] = static_cast<int8_t>(kind);
    }
    new_rows[e] = rows;
  }
  for (const StoreColumn& c : obs_) {
    if (c.frames > 1) {
      const PlanFault fault = stack_fault(block, lane_ids, a, steps, codes);
      if (fault != PlanFault::Ok) return fault;
      break;
    }
  }
  // The rows the write overwrites, and with frame stacks the rows after them whose stacks read them.
  overwritten_lanes = rings_->overwritten(lane_ids.data(), new_rows, E, ranges);
  return PlanFault::Ok;
}

PlanFault BlockWriter::stack_fault(const StepBlockCore& block, const std::vector<int64_t>& lane_ids, int64_t a,
                                   int64_t steps, const int8_t* codes) {
  const int64_t E = block.lanes();
  const auto& bobs = block.columns(Part::Observation);
  const auto& bfin = block.columns(Part::Final);
  for (std::size_t j = 0; j < obs_.size(); ++j) {
    const StoreColumn& col = obs_[j];
    const int64_t k = col.frames, w = col.row_bytes;
    if (k < 2) continue;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t lane = lane_ids[e];
      int64_t prev = -1;  // the block step whose observation is the lane's open row (-1: the store's open row)
      for (int64_t kk = 0; kk < steps; ++kk) {
        const int64_t s = a + kk;
        const auto kind = static_cast<StepKind>(codes[kk * E + e]);
        const int64_t bw = bobs[j].row_bytes;
        if (kind != StepKind::Start) {
          const BlockColumn& src = kind == StepKind::Continue ? bobs[j] : bfin[j];
          const uint8_t* row = src.row(s, E) + e * bw;
          bool bad = false;
          if (prev >= 0) {
            bad = std::memcmp(row, bobs[j].row(prev, E) + e * bw + w, (k - 1) * w) != 0;
          } else {
            const int64_t r = open_rows_[lane];
            const int64_t es = rings_->episode_step(lane, r);
            for (int64_t f = 1; f < k && !bad; ++f) {  // frame f of the open row's stack is frame f - 1 of the new
              const int64_t back = std::min(k - 1 - f, es);
              const uint8_t* frame = col.data + (lane * capacity_ + ring_pos(r - back, capacity_)) * w;
              bad = std::memcmp(row + (f - 1) * w, frame, w) != 0;
            }
          }
          if (bad) {
            fault_lane = e;
            fault_step = s;
            fault_column = static_cast<int64_t>(j);
            return PlanFault::StackBreak;
          }
        }
        if (kind == StepKind::Start || kind == StepKind::EndStart) {
          if (stack_not_repeated(bobs[j].row(s, E) + e * bw, k, w)) {
            fault_lane = e;
            fault_step = s;
            fault_column = static_cast<int64_t>(j);
            return PlanFault::StackStart;
          }
        }
        prev = s;
      }
    }
  }
  return PlanFault::Ok;
}

namespace {

// Copy `count` rows of `bytes` bytes from `src` (rows `stride` bytes apart) to the ring rows first .. first +
// count - 1 of a lane of `dst` (rows `dst_bytes` apart; the lane's rows start at row `base`, its ring holds
// `capacity`), in one copy per stretch that does not wrap when both sides' rows follow each other.
void copy_to_ring(uint8_t* dst, int64_t dst_bytes, int64_t base, int64_t capacity, int64_t first, const uint8_t* src,
                  int64_t stride, int64_t bytes, int64_t count) {
  if (bytes == 0) return;
  for (int64_t done = 0; done < count;) {
    const int64_t pos = ring_pos(first + done, capacity);
    const int64_t n = std::min(count - done, capacity - pos);
    uint8_t* d = dst + (base + pos) * dst_bytes;
    const uint8_t* from = src + done * stride;
    if (stride == bytes && dst_bytes == bytes) {
      std::memcpy(d, from, n * bytes);
    } else {
      for (int64_t r = 0; r < n; ++r) std::memcpy(d + r * dst_bytes, from + r * stride, bytes);
    }
    done += n;
  }
}

}  // namespace

void BlockWriter::write(const StepBlockCore& block, int64_t a, int64_t steps, nb::handle codes_h, nb::handle rows_h) {
  check_block(block, a, steps);
  const int64_t E = block.lanes();
  const auto* codes = array_at_least<int8_t>(codes_h, NPY_INT8, steps * E, "codes", true);
  auto* rows = array_at_least<int64_t>(rows_h, NPY_INT64, steps * 3 * E, "rows");
  for (int64_t i = 0; i < steps * E; ++i) {
    if (codes[i] < 0 || codes[i] > static_cast<int8_t>(StepKind::Start)) {
      throw std::invalid_argument("write: codes must be StepKind values (from plan)");
    }
  }
  const std::vector<int64_t> lane_ids(block.lane_ids(), block.lane_ids() + E);  // read once: rows may alias them
  nb::gil_scoped_release release;
  std::vector<const BlockColumn*> bact;
  for (Part p : {Part::Action, Part::Reward, Part::Extras}) {
    for (const BlockColumn& c : block.columns(p)) bact.push_back(&c);
  }
  const auto& bobs = block.columns(Part::Observation);
  const auto& bfin = block.columns(Part::Final);
  // A block row's trailing bytes into a store row: all of them, or a stacked column's newest frame.
  auto copy_obs = [&](const std::vector<BlockColumn>& from, int64_t s, int64_t e, int64_t i) {
    for (std::size_t j = 0; j < obs_.size(); ++j) {
      const StoreColumn& c = obs_[j];
      if (c.row_bytes == 0) continue;
      const int64_t bw = from[j].row_bytes;
      std::memcpy(c.data + i * c.row_bytes, from[j].row(s, E) + e * bw + bw - c.row_bytes, c.row_bytes);
    }
  };
  const bool* terminated = block.terminated();
  const bool* truncated = block.truncated();
  // A lane's open row (store row i) gets the action, reward, extras and flags of block step s.
  auto put_action = [&](int64_t s, int64_t e, int64_t i) {
    for (std::size_t j = 0; j < act_.size(); ++j) {
      if (act_[j].row_bytes == 0) continue;
      std::memcpy(act_[j].data + i * act_[j].row_bytes, bact[j]->row(s, E) + e * bact[j]->row_bytes,
                  act_[j].row_bytes);
    }
    terminated_[i] = terminated[s * E + e];
    truncated_[i] = truncated[s * E + e];
  };
  for (int64_t e = 0; e < E; ++e) {
    const int64_t lane = lane_ids[e];
    const int64_t base = lane * capacity_;
    for (int64_t k = 0; k < steps; ++k) {
      const int64_t s = a + k, at = s * E + e;
      const auto kind = static_cast<StepKind>(codes[k * E + e]);
      if (kind == StepKind::Continue) {  // a run of steps that go on: their rows follow each other in the ring
        int64_t run = 1;
        while (k + run < steps && static_cast<StepKind>(codes[(k + run) * E + e]) == StepKind::Continue) ++run;
        const int64_t open = open_rows_[lane], first_new = rings_->written(lane);
        const int64_t episode = episode_start_[lane];
        // The open row, then each new row but the last, gets its step's action, reward, extras and flags.
        put_action(s, e, base + ring_pos(open, capacity_));
        if (run > 1) {
          for (std::size_t j = 0; j < act_.size(); ++j) {
            const StoreColumn& c = act_[j];
            const int64_t bw = bact[j]->row_bytes;
            copy_to_ring(c.data, c.row_bytes, base, capacity_, first_new, bact[j]->row(s + 1, E) + e * bw, E * bw,
                         c.row_bytes, run - 1);
          }
          const auto* term_run = reinterpret_cast<const uint8_t*>(terminated + at + E);
          const auto* trunc_run = reinterpret_cast<const uint8_t*>(truncated + at + E);
          copy_to_ring(reinterpret_cast<uint8_t*>(terminated_), 1, base, capacity_, first_new, term_run, E, 1, run - 1);
          copy_to_ring(reinterpret_cast<uint8_t*>(truncated_), 1, base, capacity_, first_new, trunc_run, E, 1, run - 1);
        }
        // Each new row gets its step's observation (a stacked column's newest frame) and the episode's marks.
        for (std::size_t j = 0; j < obs_.size(); ++j) {
          const StoreColumn& c = obs_[j];
          const int64_t bw = bobs[j].row_bytes;
          copy_to_ring(c.data, c.row_bytes, base, capacity_, first_new, bobs[j].row(s, E) + e * bw + bw - c.row_bytes,
                       E * bw, c.row_bytes, run);
        }
        for (int64_t r = 0; r < run; ++r) {
          const int64_t new_row = rings_->mark(lane, false);
          const int64_t at_row = base + ring_pos(new_row, capacity_);
          first_[at_row] = last_[at_row] = false;
          rows[((k + r) * 3 + 0) * E + e] = -1;
          rows[((k + r) * 3 + 1) * E + e] = episode;
          rows[((k + r) * 3 + 2) * E + e] = new_row;
        }
        open_rows_[lane] = first_new + run - 1;
        k += run - 1;
        continue;
      }
      int64_t final_row = -1, new_row = -1;
      const int64_t episode = kind != StepKind::Start ? episode_start_[lane] : -1;
      if (kind != StepKind::Start) put_action(s, e, base + ring_pos(open_rows_[lane], capacity_));
      if (kind == StepKind::End || kind == StepKind::EndStart) {  // the episode's final row
        final_row = rings_->mark(lane, false);
        const int64_t i = base + ring_pos(final_row, capacity_);
        copy_obs(bfin, s, e, i);
        for (const StoreColumn& c : act_) std::memset(c.data + i * c.row_bytes, 0, c.row_bytes);
        terminated_[i] = truncated_[i] = first_[i] = false;
        last_[i] = true;
        open_rows_[lane] = -1;
      }
      if (kind != StepKind::End) {  // a new open row, which starts an episode (steps that go on are runs, above)
        new_row = rings_->mark(lane, true);
        const int64_t i = base + ring_pos(new_row, capacity_);
        copy_obs(bobs, s, e, i);
        first_[i] = true;
        last_[i] = false;
        open_rows_[lane] = new_row;
        episode_start_[lane] = new_row;
      }
      rows[(k * 3 + 0) * E + e] = final_row;
      rows[(k * 3 + 1) * E + e] = episode;
      rows[(k * 3 + 2) * E + e] = new_row;
    }
  }
}

NStepItems::NStepItems(nb::handle rewards, int64_t capacity, nb::handle powers) {
  PyArrayObject* r = checked_array(rewards, -1, -1, "rewards", true);
  if (PyArray_NDIM(r) < 1 || capacity < 1 || PyArray_DIM(r, 0) % capacity != 0) {
    throw std::invalid_argument("rewards: expected a column of lanes * capacity rows");
  }
  kind_ = PyArray_DESCR(r)->kind;
  itemsize_ = PyArray_ITEMSIZE(r);
  if (!((kind_ == 'f' && (itemsize_ == 4 || itemsize_ == 8)) || kind_ == 'i' || kind_ == 'u' || kind_ == 'b') ||
      !PyArray_ISNOTSWAPPED(r)) {
    throw std::invalid_argument("rewards: expected native integers, bools, float32 or float64");
  }
  rows_ = PyArray_DIM(r, 0);
  reward_values_ = rows_ ? PyArray_SIZE(r) / rows_ : 0;
  rewards_ = static_cast<const uint8_t*>(PyArray_DATA(r));
  rewards_array_ = nb::borrow(rewards);
  capacity_ = capacity;
  PyArrayObject* p = checked_array(powers, NPY_FLOAT64, -1, "powers", true);
  if (!PyArray_ISNOTSWAPPED(p)) throw std::invalid_argument("powers: expected native float64");
  n_ = PyArray_SIZE(p) - 1;
  if (n_ < 1) throw std::invalid_argument("powers: expected g^0 .. g^n, n >= 1");
  powers_ = static_cast<const double*>(PyArray_DATA(p));
  powers_array_ = nb::borrow(powers);
}

void NStepItems::set_out(nb::handle lanes, nb::handle starts, nb::handle lengths, nb::handle returns,
                         nb::handle discounts) {
  const int64_t size = PyArray_Check(lanes.ptr()) ? PyArray_SIZE(reinterpret_cast<PyArrayObject*>(lanes.ptr())) : 0;
  lanes_ = array_data<int64_t>(lanes, NPY_INT64, size, "lanes");
  starts_ = array_data<int64_t>(starts, NPY_INT64, size, "starts");
  lengths_ = array_data<int64_t>(lengths, NPY_INT64, size, "lengths");
  returns_ = array_data<float>(returns, NPY_FLOAT32, size * reward_values_, "returns");
  discounts_ = array_data<float>(discounts, NPY_FLOAT32, size, "discounts");
  nb::handle arrays[5] = {lanes, starts, lengths, returns, discounts};
  for (int i = 0; i < 5; ++i) out_[i] = nb::borrow(arrays[i]);
  out_size_ = size;
}

double NStepItems::reward(int64_t row, int64_t c) const {
  const uint8_t* p = rewards_ + (row * reward_values_ + c) * itemsize_;
  auto read = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return static_cast<double>(v);
  };
  if (kind_ == 'f') return itemsize_ == 4 ? read(float{}) : read(double{});
  if (kind_ == 'b') return read(bool{});
  const bool u = kind_ == 'u';
  switch (itemsize_) {
    case 1: return u ? read(uint8_t{}) : read(int8_t{});
    case 2: return u ? read(uint16_t{}) : read(int16_t{});
    case 4: return u ? read(uint32_t{}) : read(int32_t{});
    default: return u ? read(uint64_t{}) : read(int64_t{});
  }
}

void NStepItems::item(int64_t m, int64_t lane, int64_t start, int64_t k, double discount) {
  lanes_[m] = lane;
  starts_[m] = start;
  lengths_[m] = k + 1;
  discounts_[m] = static_cast<float>(discount);
  const int64_t base = lane * capacity_;
  for (int64_t c = 0; c < reward_values_; ++c) {
    double acc = 0.0;
    for (int64_t j = 0; j < k; ++j) acc += powers_[j] * reward(base + ring_pos(start + j, capacity_), c);
    returns_[m * reward_values_ + c] = static_cast<float>(acc);
  }
}

int64_t NStepItems::make(int64_t a, int64_t steps, nb::handle codes_h, nb::handle rows_h, nb::handle terminated_h,
                         nb::handle lanes_h, bool final_was_open) {
  const int64_t E = array_dim(lanes_h, 0);
  const auto lanes = array_in<int64_t>(lanes_h, NPY_INT64, E, "lanes");
  const auto* codes = array_at_least<int8_t>(codes_h, NPY_INT8, steps * E, "codes", true);
  const auto* rows = array_at_least<int64_t>(rows_h, NPY_INT64, steps * 3 * E, "rows", true);
  const int64_t given = array_dim(terminated_h, 0);  // steps of the block's flags [T, E]
  if (a < 0 || steps < 0 || a > given || steps > given - a) {
    throw std::out_of_range("nstep items: steps a .. a + steps - 1 outside the block's " + std::to_string(given));
  }
  const auto* terminated = array_at_least<bool>(terminated_h, NPY_BOOL, (a + steps) * E, "terminated", true);
  if (n_ * E * steps > out_size_) {
    throw std::invalid_argument("nstep items: the outputs hold " + std::to_string(out_size_) + " items, expected " +
                                std::to_string(n_ * E * steps));
  }
  const int64_t lane_rows = rows_ / capacity_;
  for (int64_t e = 0; e < E; ++e) {
    if (lanes[e] < 0 || lanes[e] >= lane_rows) throw std::out_of_range("nstep items: a lane outside the store");
  }
  nb::gil_scoped_release release;
  const int64_t n = n_;
  int64_t m = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const int8_t* code = codes + s * E;
    const int64_t* final_rows = rows + (s * 3 + 0) * E;
    const int64_t* episode = rows + (s * 3 + 1) * E;
    const int64_t* new_rows = rows + (s * 3 + 2) * E;
    for (int64_t e = 0; e < E; ++e) {  // lanes that go on: the window of n actions ending at the new open row
      if (code[e] != static_cast<int8_t>(StepKind::Continue)) continue;
      const int64_t start = new_rows[e] - n;
      if (start >= episode[e]) item(m++, lanes[e], start, n, powers_[n]);
    }
    for (int64_t e = 0; e < E; ++e) {  // ended lanes: every start within n rows of the final row
      if (code[e] != static_cast<int8_t>(StepKind::End) && code[e] != static_cast<int8_t>(StepKind::EndStart)) continue;
      const int64_t final_row = final_rows[e];
      for (int64_t start = std::max(episode[e], final_row - n + (final_was_open ? 1 : 0)); start < final_row; ++start) {
        const int64_t k = std::min(n, final_row - start);
        const double discount = terminated[(a + s) * E + e] && start + k == final_row ? 0.0 : powers_[k];
        item(m++, lanes[e], start, k, discount);
      }
    }
  }
  return m;
}

}  // namespace rlflow
