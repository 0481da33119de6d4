// Bindings of a table's item slots (ItemSlots: a Table's, RowSlots: a RowTable's), the draws' record copies, and
// the uniform selector's dense set. Every slot, lane and count handed in is checked before anything changes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/tuple.h>

#include <cmath>
#include <string>
#include <vector>

#include "arrays.h"
#include "bind.h"
#include "dense_set.h"
#include "item_slots.h"
#include "row_slots.h"

namespace rlflow {

namespace {

void check_lanes(const int64_t* lanes, int64_t n, int64_t num_lanes) {
  check_indices(lanes, n, num_lanes, "lane", "store", "lanes");
}

void check_rows(int64_t lo, int64_t hi) {
  if (lo < 0 || hi < lo) {
    throw std::out_of_range("rows " + std::to_string(lo) + " .. " + std::to_string(hi) + ": expected 0 <= lo <= hi");
  }
}

// Draw outputs handed in: slots [n] int64, rows [n, width] int64, probabilities [n] float64.
Draws draws_into(nb::handle slots, nb::handle rows, nb::handle probabilities, int64_t width) {
  const int64_t n = array_size(slots);
  Draws d{array_data<int64_t>(slots, NPY_INT64, n, "slots"), array_data<int64_t>(rows, NPY_INT64, n * width, "rows"),
          array_data<double>(probabilities, NPY_FLOAT64, n, "probabilities"), n};
  return d;
}

// A dense set over Python's arrays (items, where: [capacity] int64; live: [capacity] bool).
DenseSet dense_set(nb::handle items, nb::handle where, nb::handle live, int64_t count) {
  const int64_t capacity = array_size(live);
  if (count < 0 || count > capacity) {
    throw std::out_of_range("count " + std::to_string(count) + " is outside [0, " + std::to_string(capacity) + "]");
  }
  return DenseSet{array_data<int64_t>(items, NPY_INT64, capacity, "items"),
                  array_data<int64_t>(where, NPY_INT64, capacity, "where"),
                  array_data<bool>(live, NPY_BOOL, capacity, "live"), capacity, count};
}

// Insert or remove (op) the slots handed in to a dense set over Python's arrays; the new count.
int64_t dense_apply(nb::handle items, nb::handle where, nb::handle live, int64_t count, nb::handle slots_h,
                    int64_t (DenseSet::*op)(const int64_t*, int64_t)) {
  DenseSet set = dense_set(items, where, live, count);
  const int64_t n = array_size(slots_h);
  const auto slots = indices_in<int64_t>(slots_h, NPY_INT64, n, "slots");
  check_slots(slots, n, set.capacity, "selector", "slots");
  nb::gil_scoped_release release;
  return (set.*op)(slots, n);
}

}  // namespace

void bind_items(nb::module_& m) {
  m.attr("KEY") = static_cast<int64_t>(KEY);
  m.attr("LANE") = static_cast<int64_t>(LANE);
  m.attr("START") = static_cast<int64_t>(START);
  m.attr("LENGTH") = static_cast<int64_t>(LENGTH);
  m.attr("VALID") = static_cast<int64_t>(VALID);
  m.attr("TIMES") = static_cast<int64_t>(TIMES);

  nb::class_<ItemSlots>(m, "ItemSlots", "A Table's item slots: records, priorities, free stack, start-row index.")
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle>(), nb::kw_only(), nb::arg("meta"),
           nb::arg("priority"), nb::arg("row_slot"), nb::arg("free"))
      .def(
          "place",
          [](ItemSlots& t, int64_t num_free, int64_t next_seq, nb::handle lanes_h, nb::handle starts_h,
             nb::handle lengths_h, nb::handle valid_h, nb::handle priorities_h) {
            const int64_t n = array_size(lanes_h);
            const auto lanes = indices_in<int64_t>(lanes_h, NPY_INT64, n, "lanes");
            const auto starts = indices_in<int64_t>(starts_h, NPY_INT64, n, "starts");
            const auto lengths = array_in<int64_t>(lengths_h, NPY_INT64, n, "lengths");
            const auto valid = array_in<int64_t>(valid_h, NPY_INT64, n, "valid");
            const auto priorities = array_in<double>(priorities_h, NPY_FLOAT64, n, "priorities");
            NewItems in{lanes, starts, lengths, valid, priorities, n};
            if (num_free < n || num_free > t.slots() || next_seq < 0) {
              throw std::out_of_range("place: " + std::to_string(n) + " items need as many free slots of " +
                                      std::to_string(num_free) + " (at most " + std::to_string(t.slots()) + ")");
            }
            check_lanes(in.lanes, n, t.lanes());
            for (int64_t i = 0; i < n; ++i) {
              if (in.starts[i] < 0) throw std::out_of_range("place: item starts must be >= 0");
            }
            NdArray slots = new_numpy({n}, NPY_INT64), keys = new_numpy({n}, NPY_INT64),
                       clash = new_numpy({n}, NPY_BOOL);
            Placed out{numpy_data<int64_t>(slots), numpy_data<int64_t>(keys), numpy_data<bool>(clash)};
            int64_t clashes;
            {
              nb::gil_scoped_release release;
              clashes = t.place(num_free, next_seq, in, out);
            }
            return std::make_tuple(slots, keys, clash, clashes);
          },
          nb::arg("num_free"), nb::arg("next_seq"), nb::arg("lanes"), nb::arg("starts"), nb::arg("lengths"),
          nb::arg("valid"), nb::arg("priorities"),
          "Place items in the top free slots, index them by start row; (slots, keys, clash, clashes).")
      .def(
          "remove",
          [](ItemSlots& t, int64_t num_free, nb::handle slots_h) {
            const int64_t n = array_size(slots_h);
            const auto slots = indices_in<int64_t>(slots_h, NPY_INT64, n, "slots");
            if (num_free < 0 || num_free + n > t.slots()) {
              throw std::out_of_range("remove: " + std::to_string(n) + " slots do not fit the free stack");
            }
            check_slots(slots, n, t.slots(), "table", "slots");
            const Records& r = t.records();
            for (int64_t i = 0; i < n; ++i) {  // live and distinct: marked (key -2 - key) as they are seen
              int64_t* rec = r.at(slots[i]);
              if (rec[KEY] < 0 || rec[LANE] < 0 || rec[LANE] >= t.lanes() || rec[START] < 0) {
                for (int64_t j = 0; j < i; ++j) r.at(slots[j])[KEY] = -2 - r.at(slots[j])[KEY];
                throw std::invalid_argument("remove: slot " + std::to_string(slots[i]) + " (entry " +
                                            std::to_string(i) + ") holds no item, or is given twice");
              }
              rec[KEY] = -2 - rec[KEY];
            }
            for (int64_t i = 0; i < n; ++i) r.at(slots[i])[KEY] = -2 - r.at(slots[i])[KEY];
            NdArray indirect = new_numpy({n}, NPY_BOOL);
            int64_t times;
            {
              nb::gil_scoped_release release;
              times = t.remove(num_free, slots, n, numpy_data<bool>(indirect));
            }
            return std::make_tuple(times, indirect);
          },
          nb::arg("num_free"), nb::arg("slots"),
          "Free live slots; (their times sampled summed, whether each was outside its index cell).")
      .def(
          "indexed",
          [](const ItemSlots& t, int64_t lane, int64_t lo, int64_t hi) {
            check_lanes(&lane, 1, t.lanes());
            check_rows(lo, hi);
            NdArray out = new_numpy({hi - lo}, NPY_INT64);
            const int64_t m = t.indexed(lane, lo, hi, numpy_data<int64_t>(out));
            return first_entries(out, m);
          },
          nb::arg("lane"), nb::arg("lo"), nb::arg("hi"), "The slots indexed at rows lo .. hi - 1 of lane.")
      .def(
          "set_priorities",
          [](ItemSlots& t, nb::handle keys_h, nb::handle values_h) {
            const int64_t n = array_size(keys_h);
            const auto keys = array_in<int64_t>(keys_h, NPY_INT64, n, "keys");
            const auto values = array_in<double>(values_h, NPY_FLOAT64, n, "priorities");
            NdArray slots = new_numpy({n}, NPY_INT64), kept = new_numpy({n}, NPY_FLOAT64);
            int64_t m;
            {
              nb::gil_scoped_release release;
              m = t.set_priorities(keys, values, n, numpy_data<int64_t>(slots), numpy_data<double>(kept));
            }
            return std::make_tuple(first_entries(slots, m), first_entries(kept, m));
          },
          nb::arg("keys"), nb::arg("priorities"),
          "Store the priorities of live keys, in order; (their slots, their values).");

