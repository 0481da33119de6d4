// What the core's structures share about the slots Python hands them: the check every slot gets where it
// enters, and the sizes and cache hints their layouts use.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace rlflow {

// Throws std::out_of_range (IndexError) naming the first of values[0 .. n) outside [0, bound): "<noun> V
// (entry J) is outside the <owner>'s <bound> <unit>".
inline void check_indices(const int64_t* values, int64_t n, int64_t bound, const char* noun, const char* owner,
                          const char* unit) {
  for (int64_t j = 0; j < n; ++j) {
    if (values[j] < 0 || values[j] >= bound) {
      throw std::out_of_range(std::string(noun) + " " + std::to_string(values[j]) + " (entry " + std::to_string(j) +
                              ") is outside the " + owner + "'s " + std::to_string(bound) + " " + unit);
    }
  }
}

// check_indices of slots: "slot S (entry J) is outside the <owner>'s <capacity> <unit>".
inline void check_slots(const int64_t* slots, int64_t n, int64_t capacity, const char* owner, const char* unit) {
  check_indices(slots, n, capacity, "slot", owner, unit);
}

// Entries further than this ahead of the one in use are requested from memory (their cells are far apart).
constexpr int64_t kAhead = 16;

// Throws std::invalid_argument (ValueError) unless capacity >= 1.
inline void check_capacity(int64_t capacity) {
  if (capacity < 1) throw std::invalid_argument("capacity must be >= 1, got " + std::to_string(capacity));
}

// The smallest power of two >= n (1 for n <= 1).
inline int64_t power_of_two_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Asks the CPU to start loading the cache line at `address` (for reading, or for writing), kept in every
// level. A hint only: it never faults and never changes a result.
inline void prefetch(const void* address) { __builtin_prefetch(address, 0, 3); }
inline void prefetch_write(const void* address) { __builtin_prefetch(address, 1, 3); }

}  // namespace rlflow
