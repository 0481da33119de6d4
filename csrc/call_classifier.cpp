#include "call_classifier.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "arrays.h"
#include "step_block.h"

namespace rlflow {

namespace nb = nanobind;

namespace {

// One call of an env judged: a NEXT_STEP reset step (right after an episode end, obs is that end's next_obs,
// reward zero, neither flag), an episode that starts at obs before the transition (obs is not the next_obs of
// the episode in progress), and the env's state after the call.
struct Judged {
  bool reset, starts;
  CallState next;
};

Judged judge(CallState state, bool same, bool last, bool zero) {
  const bool reset = state == CallState::Ended && same && !last && zero;
  return {reset, !(state == CallState::InEpisode && same) && !reset, last ? CallState::Ended : CallState::InEpisode};
}

// A call's rewards as the judgement reads them: the bytes of each row of an array [rows, ...], zero where every
// byte is, a float's (or a complex number's parts') sign bit aside (-0.0 is zero); a long double is read as
// one. Anything that is not such an array counts as zero (the adder names it).
struct Rewards {
  const uint8_t* data = nullptr;
  int64_t row_bytes = 0, itemsize = 1, sign_period = 0;
  bool long_double = false;

  // False where the reward is an array to convert first (strided, byte-swapped, an unreadable long double).
  bool read(PyObject* reward, int64_t rows) {
    if (!PyArray_Check(reward)) return true;
    auto* r = reinterpret_cast<PyArrayObject*>(reward);
    if (PyArray_NDIM(r) < 1 || PyArray_DIM(r, 0) != rows || !(PyArray_ISNUMBER(r) || PyArray_ISBOOL(r))) return true;
    if (!PyArray_IS_C_CONTIGUOUS(r) || !PyArray_ISNOTSWAPPED(r)) return false;
    data = static_cast<const uint8_t*>(PyArray_DATA(r));
    row_bytes = rows ? PyArray_NBYTES(r) / rows : 0;
    itemsize = PyArray_ITEMSIZE(r);
    const bool is_float = PyArray_ISFLOAT(r), is_complex = PyArray_ISCOMPLEX(r);
    const int64_t part = is_complex ? itemsize / 2 : itemsize;
    long_double = (is_float || is_complex) && part != 2 && part != 4 && part != 8;
    if (long_double && (is_complex || static_cast<int64_t>(sizeof(long double)) != itemsize)) return false;
    sign_period = is_float || is_complex ? part : 0;
    return true;
  }

