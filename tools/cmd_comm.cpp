// opforge collect-comm --system S [--tp 2 --tp 4 ...] [--dtype bf16] [--root DIR]: the all-reduce
// of tensor parallelism, measured through NCCL across the GPUs of this host
// (src/backends/comm.h), written to data/perf/<system>/all_reduce.csv for the estimator.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>

#include "backends/comm.h"
#include "opforge/error.h"
#include "opforge/perfdb.h"
#include "opforge/registry.h"
#include "tools/cli.h"
#include "harness/instance.h"
#include "opforge/collect.h"
#include "opforge/tensor.h"

namespace opforge::cli {

void add_collect_comm(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("collect-comm",
                                 "measure NCCL all-reduce across this host's GPUs into the perf database");
  auto system = std::make_shared<std::string>();
  auto root = std::make_shared<std::string>();
  auto tps = std::make_shared<std::vector<int>>(std::vector<int>{2, 4, 8});
  auto dtype = std::make_shared<std::string>("bf16");
  cmd->add_option("--system", *system, "system name (folder under data/perf)")->required();
  cmd->add_option("--root", *root, "perf data root (default: data/perf of this checkout)");
  cmd->add_option("--tp", *tps, "tensor-parallel degrees (default 2 4 8; those above the GPU count are skipped)");
  cmd->add_option("--dtype", *dtype, "element type (bf16, f16, f32)");
  cmd->callback([=, &status] {
    AllReduceSetup setup;
    setup.tps = *tps;
    setup.dtype = parse_dtype(*dtype);
    // One hidden row of a decode step (4 KiB .. 16 KiB) up to a prefill of 32768 tokens x 8192.
    for (int64_t b = int64_t(1) << 12; b <= int64_t(1) << 29; b <<= 1) {
      setup.bytes.push_back(b);
      if (b < (int64_t(1) << 29)) setup.bytes.push_back(b + b / 2);
    }
    std::cerr << "collect-comm: " << nccl_describe() << ", " << comm_device_count() << " GPU(s)\n";
    std::vector<AllReducePoint> points = measure_nccl_all_reduce(setup);
    perfdb::OpTable t;
    t.header.system = *system;
    t.header.op = "all_reduce";
    global_registry();  // registering the backends installs the CUDA device ops (the card's name)
    const DeviceMemoryOps* ops = device_memory_ops(DeviceKind::cuda);
    const std::string card = ops && ops->device_name ? ops->device_name(0) : "CUDA device";
    t.header.device = std::to_string(comm_device_count()) + " x " + card + ", " + nccl_describe();
    t.header.commit = perfdb::git_commit();
    t.header.date = harness::detail::today_iso();
    double best = 0;
    for (const AllReducePoint& p : points) best = std::max(best, p.bus_gbps);
    t.header.ceiling_gbps = best;  // the best bus bandwidth seen: extrapolation holds a fraction of it
    t.header.ceiling_gflops = 0;
    t.header.axes = {"message_bytes"};
    t.dim_names = {"message_bytes", "tp"};
    for (const AllReducePoint& p : points) {
      perfdb::Row r;
      r.impl = "nccl";
      r.dtype = dtype_name(setup.dtype);
      r.dims = {{"message_bytes", p.bytes}, {"tp", p.tp}};
      r.median_us = p.median_us;
      r.bytes = 2.0 * (p.tp - 1) / p.tp * double(p.bytes);  // bus bytes of a ring all-reduce
      r.flops = double(p.tp - 1) / p.tp * double(p.bytes / dtype_size(setup.dtype));
      t.rows.push_back(r);
      std::cout << "tp " << p.tp << "  " << p.bytes << " B  " << p.median_us << " us  " << p.bus_gbps
                << " GB/s bus\n";
    }
    const std::string dir = perfdb::Database::resolve_root(*root) + "/" + *system;
    std::filesystem::create_directories(dir);
    perfdb::write_table(t, dir + "/all_reduce.csv");
    std::cout << "wrote " << dir << "/all_reduce.csv (" << t.rows.size() << " rows)\n";
    status = 0;
  });
}

}  // namespace opforge::cli