  nb::enum_<PlaceFault>(m, "PlaceFault", "Why a RowTable refused an item.")
      .value("NONE", PlaceFault::None)
      .value("WINDOW", PlaceFault::Window)
      .value("TAKEN", PlaceFault::Taken)
      .value("TWICE", PlaceFault::Twice);

  nb::class_<Draws>(m, "DrawTally", "What a RowTable's draws left: the next draw, live items, retirements.")
      .def_ro("size", &Draws::size)
      .def_ro("retired", &Draws::retired)
      .def_ro("retired_times", &Draws::retired_times)
      .def_ro("made", &Draws::n, "How many draws are made (the next draw's index).");

  nb::class_<RowSlots>(m, "RowSlots", "A RowTable's item slots: the item starting at a row lives in its slot.")
      .def(nb::init<nb::handle, int64_t>(), nb::kw_only(), nb::arg("meta"), nb::arg("lanes"))
      .def(
          "place",
          [](RowSlots& t, const StoreRings& rings, bool cross_episodes, int64_t next_seq, nb::handle lanes_h,
             nb::handle starts_h, nb::handle lengths_h) {
            if (rings.lanes() != t.lanes() || rings.capacity() != t.capacity() || next_seq < 0) {
              throw std::invalid_argument("place: the rings are not the table's store's");
            }
            const int64_t n = array_size(lanes_h);
            const auto lanes = indices_in<int64_t>(lanes_h, NPY_INT64, n, "lanes");
            const auto starts = indices_in<int64_t>(starts_h, NPY_INT64, n, "starts");
            const auto lengths = array_in<int64_t>(lengths_h, NPY_INT64, n, "lengths");
            NdArray valid = new_numpy({n}, NPY_INT64), slots = new_numpy({n}, NPY_INT64),
                       keys = new_numpy({n}, NPY_INT64);
            PlaceResult r;
            {
              nb::gil_scoped_release release;
              r = t.place(rings, cross_episodes, next_seq, lanes, starts, lengths, n, numpy_data<int64_t>(valid),
                          numpy_data<int64_t>(slots), numpy_data<int64_t>(keys));
            }
            return std::make_tuple(r.item, r.fault, slots, keys);
          },
          nb::arg("rings"), nb::arg("cross_episodes"), nb::arg("next_seq"), nb::arg("lanes"), nb::arg("starts"),
          nb::arg("lengths"), "Check the windows, place each item in its start row's slot; (bad, fault, slots, keys).")
      .def(
          "evict",
          [](RowSlots& t, int64_t lane, int64_t lo, int64_t hi) {
            check_lanes(&lane, 1, t.lanes());
            check_rows(lo, hi);
            int64_t times = 0;
            const int64_t removed = t.evict(lane, lo, hi, &times);
            return std::make_tuple(removed, times);
          },
          nb::arg("lane"), nb::arg("lo"), nb::arg("hi"),
          "Empty the slots of rows lo .. hi - 1 of lane; (how many held an item, their times sampled).")
      .def(
          "draw_stored",
          [](RowSlots& t, const StoreRings& rings, nb::handle uniforms_h, int64_t j, int64_t size, int64_t limit,
             nb::handle slots, nb::handle rows, nb::handle probabilities) {
            if (rings.lanes() != t.lanes() || rings.capacity() != t.capacity()) {
              throw std::invalid_argument("draw_stored: the rings are not the table's store's");
            }
            const int64_t m = array_size(uniforms_h);
            const auto uniforms = uniforms_in(uniforms_h, m, "uniforms");
            Draws d = draws_into(slots, rows, probabilities, t.width());
            if (j < 0 || j > d.n || size < 0) {
              throw std::out_of_range("draw_stored: expected 0 <= j <= draws and size >= 0");
            }
            {
              nb::gil_scoped_release release;
              d.n = t.draw_stored(rings, uniforms, m, j, size, limit, d);
            }
            return d;
          },
          nb::arg("rings"), nb::arg("uniforms"), nb::arg("j"), nb::arg("size"), nb::arg("limit"), nb::arg("slots"),
          nb::arg("rows"), nb::arg("probabilities"),
          "Draws j, j + 1, ... from the uniforms; the tally (made: the next draw's index).")
      .def(
          "draw_live",
          [](RowSlots& t, nb::handle uniforms_h, nb::handle live_h, int64_t limit, nb::handle slots, nb::handle rows,
             nb::handle probabilities) {
            Draws d = draws_into(slots, rows, probabilities, t.width());
            const auto uniforms = uniforms_in(uniforms_h, d.n, "uniforms");
            const int64_t size = array_size(live_h);
            const auto given = array_in<int64_t>(live_h, NPY_INT64, size, "live");
            std::vector<int64_t> live(given.get(), given.get() + size);  // the core's copy: the draws change it
            check_slots(live.data(), size, t.lanes() * t.capacity(), "table", "slots");
            {
              nb::gil_scoped_release release;
              d.n = t.draw_live(uniforms, live.data(), size, limit, d);
            }
            return d;
          },
          nb::arg("uniforms"), nb::arg("live"), nb::arg("limit"), nb::arg("slots"), nb::arg("rows"),
          nb::arg("probabilities"), "Draws each uniform over the live slots (retired ones leave live); the tally.");