  bool zero(int64_t row) const {
    bool z = true;
    for (int64_t b = 0; data != nullptr && z && b < row_bytes; b += long_double ? itemsize : 1) {
      const uint8_t* at = data + row * row_bytes + b;
      if (long_double) {
        long double v;
        std::memcpy(&v, at, sizeof(v));
        z = v == 0;
      } else {
        const uint8_t mask = sign_period && (b + 1) % sign_period == 0 ? 0x7F : 0xFF;  // little-endian sign bit
        z = (*at & mask) == 0;
      }
    }
    return z;
  }
};

}  // namespace

CallClassifier::CallClassifier(const std::vector<nb::handle>& last, nb::handle state, nb::handle was,
                               nb::handle calls) {
  PyArrayObject* s = checked_array(state, NPY_INT8, -1, "state");
  envs_ = PyArray_SIZE(s);
  state_ = static_cast<int8_t*>(PyArray_DATA(s));
  was_ = static_cast<int8_t*>(PyArray_DATA(checked_array(was, NPY_INT8, envs_, "was")));
  calls_ = static_cast<bool*>(PyArray_DATA(checked_array(calls, NPY_BOOL, 5 * envs_, "calls")));
  nb::handle arrays[3] = {state, was, calls};
  for (int i = 0; i < 3; ++i) owned_[i] = nb::borrow(arrays[i]);
  for (nb::handle h : last) {
    PyArrayObject* a = checked_array(h, -1, -1, "last");
    if (PyArray_NDIM(a) < 1 || PyArray_DIM(a, 0) != envs_) {
      throw std::invalid_argument("last: expected arrays [" + std::to_string(envs_) + ", ...], one row per env");
    }
    LastColumn c;
    c.array = nb::borrow(h);
    c.data = static_cast<uint8_t*>(PyArray_DATA(a));
    c.descr = PyArray_DESCR(a);
    c.row_bytes = PyArray_ITEMSIZE(a);
    for (int i = 1; i < PyArray_NDIM(a); ++i) {
      c.shape.push_back(PyArray_DIM(a, i));
      c.row_bytes *= PyArray_DIM(a, i);
    }
    last_.push_back(std::move(c));
  }
}

bool CallClassifier::fits(PyObject* leaf, const LastColumn& c) const {
  return has_rows_layout(leaf, c.descr, envs_, c.shape, true);  // one env's call may leave the env axis out
}

int CallClassifier::classify(PyObject* obs, PyObject* terminated, PyObject* truncated, PyObject* reward) {
  const bool* term = one_flag_each(terminated, envs_);
  const bool* trunc = one_flag_each(truncated, envs_);
  if (term == nullptr || trunc == nullptr) {
    throw std::invalid_argument("classify: terminated and truncated must be bool arrays of one flag per env");
  }
  const bool compare = obs != Py_None;
  if (compare) {
    if (!PyTuple_Check(obs) || PyTuple_GET_SIZE(obs) != static_cast<Py_ssize_t>(last_.size())) return Convert;
    for (std::size_t j = 0; j < last_.size(); ++j) {
      if (!fits(PyTuple_GET_ITEM(obs, j), last_[j])) return Convert;
    }
  }
  Rewards rewards;
  if (!rewards.read(reward, envs_)) return Convert;
  int bits = 0;
  bool* row[5];
  for (int k = 0; k < 5; ++k) row[k] = calls_ + k * envs_;
  for (int64_t e = 0; e < envs_; ++e) {
    const bool t = term[e], u = trunc[e], last = t || u;  // both: the block filler keeps it terminated
    const bool zero = rewards.zero(e);
    const auto state = static_cast<CallState>(state_[e]);
    bool same = compare && state != CallState::NoEpisodeYet;
    for (std::size_t j = 0; same && j < last_.size(); ++j) {
      const LastColumn& c = last_[j];
      const auto* leaf = static_cast<const uint8_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(
          PyTuple_GET_ITEM(obs, j))));
      same = c.row_bytes == 0 || std::memcmp(leaf + e * c.row_bytes, c.data + e * c.row_bytes, c.row_bytes) == 0;
    }
    const Judged j = judge(state, same, last, zero);
    const bool reset = j.reset, starts = j.starts;
    row[static_cast<int>(CallRow::Terminated)][e] = t;
    row[static_cast<int>(CallRow::Truncated)][e] = u;
    row[static_cast<int>(CallRow::Last)][e] = last;
    row[static_cast<int>(CallRow::Reset)][e] = reset;
    row[static_cast<int>(CallRow::Starts)][e] = starts;
    if (starts) bits |= AnyStart;
    if (last) bits |= AnyLast;
    was_[e] = state_[e];
    state_[e] = static_cast<int8_t>(j.next);
  }
  return bits;
}

bool CallClassifier::remember(PyObject* next_obs) {
  if (!PyTuple_Check(next_obs) || PyTuple_GET_SIZE(next_obs) != static_cast<Py_ssize_t>(last_.size())) return false;
  for (std::size_t j = 0; j < last_.size(); ++j) {
    if (!fits(PyTuple_GET_ITEM(next_obs, j), last_[j])) return false;
  }
  for (std::size_t j = 0; j < last_.size(); ++j) {
    const LastColumn& c = last_[j];
    if (c.row_bytes == 0) continue;
    std::memcpy(c.data, PyArray_DATA(reinterpret_cast<PyArrayObject*>(PyTuple_GET_ITEM(next_obs, j))),
                envs_ * c.row_bytes);
  }
  return true;
}

bool CallClassifier::fits_steps(PyObject* leaves, int64_t t) const {
  if (!PyTuple_Check(leaves) || PyTuple_GET_SIZE(leaves) != static_cast<Py_ssize_t>(last_.size())) return false;
  for (std::size_t j = 0; j < last_.size(); ++j) {
    if (!has_layout(PyTuple_GET_ITEM(leaves, j), last_[j].descr, {t}, last_[j].shape)) return false;
  }
  return true;
}

bool CallClassifier::judge_steps(int64_t env, PyObject* obs, PyObject* next_obs, PyObject* reward,
                                 const bool* terminated, const bool* truncated, int64_t t, bool* reset,
                                 bool* starts) const {
  if (!fits_steps(obs, t) || !fits_steps(next_obs, t)) return false;
  Rewards rewards;
  if (!rewards.read(reward, t)) return false;
  auto state = static_cast<CallState>(state_[env]);
  for (int64_t i = 0; i < t; ++i) {
    bool same = state != CallState::NoEpisodeYet;
    for (std::size_t j = 0; same && j < last_.size(); ++j) {  // obs[i] against the next_obs before it
      const LastColumn& c = last_[j];
      const auto* o = static_cast<const uint8_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(PyTuple_GET_ITEM(obs, j))));
      const uint8_t* before = i == 0 ? c.data + env * c.row_bytes
                                     : static_cast<const uint8_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(
                                           PyTuple_GET_ITEM(next_obs, j)))) + (i - 1) * c.row_bytes;
      same = c.row_bytes == 0 || std::memcmp(o + i * c.row_bytes, before, c.row_bytes) == 0;
    }
    const Judged jd = judge(state, same, terminated[i] || truncated[i], rewards.zero(i));
    reset[i] = jd.reset;
    starts[i] = jd.starts;
    state = jd.next;
  }
  return true;
}

