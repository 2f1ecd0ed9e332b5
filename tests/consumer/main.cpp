// Uses an installed opforge the way an application would: bind an rms_norm slot on the CPU,
// call it, and compare with a plain computation. Exit status 0 only when every value matches.
#include <opforge/error.h>
#include <opforge/ops/norm/norm.h>
#include <opforge/policy.h>
#include <opforge/slot.h>
#include <opforge/tensor.h>

#include <cmath>
#include <cstdio>

int main() {
  using namespace opforge;
  constexpr int64_t rows = 3, hidden = 8;
  constexpr double eps = 1e-6;
  Tensor x = Tensor::empty({rows, hidden}, DType::f32);
  Tensor w = Tensor::empty({hidden}, DType::f32);
  Tensor y = Tensor::zeros({rows, hidden}, DType::f32);
  for (int64_t i = 0; i < rows * hidden; ++i) x.ptr<float>()[i] = float(i % 7) - 2.5f;
  for (int64_t j = 0; j < hidden; ++j) w.ptr<float>()[j] = 0.5f + 0.125f * float(j);

  try {
    Slot<RmsNorm> slot = bind<RmsNorm>(Policy::parse("all"), Device::cpu());
    slot(y, x, w, eps, 0.0);
    std::printf("%s\n", slot.explain().c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "consumer: opforge error: %s\n", e.what());
    return 1;
  }

  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.ptr<float>() + r * hidden;
    double sum_sq = 0;
    for (int64_t j = 0; j < hidden; ++j) sum_sq += double(xr[j]) * xr[j];
    double rstd = 1.0 / std::sqrt(sum_sq / hidden + eps);
    for (int64_t j = 0; j < hidden; ++j) {
      double want = xr[j] * rstd * w.ptr<float>()[j];
      double got = y.ptr<float>()[r * hidden + j];
      if (!(std::fabs(got - want) <= 1e-5 + 1e-5 * std::fabs(want))) {
        std::fprintf(stderr, "consumer: y[%ld, %ld] = %.9g, expected %.9g\n", long(r), long(j), got, want);
        ++bad;
      }
    }
  }
  std::printf("consumer: rms_norm %s (%d mismatches)\n", bad ? "FAILED" : "ok", bad);
  return bad ? 1 : 0;
}