  m.def(
      "draw_rows",
      [](nb::handle meta, nb::handle slots_h) {
        Records r{nullptr, array_dim(meta, 0), array_dim(meta, 1)};
        r.rows = array_data<int64_t>(meta, NPY_INT64, r.slots * r.width, "meta");
        const int64_t n = array_size(slots_h);
        const auto slots = indices_in<int64_t>(slots_h, NPY_INT64, n, "slots");
        if (r.width < RECORD_COLUMNS) throw std::invalid_argument("draw_rows: expected records of >= 6 columns");
        check_slots(slots, n, r.slots, "table", "slots");
        NdArray out = new_numpy({n, r.width}, NPY_INT64);
        {
          nb::gil_scoped_release release;
          draw_rows(r, slots, n, numpy_data<int64_t>(out));
        }
        return out;
      },
      nb::arg("meta"), nb::arg("slots"), "Count one sample of each drawn slot; a copy of each draw's record.");

  m.def(
      "first_bad_priority",
      [](nb::handle priorities_h) {
        const int64_t n = array_size(priorities_h);
        const auto p = array_in<double>(priorities_h, NPY_FLOAT64, n, "priorities");
        for (int64_t i = 0; i < n; ++i) {
          if (!(std::isfinite(p[i]) && p[i] >= 0.0)) return i;
        }
        return static_cast<int64_t>(-1);
      },
      nb::arg("priorities"), "The first priority that is negative, NaN or infinite, or -1.");

