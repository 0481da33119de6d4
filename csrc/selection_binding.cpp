#include "bind.h"
#include "insertion_ring.h"
#include "tournament_tree.h"

namespace rlflow {

namespace {

int64_t size_of(const In1<int64_t>& a) { return static_cast<int64_t>(a.shape(0)); }

// Up to n slots found by find(limit, out) (which returns how many it wrote), as a new array; the search runs
// without the GIL.
template <class Find>
Out1<int64_t> found(int64_t n, int64_t limit, Find find) {
  if (n < 0) throw std::invalid_argument("n must be >= 0, got " + std::to_string(n));
  std::vector<int64_t> slots(static_cast<std::size_t>(std::min(n, limit)));
  int64_t m;
  {
    nb::gil_scoped_release release;
    m = find(static_cast<int64_t>(slots.size()), slots.data());
  }
  auto out = new_array<int64_t>(static_cast<std::size_t>(m));
  std::copy(slots.begin(), slots.begin() + m, out.data());
  return out;
}

}  // namespace

void bind_selection(nb::module_& m) {
  nb::class_<InsertionRing>(m, "InsertionRing")
      .def(nb::init<int64_t>(), nb::arg("capacity"))
      .def_prop_ro("seq_of", [](const InsertionRing& r) { return view(r.seq_of(), r.capacity()); })
      .def(
          "push",
          [](InsertionRing& r, In1<int64_t> slots, In1<int64_t> seqs) {
            check_size(seqs, slots.shape(0), "seqs");
            nb::gil_scoped_release release;
            r.push(slots.data(), seqs.data(), size_of(slots));
          },
          nb::arg("slots"), nb::arg("seqs"))
      .def(
          "remove",
          [](InsertionRing& r, In1<int64_t> slots) {
            nb::gil_scoped_release release;
            r.remove(slots.data(), size_of(slots));
          },
          nb::arg("slots"))
      .def(
          "first",
          [](InsertionRing& r, int64_t n, bool newest) {
            return found(n, r.capacity(), [&](int64_t k, int64_t* out) { return r.first(k, newest, out); });
          },
          nb::arg("n"), nb::arg("newest"))
      .def("clear", &InsertionRing::clear);

  nb::class_<TournamentTree>(m, "TournamentTree")
      .def(nb::init<int64_t>(), nb::arg("capacity"))
      .def_prop_ro("leaves", [](const TournamentTree& t) { return view(t.leaves(), t.tree_size()); })
      .def_prop_ro("k1", [](const TournamentTree& t) { return view(t.k1(), t.capacity()); })
      .def_prop_ro("k2", [](const TournamentTree& t) { return view(t.k2(), t.capacity()); })
      .def(
          "set",
          [](TournamentTree& t, In1<int64_t> slots, In1<double> k1, In1<int64_t> k2) {
            check_size(k1, slots.shape(0), "k1");
            check_size(k2, slots.shape(0), "k2");
            nb::gil_scoped_release release;
            t.set(slots.data(), k1.data(), k2.data(), size_of(slots));
          },
          nb::arg("slots"), nb::arg("k1"), nb::arg("k2"))
      .def(
          "set_k1",
          [](TournamentTree& t, In1<int64_t> slots, In1<double> k1) {
            check_size(k1, slots.shape(0), "k1");
            nb::gil_scoped_release release;
            t.set_k1(slots.data(), k1.data(), size_of(slots));
          },
          nb::arg("slots"), nb::arg("k1"))
      .def(
          "clear",
          [](TournamentTree& t, In1<int64_t> slots) {
            nb::gil_scoped_release release;
            t.clear(slots.data(), size_of(slots));
          },
          nb::arg("slots"))
      .def(
          "top",
          [](TournamentTree& t, int64_t n) {
            return found(n, t.capacity(), [&](int64_t k, int64_t* out) { return t.top(k, out); });
          },
          nb::arg("n"))
      .def(
          "load",
          [](TournamentTree& t, In1<int64_t> leaves, In1<double> k1, In1<int64_t> k2) {
            check_size(leaves, static_cast<std::size_t>(t.tree_size()), "leaves");
            check_size(k1, static_cast<std::size_t>(t.capacity()), "k1");
            check_size(k2, static_cast<std::size_t>(t.capacity()), "k2");
            nb::gil_scoped_release release;
            t.load(leaves.data(), k1.data(), k2.data());
          },
          nb::arg("leaves"), nb::arg("k1"), nb::arg("k2"));
}

}  // namespace rlflow
