// shuffle: Fisher-Yates over int64 values, driven by uniform draws the caller takes from its own generator.
#pragma once

#include <cstdint>

namespace rlflow {

// Shuffles values[0 .. n) in place: for i from n - 1 down to 1, swaps position i with
// j = floor(uniforms[i] * (i + 1)) (uniform over 0 .. i); uniforms[0] is not used. Every uniform is checked
// to lie in [0, 1): at the first (from the end) that does not, the swaps made are undone and
// std::invalid_argument names it, so values are left as they were.
void shuffle(int64_t* values, int64_t n, const double* uniforms);

}  // namespace rlflow
