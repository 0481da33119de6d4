#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
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
          [](CallClassifier& self, StepBlockCore& block, nb::handle obs, nb::handle action, nb::handle reward,
             nb::handle extras, nb::handle next_obs, nb::handle terminated, nb::handle truncated,
             nb::tuple flag_rows) {
            if (block.filled() >= block.steps()) {
              throw std::out_of_range("add: the block is full (" + std::to_string(block.steps()) + " steps)");
            }
            if (flag_rows.size() != 4) throw std::invalid_argument("add: expected the 4 flag rows");
            CallStep step{action.ptr(), extras.ptr(), next_obs.ptr(), reward.ptr(),
                          {flag_rows[0].ptr(), flag_rows[1].ptr(), flag_rows[2].ptr(), flag_rows[3].ptr()}};
            return self.add(block, obs.ptr(), terminated.ptr(), truncated.ptr(), step);
          },
          nb::arg("block"), nb::arg("obs").none(), nb::arg("action").none(), nb::arg("reward").none(),
          nb::arg("extras").none(), nb::arg("next_obs").none(), nb::arg("terminated"), nb::arg("truncated"),
          nb::arg("flag_rows"),
          "classify, then put a step that goes on into the block as its next step and keep next_obs; the bits "
          "(CALL_PUT: put, CALL_KEPT: kept).")
      .def(
          "extend",
          [](const CallClassifier& self, StepBlockCore& block, int64_t env, nb::handle obs, nb::handle action,
             nb::handle reward, nb::handle extras, nb::handle next_obs, nb::handle terminated,
             nb::handle truncated) {
            if (env < 0 || env >= self.envs()) {
              throw std::out_of_range("extend: env " + std::to_string(env) + " is outside the " +
                                      std::to_string(self.envs()) + " envs");
            }
            if (block.filled() != 0) throw std::invalid_argument("extend: the block must be empty");
            const int64_t t = array_size(terminated);
            if (t < 1) throw std::invalid_argument("extend: expected at least one step");
            const auto term = array_in<bool>(terminated, NPY_BOOL, t, "terminated");
            const auto trunc = array_in<bool>(truncated, NPY_BOOL, t, "truncated");
            const StepsCall call{obs.ptr(), action.ptr(), reward.ptr(), extras.ptr(), next_obs.ptr(), term, trunc, t};
            return self.extend(block, env, call);
          },
          nb::arg("block"), nb::arg("env"), nb::arg("obs"), nb::arg("action"), nb::arg("reward").none(),
          nb::arg("extras"), nb::arg("next_obs"), nb::arg("terminated"), nb::arg("truncated"),
          "ReplayBuffer.extend's T steps of one env (leaf tuples [T, ...]; the reward an array [T, ...]; the flags "
          "bool [T]), judged as add judges its calls and put into the one-lane block, nothing written (see "
          "StepsPut).");
  nb::class_<StepsPut>(m, "StepsPut", "What CallClassifier.extend did.")
      .def_ro("judged", &StepsPut::judged,
              "False: obs, next_obs or the reward are not as the classifier compares them; nothing was done.")
      .def_ro("status", &StepsPut::status, "The block filler's status (OK: the steps are in the block).")
      .def_ro("starts", &StepsPut::starts, "An episode starts at obs[first_step], before the steps.")
      .def_ro("ended", &StepsPut::ended, "The last step put ends its episode.")
      .def_ro("steps", &StepsPut::steps, "The steps put (the call's, less its reset steps).")
      .def_ro("first_step", &StepsPut::first_step, "The call's step of the first step put.")
      .def_ro("last_step", &StepsPut::last_step, "The call's step of the last step put.")
      .def_ro("fault_step", &StepsPut::fault_step, "The call's step of a fault.")
      .def_ro("fault_first", &StepsPut::fault_first,
              "The fault is in obs[fault_step], an observation that starts an episode.")
      .def_prop_ro(
          "reset",
          [](const StepsPut& p) -> std::optional<NdArray> {
            if (std::find(p.reset.begin(), p.reset.end(), true) == p.reset.end()) return std::nullopt;
            NdArray out = new_numpy({static_cast<npy_intp>(p.reset.size())}, NPY_BOOL);
            std::copy(p.reset.begin(), p.reset.end(), numpy_data<bool>(out));
            return out;
          },
          "Per step of the call, a NEXT_STEP reset step (left out); None when there is none.");
}

}  // namespace rlflow
