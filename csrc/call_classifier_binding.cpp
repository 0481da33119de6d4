#include <nanobind/stl/vector.h>

#include "bind.h"
#include "call_classifier.h"

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
          nb::arg("next_obs").none(), "Keep next_obs as each env's last (False: a leaf to convert, nothing kept).");
}

}  // namespace rlflow
