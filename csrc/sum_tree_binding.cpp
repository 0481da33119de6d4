#include <nanobind/stl/tuple.h>

#include <tuple>

#include "bind.h"
#include "slots.h"
#include "sum_tree.h"

namespace rlflow {

void bind_sum_tree(nb::module_& m) {
  nb::class_<SumTree>(m, "SumTree")
      .def(nb::init<int64_t>(), nb::arg("capacity"))
      // pickled as (capacity, leaves): the tree is a pure function of its leaves
      .def("__getstate__",
           [](const SumTree& t) {
             auto leaves = new_array<double>(static_cast<std::size_t>(t.capacity()));
             std::copy(t.leaves(), t.leaves() + t.capacity(), leaves.data());
             return std::make_tuple(t.capacity(), leaves);
           })
      .def("__setstate__",
           [](SumTree& t, std::tuple<int64_t, In1<double>> state) {
             const auto& [capacity, leaves] = state;
             check_capacity(capacity);
             check_size(leaves, static_cast<std::size_t>(capacity), "leaves");
             new (&t) SumTree(capacity);
             t.set_leaves(leaves.data());
           })
      .def_prop_ro("capacity", &SumTree::capacity)
      .def_prop_ro("total", &SumTree::total)
      .def_prop_ro("min", &SumTree::min)
      .def_prop_ro("sums", [](const SumTree& t) { return view(t.sums(), t.sums_size()); })
      .def_prop_ro("mins", [](const SumTree& t) { return view(t.mins(), t.mins_size()); })
      .def_prop_ro("leaves", [](const SumTree& t) { return view(t.leaves(), t.capacity()); })
      .def_prop_ro("offsets", [](const SumTree& t) { return view(t.offsets().data(), t.depth() + 1); })
      .def(
          "update",
          [](SumTree& t, In1<int64_t> slots, In1<double> values, double exponent) {
            check_size(values, slots.shape(0), "values");
            nb::gil_scoped_release release;
            t.update(slots.data(), values.data(), static_cast<int64_t>(slots.shape(0)), exponent);
          },
          nb::arg("slots"), nb::arg("values"), nb::arg("exponent") = 1.0)
      .def(
          "set_leaves",
          [](SumTree& t, In1<double> values) {
            check_size(values, static_cast<std::size_t>(t.capacity()), "values");
            nb::gil_scoped_release release;
            t.set_leaves(values.data());
          },
          nb::arg("values"))
      .def(
          "find",
          [](const SumTree& t, In1<double> targets) {
            auto leaves = new_array<int64_t>(targets.shape(0));
            {
              nb::gil_scoped_release release;
              t.find(targets.data(), static_cast<int64_t>(targets.shape(0)), leaves.data());
            }
            return leaves;
          },
          nb::arg("targets"))
      .def(
          "sample",
          [](const SumTree& t, In1<double> uniforms, bool stratified, double beta) {
            const std::size_t n = uniforms.shape(0);
            auto leaves = new_array<int64_t>(n);
            auto probabilities = new_array<double>(n);
            auto weights = new_array<float>(n);
            {
              nb::gil_scoped_release release;
              t.sample(uniforms.data(), static_cast<int64_t>(n), stratified, beta, leaves.data(),
                       probabilities.data(), weights.data());
            }
            return std::make_tuple(leaves, probabilities, weights);
          },
          nb::arg("uniforms"), nb::arg("stratified"), nb::arg("beta"))
      .def(
          "sequential",
          [](SumTree& t, In1<int64_t> leaves, In1<bool> retires, double beta) {
            check_size(retires, leaves.shape(0), "retires");
            const std::size_t n = leaves.shape(0);
            auto probabilities = new_array<double>(n);
            auto weights = new_array<float>(n);
            {
              nb::gil_scoped_release release;
              t.sequential(leaves.data(), retires.data(), static_cast<int64_t>(n), beta, probabilities.data(),
                           weights.data());
            }
            return std::make_tuple(probabilities, weights);
          },
          nb::arg("leaves"), nb::arg("retires"), nb::arg("beta"))
      .def(
          "draws_left",
          [](const SumTree& t, In1<int64_t> times, int64_t limit, int64_t enough) {
            check_size(times, static_cast<std::size_t>(t.capacity()), "times");
            nb::gil_scoped_release release;
            return t.draws_left(times.data(), limit, enough);
          },
          nb::arg("times"), nb::arg("limit"), nb::arg("enough"));
  m.attr("SUM_TREE_BRANCH") = SumTree::kBranch;
}

}  // namespace rlflow
