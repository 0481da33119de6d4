#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <vector>

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
            const auto lanes = array_in<int64_t>(lanes_h, NPY_INT64, n, "lanes");
            const auto new_rows = array_in<int64_t>(new_rows_h, NPY_INT64, n, "new_rows");
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
          "The rows that writing new_rows[i] rows to each of lanes overwrites, as ranges (lane, lo, hi); how many.")
      .def(
          "mark",
          [](StoreRings& self, nb::handle lanes_h, nb::handle first_h, nb::handle rows_h) {
            const int64_t n = array_dim(lanes_h, 0);
            const auto lanes = array_in<int64_t>(lanes_h, NPY_INT64, n, "lanes");
            const int64_t starts = array_dim(first_h, 0);
            if (starts != 0 && starts != n) {
              throw std::invalid_argument("first: expected one flag per row, or none (no row starts an episode)");
            }
            const auto first = array_in<bool>(first_h, NPY_BOOL, starts, "first");
            auto* rows = array_data<int64_t>(rows_h, NPY_INT64, n, "rows");
            const std::vector<int64_t> lane(lanes.get(), lanes.get() + n);  // read once: rows may share their memory
            const std::vector<bool> starts_at(first.get(), first.get() + starts);
            for (int64_t l : lane) {
              if (l < 0 || l >= self.lanes()) {
                throw std::out_of_range("mark: lanes must be in [0, " + std::to_string(self.lanes()) + ")");
              }
            }
            for (int64_t i = 0; i < n; ++i) rows[i] = self.mark(lane[i], starts != 0 && starts_at[i]);
          },
          nb::arg("lanes"), nb::arg("first"), nb::arg("rows"),
          "Mark the next row of lanes[i], in order (first[i]: it starts an episode; first empty: none does); "
          "rows[i] gets its index.")
      .def(
          "check_windows",
          [](const StoreRings& self, nb::handle lanes_h, nb::handle starts_h, nb::handle lengths_h,
             bool cross_episodes) {
            const int64_t n = array_size(lanes_h);
            const auto lanes = array_in<int64_t>(lanes_h, NPY_INT64, n, "lanes");
            const auto starts = array_in<int64_t>(starts_h, NPY_INT64, n, "starts");
            const auto lengths = array_in<int64_t>(lengths_h, NPY_INT64, n, "lengths");
            NdArray valid = new_numpy({n}, NPY_INT64);
            int64_t bad;
            {
              nb::gil_scoped_release release;
              bad = self.check_windows(lanes, starts, lengths, n, cross_episodes, numpy_data<int64_t>(valid));
            }
            return std::make_tuple(bad, valid);
          },
          nb::arg("lanes"), nb::arg("starts"), nb::arg("lengths"), nb::arg("cross_episodes"),
          "Check item windows are stored; (the first bad one or -1, each one's valid length: 0 when bad).");
}

}  // namespace rlflow
