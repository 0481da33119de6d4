#include "arrays.h"
#include "bind.h"
#include "store_rings.h"

namespace rlflow {

void bind_store_rings(nb::module_& m) {
  nb::class_<StoreRings>(m, "StoreRings", "A StepStore's ring cursors and episode marks.")
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle, nb::handle, int64_t>(), nb::kw_only(),
           nb::arg("written"), nb::arg("episode_id"), nb::arg("episode_step"), nb::arg("next_episode"),
           nb::arg("next_step"), nb::arg("reach"))
      .def(
          "overwritten",
          [](const StoreRings& self, nb::handle lanes_h, nb::handle new_rows_h, nb::handle ranges_h) {
            const int64_t n = array_dim(lanes_h, 0);
            const auto* lanes = array_data<int64_t>(lanes_h, NPY_INT64, n, "lanes");
            const auto* new_rows = array_data<int64_t>(new_rows_h, NPY_INT64, n, "new_rows");
            auto* ranges = array_at_least<int64_t>(ranges_h, NPY_INT64, 3 * n, "ranges");
            for (int64_t i = 0; i < n; ++i) {
              if (lanes[i] < 0 || lanes[i] >= self.lanes() || new_rows[i] < 0) {
                throw std::out_of_range("overwritten: lanes must be in [0, " + std::to_string(self.lanes()) +
                                        ") and new rows >= 0");
              }
            }
            return self.overwritten(lanes, new_rows, n, ranges);
          },
          nb::arg("lanes"), nb::arg("new_rows"), nb::arg("ranges"),
          "The rows that writing new_rows[i] rows to each of lanes overwrites, as ranges (lane, lo, hi); how many.");
}

}  // namespace rlflow
