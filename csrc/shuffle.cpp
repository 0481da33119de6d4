#include "shuffle.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace rlflow {

namespace {

// Position floor(u * span) of span = i + 1 positions, for a draw u of [0, 1); -1 for any other u (NaN
// included). u < 1, so u * span < span in floating point too.
int64_t position(double u, double span) {
  const double x = u * span;
  return x >= 0.0 && x < span ? static_cast<int64_t>(x) : -1;
}

}  // namespace

void shuffle(int64_t* values, int64_t n, const double* uniforms) {
  double span = static_cast<double>(n);  // i + 1, kept as a double (exact below 2^53): no conversion per swap
  for (int64_t i = n - 1; i > 0; --i, span -= 1.0) {
    const int64_t j = position(uniforms[i], span);
    if (j < 0) {
      for (int64_t k = i + 1; k < n; ++k) {  // the swaps made, undone
        span += 1.0;
        std::swap(values[k], values[position(uniforms[k], span)]);
      }
      throw std::invalid_argument("uniforms must lie in [0, 1), got " + std::to_string(uniforms[i]) +
                                  " at position " + std::to_string(i));
    }
    std::swap(values[i], values[j]);
  }
}

}  // namespace rlflow
