// Bindings of the store's gathers (gather.h) and of the value checks of whole arrays (value_checks.h). Every
// index handed in is checked against the column it reads before anything is read.
#include <nanobind/nanobind.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "arrays.h"
#include "bind.h"
#include "gather.h"
#include "item_records.h"
#include "slots.h"
#include "store_rings.h"
#include "value_checks.h"

namespace rlflow {

namespace {

// A [rows, width] uint8 array as a ByteColumn.
ByteColumn byte_column(nb::handle column, const char* what) {
  const int64_t rows = array_dim(column, 0), width = array_dim(column, 1);
  auto* data = const_cast<uint8_t*>(array_at_least<uint8_t>(column, NPY_UINT8, rows * width, what, true));
  return ByteColumn{data, rows, width};
}

void check_index(const int64_t* idx, int64_t n, int64_t rows) { check_indices(idx, n, rows, "row index", "column", "rows"); }

// Records [B, width >= 6] int64 handed in, and their count, of windows in rings of `capacity` rows.
ArrayIn<int64_t> records_in(nb::handle meta, int64_t capacity, int64_t* b_count, int64_t* width) {
  if (capacity < 1) throw std::invalid_argument("capacity must be >= 1, got " + std::to_string(capacity));
  *b_count = array_dim(meta, 0);
  *width = array_dim(meta, 1);
  if (*width < RECORD_COLUMNS) throw std::invalid_argument("expected item records of at least 6 columns");
  return array_in<int64_t>(meta, NPY_INT64, *b_count * *width, "records");
}

}  // namespace

void bind_gather(nb::module_& m) {
  m.def(
      "window_index",
      [](nb::handle meta, int64_t capacity) {
        int64_t b_count, width;
        const auto records = records_in(meta, capacity, &b_count, &width);
        const int64_t length = longest_window(records, b_count, width);
        NdArray idx = new_numpy({b_count, length}, NPY_INT64), mask = new_numpy({b_count, length}, NPY_BOOL);
        bool full;
        {
          nb::gil_scoped_release release;
          full = window_index(records, b_count, width, length, capacity, numpy_data<int64_t>(idx),
                              numpy_data<bool>(mask));
        }
        return std::make_tuple(idx, mask, full);
      },
      nb::arg("meta"), nb::arg("capacity"),
      "Flat store indices [B, L] of the records' windows, their mask of valid rows, and whether all are.");
  m.def(
      "window_ends",
      [](nb::handle meta, int64_t capacity) {
        int64_t b_count, width;
        const auto records = records_in(meta, capacity, &b_count, &width);
        NdArray ends = new_numpy({2, b_count}, NPY_INT64);
        window_ends(records, b_count, width, capacity, numpy_data<int64_t>(ends));
        return ends;
      },
      nb::arg("meta"), nb::arg("capacity"), "Flat store indices [2, B] of each window's first and last row.");
  m.def(
      "prefetch_rows",
      [](const std::vector<nb::handle>& columns_h, nb::handle index_h) {
        std::vector<ByteColumn> columns;
        for (nb::handle c : columns_h) columns.push_back(byte_column(c, "column"));
        const int64_t n = array_size(index_h);
        const auto idx = indices_in<int64_t>(index_h, NPY_INT64, n, "index");
        for (const ByteColumn& c : columns) check_index(idx, n, c.rows);
        nb::gil_scoped_release release;
        prefetch_rows(columns, idx, n);
      },
      nb::arg("columns"), nb::arg("index"), "Request every cache line of the rows of every column.");
  m.def(
      "take_rows",
      [](nb::handle column_h, nb::handle index_h, nb::handle out_h) {
        const ByteColumn column = byte_column(column_h, "column");
        const int64_t n = array_size(index_h);
        const auto idx = indices_in<int64_t>(index_h, NPY_INT64, n, "index");
        auto* out = array_data<uint8_t>(out_h, NPY_UINT8, n * column.width, "out");
        check_index(idx, n, column.rows);
        nb::gil_scoped_release release;
        take_rows(column, idx, n, out);
      },
      nb::arg("column"), nb::arg("index"), nb::arg("out"), "Rows index of a [rows, bytes] column into out.");
  m.def(
      "take_stacks",
      [](const StoreRings& rings, nb::handle column_h, nb::handle index_h, int64_t frames, bool by_column,
         nb::handle out_h) {
        const ByteColumn column = byte_column(column_h, "column");
        const int64_t a = array_dim(index_h, 0), n = array_size(index_h);
        const int64_t cols = a ? n / a : 0;
        const auto idx = indices_in<int64_t>(index_h, NPY_INT64, a * cols, "index");
        if (column.rows != rings.lanes() * rings.capacity() || frames < 1 || frames > rings.capacity()) {
          throw std::invalid_argument("take_stacks: expected a column of the store's rows and 1 <= frames <= capacity");
        }
        auto* out = array_data<uint8_t>(out_h, NPY_UINT8, n * frames * column.width, "out");
        check_index(idx, n, column.rows);
        nb::gil_scoped_release release;
        take_stacks(column, idx, a, cols, rings.episode_steps(), rings.capacity(), frames, by_column, out);
      },
      nb::arg("rings"), nb::arg("column"), nb::arg("index"), nb::arg("frames"), nb::arg("by_column"), nb::arg("out"),
      "The frame stacks of flat rows index [A, M] of a stacked column into out.");
  m.def(
      "values_pass",
      [](nb::handle values, ValueCheck check, double low, double high) {
        // Any alignment: the values are read with memcpy.
        if (!PyArray_Check(values.ptr()) || !PyArray_IS_C_CONTIGUOUS(reinterpret_cast<PyArrayObject*>(values.ptr()))) {
          throw std::invalid_argument("values_pass: expected a C-contiguous numpy array");
        }
        auto* a = reinterpret_cast<PyArrayObject*>(values.ptr());
        const char kind = PyArray_DESCR(a)->kind;
        const int64_t itemsize = PyArray_ITEMSIZE(a);
        if (!checkable(check, kind, itemsize) || !PyArray_ISNOTSWAPPED(a)) {
          throw std::invalid_argument("values_pass: FINITE checks native float32/float64, BOUNDS native integers");
        }
        const auto* data = static_cast<const uint8_t*>(PyArray_DATA(a));
        const int64_t n = PyArray_SIZE(a);
        nb::gil_scoped_release release;
        return !values_fail(data, n, kind, itemsize, check, low, high);
      },
      nb::arg("values"), nb::arg("check"), nb::arg("low") = 0.0, nb::arg("high") = 0.0,
      "Whether every value passes the check (finite floats, integers within [low, high] as float64).");
}

}  // namespace rlflow