  m.def(
      "dense_insert",
      [](nb::handle items, nb::handle where, nb::handle live, int64_t count, nb::handle slots) {
        return dense_apply(items, where, live, count, slots, &DenseSet::insert);
      },
      nb::arg("items"), nb::arg("where"), nb::arg("live"), nb::arg("count"), nb::arg("slots"),
      "Add the slots not held yet to a dense set; the new count.");
  m.def(
      "dense_delete",
      [](nb::handle items, nb::handle where, nb::handle live, int64_t count, nb::handle slots) {
        return dense_apply(items, where, live, count, slots, &DenseSet::remove);
      },
      nb::arg("items"), nb::arg("where"), nb::arg("live"), nb::arg("count"), nb::arg("slots"),
      "Remove the held slots from a dense set; the new count.");
  m.def(
      "uniform_pick",
      [](nb::handle uniforms_h, nb::handle items, nb::handle where, nb::handle live, int64_t count) {
        DenseSet set = dense_set(items, where, live, count);
        const int64_t n = array_size(uniforms_h) / 2;
        const auto uniforms = uniforms_in(uniforms_h, 2 * n, "uniforms");
        if (count < 1) throw std::invalid_argument("uniform_pick: the set holds no slot");
        NdArray out = new_numpy({n}, NPY_INT64);
        {
          nb::gil_scoped_release release;
          set.pick(uniforms, n, numpy_data<int64_t>(out));
        }
        return out;
      },
      nb::arg("uniforms"), nb::arg("items"), nb::arg("where"), nb::arg("live"), nb::arg("count"),
      "len(uniforms) // 2 slots, each uniform over the held ones.");
}

}  // namespace rlflow
