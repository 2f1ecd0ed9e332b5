// perf mode: median time per call, achieved GB/s and GFLOP/s, and the fraction of the copy
// ceiling measured in the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <omp.h>

#include "harness/instance.h"
#include "opforge/error.h"
#include "opforge/harness.h"

namespace opforge::harness {

using namespace detail;

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// One kernel and the argument sets its calls cycle through (Note [cold operands]).
struct KernelCall {
  const KernelEntry* k;
  Context ctx;
  std::vector<const std::vector<Value>*> sets;
  size_t next = 0;
};
void invoke(void* p) {
  auto* c = static_cast<KernelCall*>(p);
  c->k->boxed(c->k->fn, c->ctx, *c->sets[c->next++ % c->sets.size()]);
}

int64_t input_bytes(const std::vector<ArgPlan>& plan, const PlainArgs& a) {
  int64_t n = 0;
  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].is_tensor && !plan[i].is_output && plan[i].present) n += a.tensors[i].nbytes();
  return n;
}

// Host timing: samples of `batch` calls until the bounds of Options are met.
double time_cpu_us(const Options& opt, KernelCall& call) {
  auto t0 = Clock::now();
  invoke(&call);  // warm-up and calibration
  double one = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  int batch = std::max(1, int(50.0 / std::max(one, 1e-3)));  // samples of >= ~50 us
  std::vector<double> samples;
  auto start = Clock::now();
  while (int(samples.size()) < opt.perf_max_samples) {
    auto s0 = Clock::now();
    for (int i = 0; i < batch; ++i) invoke(&call);
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count() / batch);
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (int(samples.size()) >= opt.perf_min_samples && elapsed >= opt.perf_min_seconds) break;
    if (samples.size() >= 3 && elapsed > opt.perf_max_seconds) break;  // slow kernels (references on large cases)
  }
  return median(samples);
}

Result perf_one(const Registry& reg, const Options& opt, const OpEntry& op, const KernelEntry& k,
                const Case& c, DType t, const Report& rep, const PerfExtras* extras = nullptr) {
  Device dev = device_for(opt, k);
  Result r{"perf", op.name, k.impl(), dev.str(), dtype_name(t), c.label, case_group_name(c.group)};
  std::vector<ArgPlan> plan = plan_case(op, c);
  PlainArgs a = make_perf_args(op, c, plan, t, dev, opt.seed);
  const char* why = k.boxed_predicate ? k.boxed_predicate(k.predicate, a.values) : nullptr;
  if (why) {
    r.status = Status::skip;
    r.detail = std::string("not applicable: ") + why;
    return r;
  }
  reg.call(only(op, k, dev), a.values);  // checks the arguments once, outside the timing
  KernelCall call{&k, Context{dev, {}}, {&a.values}};
  std::vector<PlainArgs> copies;  // Note [cold operands]
  if (opt.perf_rotate_bytes > 0) {
    const int64_t bytes = std::max<int64_t>(input_bytes(plan, a), 1);
    const int64_t want = std::min<int64_t>((opt.perf_rotate_bytes + bytes - 1) / bytes, 16);
    copies.reserve(size_t(std::max<int64_t>(want - 1, 0)));
    for (int64_t i = 1; i < want; ++i) copies.push_back(make_perf_args(op, c, plan, t, dev, opt.seed + uint64_t(i)));
    for (const PlainArgs& x : copies) call.sets.push_back(&x.values);
  }
  if (dev.is_cpu()) {
    r.median_us = time_cpu_us(opt, call);
  } else {
    const DeviceMemoryOps* ops = device_memory_ops(dev.kind);
    if (!ops || !ops->time_calls_us) throw Error(ErrorCode::not_available, "no device timer for " + dev.str());
    int reps = std::clamp(opt.perf_min_samples * 4, 10, 100);
    // A batch of whole rounds of the argument sets, so that every replay walks all of them.
    const int batch = int(call.sets.size()) * std::max(1, 20 / int(call.sets.size()));
    r.median_us = ops->time_calls_us(&invoke, &call, 3, batch, reps, dev.index);
    if (extras && extras->energy_mj && r.median_us > 0) {
      // A second run of >= energy_seconds between two readings of the cumulative counter.
      const double calls = std::clamp(extras->energy_seconds * 1e6 / r.median_us, 1.0, 1e7);
      const int batch = int(std::min(calls, 1000.0)), samples = int(std::ceil(calls / batch));
      const double e0 = extras->energy_mj();
      ops->time_calls_us(&invoke, &call, 0, batch, samples, dev.index);
      const double e1 = extras->energy_mj();
      if (e0 >= 0 && e1 >= e0) r.energy_uj = (e1 - e0) * 1e3 / (double(batch) * samples);
    }
  }
  Cost cost = extras && extras->cost ? *extras->cost
              : op.cost                ? op.cost(ArgList(op.name, op.args, a.values))
                                       : Cost{};
  r.bytes = cost.bytes;
  r.flops = cost.flops;
  double seconds = r.median_us * 1e-6;
  r.gbps = seconds > 0 ? cost.bytes / seconds / 1e9 : 0;
  r.gflops = seconds > 0 ? cost.flops / seconds / 1e9 : 0;
  double ceiling = dev.is_cpu() ? rep.cpu_copy_gbps : rep.cuda_copy_gbps;
  r.pct_ceiling = ceiling > 0 ? 100.0 * r.gbps / ceiling : 0;
  return r;
}

}  // namespace