int CallClassifier::add(StepBlockCore& block, PyObject* obs, PyObject* terminated, PyObject* truncated,
                        const CallStep& step) {
  nb::object reward = nb::steal(PyTuple_Pack(1, step.reward));  // made first: nothing can fail after classify
  nb::object no_final = nb::steal(PyTuple_New(0));
  if (!reward.is_valid() || !no_final.is_valid()) throw nb::python_error();
  int bits = classify(obs, terminated, truncated, step.reward);
  if (bits == Convert || (bits & AnyStart)) return bits;
  PyObject* const parts[5] = {step.action, reward.ptr(), step.extras, step.next_obs,
                              (bits & AnyLast) ? step.next_obs : no_final.ptr()};
  Put status;
  try {
    StepBlockCore::Sources sources;
    sources.unbatched = true;  // one env's call may leave the env axis out
    status = block.put(1, false, parts, step.flag_rows, sources);
  } catch (...) {
    std::memcpy(state_, was_, envs_);
    throw;
  }
  if (status != Put::Ok) return bits;
  bits |= StepPut;
  if (remember(step.next_obs)) bits |= NextKept;
  return bits;
}

StepsPut CallClassifier::extend(StepBlockCore& block, int64_t env, const StepsCall& call) const {
  StepsPut out;
  const int64_t t = call.t;
  std::unique_ptr<bool[]> judged(new bool[2 * t]);
  bool* reset = judged.get();
  bool* starts = reset + t;
  if (!judge_steps(env, call.obs, call.next_obs, call.reward, call.terminated, call.truncated, t, reset, starts)) {
    return out;
  }
  out.judged = true;
  out.reset.assign(reset, reset + t);
  std::vector<int64_t> rows;  // the call's steps that are transitions (reset steps left out)
  rows.reserve(t);
  for (int64_t i = 0; i < t; ++i) {
    if (!reset[i]) rows.push_back(i);
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  if (m == 0) return out;
  // An episode starts at obs[i] when the classifier judged so, or right after a reset step.
  auto begins = [&](int64_t i) { return starts[i] || (i > 0 && reset[i - 1]); };
  std::unique_ptr<bool[]> flags(new bool[4 * m]);
  bool* first = flags.get();
  bool* last = first + m;
  bool* terminated = last + m;
  bool* truncated = terminated + m;
  std::vector<int64_t> first_rows;  // each restart's observation: the obs of the step that begins the episode
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = rows[j];
    const bool restarts = j + 1 < m && begins(rows[j + 1]);
    // A step before a jump that did not end its episode ends it truncated; a step both terminated and
    // truncated is terminated (the block filler keeps it so).
    first[j] = restarts;
    last[j] = call.terminated[i] || call.truncated[i] || restarts;
    terminated[j] = call.terminated[i];
    truncated[j] = last[j] && !call.terminated[i];
    if (restarts) first_rows.push_back(rows[j + 1]);
  }
  out.first_step = rows[0];
  out.last_step = rows[m - 1];
  out.ended = last[m - 1];
  out.starts = begins(rows[0]);
  if (out.starts) {  // the block's steps follow from obs[first_step], where an episode starts before them
    std::vector<const uint8_t*> start(last_.size());
    for (std::size_t j = 0; j < last_.size(); ++j) {
      start[j] = static_cast<const uint8_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(PyTuple_GET_ITEM(call.obs, j)))) +
                 rows[0] * last_[j].row_bytes;
    }
    out.status = block.start_at(start);
    if (out.status != Put::Ok) {
      out.fault_step = rows[0];
      out.fault_first = true;
      return out;
    }
  }
  nb::object reward = nb::steal(PyTuple_Pack(1, call.reward));
  if (!reward.is_valid()) throw nb::python_error();
  PyObject* const parts[5] = {call.action, reward.ptr(), call.extras, call.next_obs, call.next_obs};
  const bool* const f[4] = {first, last, terminated, truncated};
  StepBlockCore::Sources sources;
  sources.rows = rows.data();
  sources.source_rows = t;
  if (!first_rows.empty()) {
    sources.firsts = call.obs;
    sources.first_rows = first_rows.data();
    sources.first_count = t;
  }
  out.status = block.put_flags(m, true, parts, f, sources);
  if (out.status == Put::Ok) {
    out.steps = m;
  } else if (out.status == Put::StackStart ||
             (out.status == Put::Value && block.fault_part == Part::Observation && first[block.fault_step])) {
    out.fault_step = rows[block.fault_step + 1];  // the observation that starts the next episode there
    out.fault_first = true;
  } else {
    out.fault_step = rows[block.fault_step];
  }
  return out;
}

}  // namespace rlflow
