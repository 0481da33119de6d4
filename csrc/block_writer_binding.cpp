#include <nanobind/stl/vector.h>

#include "bind.h"
#include "block_writer.h"

namespace rlflow {

void bind_block_writer(nb::module_& m) {
  nb::enum_<StepKind>(m, "StepKind", "What a step does on a lane.")
      .value("CONTINUE", StepKind::Continue)
      .value("END", StepKind::End)
      .value("END_START", StepKind::EndStart)
      .value("START", StepKind::Start);
  nb::enum_<PlanFault>(m, "PlanFault", "What BlockWriter.plan says of a block.")
      .value("OK", PlanFault::Ok)
      .value("FLOW", PlanFault::Flow)
      .value("STACK_BREAK", PlanFault::StackBreak)
      .value("STACK_START", PlanFault::StackStart);

  nb::class_<BlockWriter>(m, "BlockWriter", "The block writer over a store's columns and an adder's lane state.")
      .def(
          "__init__",
          [](BlockWriter* self, const std::vector<nb::handle>& act, const std::vector<nb::handle>& obs,
             const std::vector<int64_t>& frames, const std::vector<nb::handle>& flags, nb::handle rings,
             nb::handle open_rows, nb::handle episode_start) {
            new (self) BlockWriter(act, obs, frames, flags, nb::cast<StoreRings&>(rings), rings, open_rows,
                                   episode_start);
          },
          nb::kw_only(), nb::arg("act"), nb::arg("obs"), nb::arg("frames"), nb::arg("flags"), nb::arg("rings"),
          nb::arg("open_rows"), nb::arg("episode_start"))
      .def("plan", &BlockWriter::plan, nb::arg("block"), nb::arg("a"), nb::arg("steps"), nb::arg("codes"),
           nb::arg("new_rows"), nb::arg("ranges"),
           "Plan steps a .. a + steps - 1 of the block: step kinds, rows per lane, stack checks, overwritten rows.")
      .def("write", &BlockWriter::write, nb::arg("block"), nb::arg("a"), nb::arg("steps"), nb::arg("codes"),
           nb::arg("rows"), "Write the planned steps lane after lane; the rows each step wrote.")
      .def_ro("fault_step", &BlockWriter::fault_step, "The step of the last plan's fault (-1: none).")
      .def_ro("fault_lane", &BlockWriter::fault_lane, "The block lane of the last plan's fault.")
      .def_ro("fault_column", &BlockWriter::fault_column, "The observation column of a stack fault.")
      .def_ro("overwritten_lanes", &BlockWriter::overwritten_lanes, "The entries of the last plan's ranges.");

  nb::class_<NStepItems>(m, "NStepItems", "The n-step rule over a store's rewards.")
      .def(nb::init<nb::handle, int64_t, nb::handle>(), nb::kw_only(), nb::arg("rewards"), nb::arg("capacity"),
           nb::arg("powers"))
      .def("set_out", &NStepItems::set_out, nb::kw_only(), nb::arg("lanes"), nb::arg("starts"), nb::arg("lengths"),
           nb::arg("returns"), nb::arg("discounts"), "Where the items go.")
      .def("make", &NStepItems::make, nb::arg("a"), nb::arg("steps"), nb::arg("codes"), nb::arg("rows"),
           nb::arg("terminated"), nb::arg("lanes"), nb::arg("final_was_open"),
           "The items the written steps complete; their count.");
}

}  // namespace rlflow