Result perf_case(const Registry& reg, const Options& opt, const std::string& op_name,
                 const std::string& impl, const Case& c, DType dtype, double ceiling_gbps,
                 const PerfExtras& extras) {
  const OpEntry& op = reg.op(op_name);
  const KernelEntry* k = nullptr;
  for (const KernelEntry& e : op.kernels)
    if (e.impl() == impl && e.availability().ok) k = &e;
  if (!k) throw Error(ErrorCode::not_available, op_name + ": no available kernel '" + impl + "'");
  Report rep;
  rep.cpu_copy_gbps = rep.cuda_copy_gbps = ceiling_gbps;
  return perf_one(reg, opt, op, *k, c, dtype, rep, &extras);
}

double measure_cpu_copy_gbps(int64_t bytes) {
  int64_t n = bytes / 8;
  std::vector<double> src(size_t(n), 1.0), dst(size_t(n), 0.0);
  auto copy = [&] {
#pragma omp parallel
    {
      int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t begin = n * tid / nt, end = n * (tid + 1) / nt;
      std::memcpy(dst.data() + begin, src.data() + begin, size_t(end - begin) * 8);
    }
  };
  copy();  // first touch and warm-up
  std::vector<double> secs;
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    copy();
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * double(n * 8) / median(secs) / 1e9;  // bytes read + bytes written
}

double measure_cuda_copy_gbps(int device_index, int64_t bytes) {
  const DeviceMemoryOps* ops = device_memory_ops(DeviceKind::cuda);
  if (!ops || !ops->time_calls_us) return 0;
  Tensor a = Tensor::zeros(Shape{bytes}, DType::u8, Device::cuda(device_index));
  Tensor b = Tensor::zeros(Shape{bytes}, DType::u8, Device::cuda(device_index));
  struct Copy { const DeviceMemoryOps* ops; void* dst; const void* src; int64_t n; int dev; } c{ops, b.data(), a.data(), bytes, device_index};
  auto fn = [](void* p) {
    auto* x = static_cast<Copy*>(p);
    x->ops->device_to_device(x->dst, x->src, x->n, x->dev);
  };
  double us = ops->time_calls_us(fn, &c, 2, 5, 10, device_index);
  return 2.0 * double(bytes) / (us * 1e-6) / 1e9;
}

Report run_perf(const Registry& reg, const Options& opt) {
  Report rep;
  rep.date = today_iso();
  struct Job { const OpEntry* op; const KernelEntry* k; Case c; DType t; };
  std::vector<Job> jobs;
  bool any_cuda = false;
  for (const OpEntry* op : reg.ops()) {
    if (!op_selected(opt, *op) || !op->cases) continue;
    for (const Case& c : op->cases()) {
      if (!case_selected(opt, c, true)) continue;
      for (const KernelEntry& k : op->kernels) {
        if (!backend_selected(reg, opt, k) || !k.availability().ok) continue;
        if (k.is_reference() && !opt.perf_reference) continue;
        for (DType t : dtypes_for(opt, k, c, true)) {
          jobs.push_back({op, &k, c, t});
          any_cuda |= k.desc.device == DeviceKind::cuda;
        }
      }
    }
  }
  progress(opt, 0, jobs.size(), "measuring the copy ceiling");
  rep.cpu_copy_gbps = measure_cpu_copy_gbps();
  if (any_cuda) {
    rep.cuda_copy_gbps = measure_cuda_copy_gbps(opt.cuda_device);
    if (const DeviceMemoryOps* ops = device_memory_ops(DeviceKind::cuda); ops && ops->device_name)
      rep.cuda_device_name = ops->device_name(opt.cuda_device);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    progress(opt, j, jobs.size(), job.op->name + " " + job.k->impl() + " " + dtype_name(job.t) + " " + job.c.label);
    try {
      rep.results.push_back(perf_one(reg, opt, *job.op, *job.k, job.c, job.t, rep));
    } catch (const std::exception& e) {
      rep.results.push_back(Result{"perf", job.op->name, job.k->impl(), device_kind_name(job.k->desc.device),
                                   dtype_name(job.t), job.c.label, case_group_name(job.c.group), Status::fail,
                                   std::string("error: ") + e.what()});
    }
  }
  progress(opt, jobs.size(), jobs.size(), "");
  return rep;
}

}  // namespace opforge::harness
