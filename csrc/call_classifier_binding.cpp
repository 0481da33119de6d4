#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <tuple>

#include "arrays.h"

#include "bind.h"
#include "call_classifier.h"
#include "step_block.h"

namespace rlflow {

void bind_call_classifier(nb::module_& m) {
  nb::enum_<CallState>(m, "CallState", "What an env's last ReplayBuffer.add call left.")
      .value("NO_EPISODE_YET", CallState::NoEpisodeYet)
      .value("IN_EPISODE", CallState::InEpisode)
      .value("ENDED", CallState::Ended);
  nb::enum_<CallRow>(m, "CallRow", "The rows of the call classifier's output.")
      .value("TERMINATED", CallRow::Terminated)
      .value("TRUNCATED", CallRow::Truncated)
      .value("LAST", CallRow::Last)
      .value("RESET", CallRow::Reset)
      .value("STARTS", CallRow::Starts);
  m.attr("CALL_ANY_START") = static_cast<int>(AnyStart);
  m.attr("CALL_ANY_LAST") = static_cast<int>(AnyLast);
  m.attr("CALL_CONVERT") = static_cast<int>(Convert);
  m.attr("CALL_PUT") = static_cast<int>(StepPut);
  m.attr("CALL_KEPT") = static_cast<int>(NextKept);
  nb::class_<CallClassifier>(m, "CallClassifier", "ReplayBuffer.add's call classifier (one call a step).")
      .def(nb::init<const std::vector<nb::handle>&, nb::handle, nb::handle, nb::handle>(), nb::kw_only(),
           nb::arg("last"), nb::arg("state"), nb::arg("was"), nb::arg("calls"))
      .def(
          "classify",
          [](CallClassifier& self, nb::handle obs, nb::handle terminated, nb::handle truncated, nb::handle reward) {
            return self.classify(obs.ptr(), terminated.ptr(), truncated.ptr(), reward.ptr());
          },
          nb::arg("obs").none(), nb::arg("terminated"), nb::arg("truncated"), nb::arg("reward").none(),
          "Sort each env's call and advance the states; the CALL_ANY_* bits, or CALL_CONVERT.")
      .def(
          "remember", [](CallClassifier& self, nb::handle next_obs) { return self.remember(next_obs.ptr()); },
          nb::arg("next_obs").none(), "Keep next_obs as each env's last (False: a leaf to convert, nothing kept).")
      .def(
          "add",
          [](CallClassifier& self, StepBlockCore& block, int64_t s, nb::handle obs, nb::handle action,
             nb::handle reward, nb::handle extras, nb::handle next_obs, nb::handle terminated, nb::handle truncated,
             nb::tuple flag_rows) {
            if (s < 0 || s >= block.steps()) {
              throw std::out_of_range("add: row " + std::to_string(s) + " is outside the block's " +
                                      std::to_string(block.steps()) + " steps");
            }
            if (flag_rows.size() != 4) throw std::invalid_argument("add: expected the 4 flag rows");
            CallStep step{action.ptr(), extras.ptr(), next_obs.ptr(), reward.ptr(),
                          {flag_rows[0].ptr(), flag_rows[1].ptr(), flag_rows[2].ptr(), flag_rows[3].ptr()}};
            return self.add(block, s, obs.ptr(), terminated.ptr(), truncated.ptr(), step);
          },
          nb::arg("block"), nb::arg("s"), nb::arg("obs").none(), nb::arg("action").none(), nb::arg("reward").none(),
          nb::arg("extras").none(), nb::arg("next_obs").none(), nb::arg("terminated"), nb::arg("truncated"),
          nb::arg("flag_rows"),
          "classify, then put a step that goes on into the block at row s and keep next_obs; the bits "
          "(CALL_PUT: put, CALL_KEPT: kept).")
      .def(
          "judge_steps",
          [](const CallClassifier& self, int64_t env, nb::handle obs, nb::handle next_obs, nb::handle reward,
             nb::handle terminated, nb::handle truncated) -> std::optional<std::tuple<NdArray, NdArray>> {
            if (env < 0 || env >= self.envs()) {
              throw std::out_of_range("judge_steps: env " + std::to_string(env) + " is outside the " +
                                      std::to_string(self.envs()) + " envs");
            }
            const int64_t t = array_size(terminated);
            const auto term = array_in<bool>(terminated, NPY_BOOL, t, "terminated");
            const auto trunc = array_in<bool>(truncated, NPY_BOOL, t, "truncated");
            NdArray reset = new_numpy({t}, NPY_BOOL), starts = new_numpy({t}, NPY_BOOL);
            if (!self.judge_steps(env, obs.ptr(), next_obs.ptr(), reward.ptr(), term, trunc, t,
                                  numpy_data<bool>(reset), numpy_data<bool>(starts))) {
              return std::nullopt;
            }
            return std::make_tuple(reset, starts);
          },
          nb::arg("env"), nb::arg("obs"), nb::arg("next_obs"), nb::arg("reward").none(), nb::arg("terminated"),
          nb::arg("truncated"),
          "Judge T consecutive calls of one env (changing nothing): per step, whether it is a reset step and "
          "whether an episode starts at its obs; None where a leaf or the reward is to be converted.");
}

}  // namespace rlflow
