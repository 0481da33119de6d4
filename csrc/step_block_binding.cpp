#include <nanobind/stl/vector.h>

#include "arrays.h"
#include "bind.h"
#include "step_block.h"

namespace rlflow {

void bind_step_block(nb::module_& m) {
  nb::enum_<ValueCheck>(m, "ValueCheck", "How a block column's values are checked.")
      .value("NONE", ValueCheck::None)
      .value("FINITE", ValueCheck::Finite)
      .value("BOUNDS", ValueCheck::Bounds);
  nb::enum_<Part>(m, "Part", "A part of a step row.")
      .value("ACTION", Part::Action)
      .value("REWARD", Part::Reward)
      .value("EXTRAS", Part::Extras)
      .value("OBSERVATION", Part::Observation)
      .value("FINAL", Part::Final);
  nb::enum_<Put>(m, "Put", "What StepBlockCore.put says of a step.")
      .value("OK", Put::Ok)
      .value("CONVERT", Put::Convert)
      .value("FLAGS", Put::Flags)
      .value("LAST_MISMATCH", Put::LastMismatch)
      .value("NO_EPISODE", Put::NoEpisode)
      .value("STARTS_IN_EPISODE", Put::StartsInEpisode)
      .value("ENDS_NO_EPISODE", Put::EndsNoEpisode)
      .value("FINAL_MISSING", Put::FinalMissing)
      .value("VALUE", Put::Value)
      .value("STACK_BREAK", Put::StackBreak)
      .value("STACK_START", Put::StackStart);

  nb::class_<BlockColumn>(m, "BlockColumn", "One column of a StepBlock ([T, E, *shape]) and its value check.")
      .def(
          "__init__",
          [](BlockColumn* self, nb::handle values, bool exact, ValueCheck check, double low, double high) {
            new (self) BlockColumn(block_column(values, array_dim(values, 0), array_dim(values, 1)));
            if (!checkable(check, self->kind, self->itemsize) ||
                (check != ValueCheck::None && !PyArray_ISNOTSWAPPED(reinterpret_cast<PyArrayObject*>(values.ptr())))) {
              throw std::invalid_argument("BlockColumn: FINITE checks native float32/float64, BOUNDS native integers");
            }
            self->exact = exact;
            self->check = check;
            self->low = low;
            self->high = high;
          },
          nb::arg("values"), nb::kw_only(), nb::arg("exact"), nb::arg("check"), nb::arg("low") = 0.0,
          nb::arg("high") = 0.0);

  nb::class_<StepBlockCore>(m, "StepBlockCore", "The block filler: one step of every lane, checked and copied.")
      .def(
          "__init__",
          [](StepBlockCore* self, std::vector<BlockColumn> action, std::vector<BlockColumn> reward,
             std::vector<BlockColumn> extras, std::vector<BlockColumn> observation, std::vector<BlockColumn> final,
             nb::handle lanes, nb::handle first, nb::handle terminated, nb::handle truncated, nb::handle is_open) {
            const int64_t steps = array_dim(first, 0), num_lanes = array_dim(first, 1);
            new (self) StepBlockCore(steps, num_lanes);
            std::vector<BlockColumn>* parts[5] = {&action, &reward, &extras, &observation, &final};
            for (int p = 0; p < 5; ++p) {
              for (const BlockColumn& c : *parts[p]) {
                if (array_dim(c.array, 0) != steps || array_dim(c.array, 1) != num_lanes) {
                  throw std::invalid_argument("StepBlockCore: a column's [T, E] differs from the flags'");
                }
              }
              self->set_columns(static_cast<Part>(p), std::move(*parts[p]));
            }
            const auto &obs = self->columns(Part::Observation), &fin = self->columns(Part::Final);
            for (std::size_t j = 0; j < std::max(obs.size(), fin.size()); ++j) {
              if (j >= obs.size() || j >= fin.size() || obs[j].type_num != fin[j].type_num ||
                  obs[j].row_bytes != fin[j].row_bytes) {
                throw std::invalid_argument("StepBlockCore: expected one final column like each observation column");
              }
            }
            self->set_flags(first, terminated, truncated, is_open);
            self->set_lanes(lanes);
          },
          nb::kw_only(), nb::arg("action"), nb::arg("reward"), nb::arg("extras"), nb::arg("observation"),
          nb::arg("final"), nb::arg("lanes"), nb::arg("first"), nb::arg("terminated"), nb::arg("truncated"),
          nb::arg("is_open"))
      .def("add_stack", &StepBlockCore::add_stack, nb::arg("column"), nb::arg("open"),
           "Observation column ``column`` holds frame stacks; ``open`` ([E, k, ...]) the lanes' open-row stacks.")
      .def("set_agents", &StepBlockCore::set_agents, nb::arg("column"), nb::arg("active"), nb::arg("zeroed"),
           "Multi-agent rows: the active flags' observation column, the flags at the open rows, and the action "
           "columns zeroed for the agents not active.")
      .def_prop_rw("filled", &StepBlockCore::filled, &StepBlockCore::set_filled,
                   "The steps put so far: the next put goes to this row; set 0 to empty the block.")
      .def(
          "put",
          [](StepBlockCore& self, nb::handle action, nb::handle reward, nb::handle extras, nb::handle observation,
             nb::handle final, nb::handle first, nb::handle last, nb::handle terminated, nb::handle truncated) {
            PyObject* const parts[5] = {action.ptr(), reward.ptr(), extras.ptr(), observation.ptr(), final.ptr()};
            PyObject* const flags[4] = {first.ptr(), last.ptr(), terminated.ptr(), truncated.ptr()};
            return self.put(1, false, parts, flags, StepBlockCore::Sources{});
          },
          nb::arg("action").none(), nb::arg("reward").none(), nb::arg("extras").none(),
          nb::arg("observation").none(), nb::arg("final").none(), nb::arg("first").none(), nb::arg("last").none(),
          nb::arg("terminated").none(), nb::arg("truncated").none(),
          "Check the next step (row ``filled``) and put it, counting it when it is good (each part a tuple of "
          "its leaves, or None: written to that row and checked already; ``final`` an empty tuple when there "
          "are no final observations).")
      .def(
          "put_steps",
          [](StepBlockCore& self, int64_t count, nb::handle action, nb::handle reward, nb::handle extras,
             nb::handle observation, nb::handle final, nb::handle first, nb::handle last, nb::handle terminated,
             nb::handle truncated, nb::handle firsts) {
            PyObject* const parts[5] = {action.ptr(), reward.ptr(), extras.ptr(), observation.ptr(), final.ptr()};
            PyObject* const flags[4] = {first.ptr(), last.ptr(), terminated.ptr(), truncated.ptr()};
            StepBlockCore::Sources sources;
            sources.firsts = firsts.ptr();
            return self.put(count, true, parts, flags, sources);
          },
          nb::arg("count"), nb::arg("action").none(), nb::arg("reward").none(),
          nb::arg("extras").none(), nb::arg("observation").none(), nb::arg("final").none(), nb::arg("first").none(),
          nb::arg("last").none(), nb::arg("terminated").none(), nb::arg("truncated").none(),
          nb::arg("firsts").none() = nb::none(),
          "put for the next ``count`` steps at once: each leaf and flag array leads with the steps ([count, E, ...], "
          "or for one lane [count, ...]); a step that fails leaves the lanes' states and ``filled`` as they were. "
          "``firsts``: the observations (a tuple of leaves [K, ...], checked already) of the lanes that start an "
          "episode, one per first flag in order, instead of their observation rows.")
      .def_ro("fault_step", &StepBlockCore::fault_step, "The step of the last fault.")
      .def_ro("fault_lane", &StepBlockCore::fault_lane, "The lane of the last fault (-1: none).")
      .def_ro("fault_column", &StepBlockCore::fault_column, "The column (in its part) of the last fault.")
      .def_ro("fault_part", &StepBlockCore::fault_part, "The part of the last fault.");
}

}  // namespace rlflow
