// Gathers of a StepStore's rows (rlflow.replay.StepStore documents them): flat store indices of item windows,
// and rows copied as bytes with every row's cache lines requested before any is copied, so that the misses of
// a batch of random rows overlap. A column is [rows, row bytes]; a flat index is lane * capacity + row % capacity.
#pragma once

#include <cstdint>
#include <vector>

namespace rlflow {

// A column as raw bytes: rows of `width` bytes.
struct ByteColumn {
  uint8_t* data;
  int64_t rows;
  int64_t width;
};

// The flat indices idx[b, i] (b < B, i < L, L the longest LENGTH of the records rows[B, width]) of each item
// window; rows at or past an item's VALID length get the window's first row and mask false. Returns whether
// every row is valid.
bool window_index(const int64_t* records, int64_t b_count, int64_t width, int64_t length, int64_t capacity,
                  int64_t* idx, bool* mask);
// The longest LENGTH of the records.
int64_t longest_window(const int64_t* records, int64_t b_count, int64_t width);
// The flat indices ends[0, b], ends[1, b] of each item window's first and last row.
void window_ends(const int64_t* records, int64_t b_count, int64_t width, int64_t capacity, int64_t* ends);
// Request every cache line of rows idx[0 .. n) of every column, one span per run of consecutive rows.
void prefetch_rows(const std::vector<ByteColumn>& columns, const int64_t* idx, int64_t n);
// Copy rows idx[0 .. n) of `column` to out (n * width bytes).
void take_rows(const ByteColumn& column, const int64_t* idx, int64_t n, uint8_t* out);
// The k-frame stacks of flat rows index[a, m] (a < A, m < M) of a stacked column (one frame a row) into out
// (A * M * k frames): frame j of row r's stack is the frame k - 1 - j rows before it, or of its episode's first
// row where that is earlier (episode_steps: each row's step in its episode, flat). by_column copies the stacks
// column after column of the index (the A rows of a column read the same frames, e.g. a transition's two
// ends), else row after row; the result is the same.
void take_stacks(const ByteColumn& column, const int64_t* index, int64_t a, int64_t m, const int64_t* episode_steps,
                 int64_t capacity, int64_t k, bool by_column, uint8_t* out);

}  // namespace rlflow
