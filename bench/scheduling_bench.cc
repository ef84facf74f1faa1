// psched-bench: iteration time of emulated training on a model profile through real shards over
// shaped links, for each scheduling policy, against the fluid-model ideal (DESIGN.md §6).
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/emulated_trainer.h"
#include "bench/fluid_model.h"
#include "bench/netns_links.h"
#include "bench/shaped_link.h"
#include "bench/shard_thread.h"
#include "common/error.h"
#include "common/log.h"
#include "config/byte_size.h"

namespace psched::bench {
namespace {

constexpr uint64_t kMaxMessageBytes = uint64_t(256) << 20;
constexpr uint64_t kWholeTensor = uint64_t(64) << 20;  // what "unpartitioned" sends at most
constexpr uint64_t kUnlimitedCredit = uint64_t(1) << 60;
constexpr int kWarmupIterations = 2;

struct Options {
  std::string model = "vgg16";
  std::string models_dir = PSCHED_SOURCE_DIR "/configs/models";
  uint32_t workers = 2;
  uint32_t shards = 2;
  std::string bandwidth;  // empty: the balanced rate
  double max_link_bytes_per_s = 100e6;
  double time_scale = 0;  // 0: automatic
  std::vector<std::string> policies{"fifo", "priority", "partition-only", "priority-only"};
  int iterations = 10;
  std::string partition = "1MiB";
  std::string credit = "4MiB";
  std::string mode = "sync";
  uint16_t port = 17500;
  std::string json;
  std::string shaping = "auto";
};

// "1gbit", "250mbit", "64kbit", "8000bit" or plain bits per second; returns bytes per second.
double parse_rate(const std::string& text) {
  static const std::pair<const char*, double> units[] = {
      {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}};
  for (auto [suffix, scale] : units) {
    std::string_view s(text), u(suffix);
    if (s.size() > u.size() && s.substr(s.size() - u.size()) == u)
      return std::stod(std::string(s.substr(0, s.size() - u.size()))) * scale / 8;
  }
  return std::stod(text) / 8;
}

uint64_t byte_size(const std::string& text, const char* flag) {
  auto bytes = parse_byte_size(text);
  if (!bytes || *bytes == 0)
    fail(ErrorCode::invalid_argument, "{} '{}' is not a positive byte size", flag, text);
  return *bytes;
}

SchedulerConfig scheduler_for(const std::string& policy, const Options& o) {
  uint64_t partition = byte_size(o.partition, "--partition-bytes");
  uint64_t credit = byte_size(o.credit, "--credit-bytes");
  if (policy == "fifo") return {SchedulePolicy::fifo, kWholeTensor, kUnlimitedCredit, false};
  if (policy == "priority") return {SchedulePolicy::priority, partition, credit, false};
  if (policy == "partition-only") return {SchedulePolicy::fifo, partition, credit, false};
  if (policy == "priority-only")
    return {SchedulePolicy::priority, kWholeTensor, kUnlimitedCredit, false};
  fail(ErrorCode::invalid_argument,
       "unknown policy '{}' (expected fifo, priority, partition-only or priority-only)", policy);
}

DeploymentConfig cluster_config(const Options& o, const std::string& host) {
  DeploymentConfig config;
  config.source = "psched-bench";
  config.mode = o.mode == "async" ? Mode::async : Mode::sync;
  config.workers = o.workers;
  for (uint32_t s = 0; s < o.shards; ++s)
    config.shards.push_back({ListenAddress{host, static_cast<uint16_t>(o.port + s)}});
  config.optimizer = {.kind = optim::OptimizerKind::sgd, .lr = 0.0};
  config.limits.max_message_bytes = kMaxMessageBytes;
  return config;
}

// One worker's up- and downlink, made on its client's KJ thread at the first connection.
struct WorkerLinks {
  double bytes_per_s;
  std::unique_ptr<LinkShaper> up, down;
};

ClientOptions client_options(const DeploymentConfig& config, uint32_t worker,
                             SchedulerConfig scheduler, std::shared_ptr<WorkerLinks> links) {
  ClientOptions options = ClientOptions::from_config(config, WorkerId(worker));
  options.scheduler = scheduler;
  options.wrap_stream = [links](kj::Own<kj::AsyncIoStream> stream, kj::Timer& timer) {
    if (!links->up) {
      links->up = std::make_unique<LinkShaper>(timer, links->bytes_per_s);
      links->down = std::make_unique<LinkShaper>(timer, links->bytes_per_s);
    }
    return kj::Own<kj::AsyncIoStream>(kj::heap<ShapedStream>(kj::mv(stream), *links->up, *links->down));
  };
  return options;
}

// How a run's links are shaped: by tc tbf between network namespaces (`netns` set, see
// bench/netns_links.h), or in process by each client's LinkShapers.
struct Shaping {
  double link_bytes_per_s;
  std::unique_ptr<NetnsLinks> netns;
  std::string fallback_reason;  // why --shaping auto did not get tbf; empty otherwise
  const char* name() const { return netns ? "tbf" : "inprocess"; }
};

// --shaping tbf where namespaces cannot be made: main() exits with kShapingUnavailable.
struct ShapingUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};
constexpr int kShapingUnavailable = 77;  // ctest's SKIP_RETURN_CODE for the tbf smoke test

Shaping choose_shaping(const std::string& requested, uint32_t workers, double link_bytes_per_s) {
  Shaping shaping{link_bytes_per_s, nullptr, {}};
  if (requested == "inprocess") return shaping;
  std::string why = NetnsLinks::unavailable_reason();
  try {
    if (why.empty()) shaping.netns = std::make_unique<NetnsLinks>(workers, link_bytes_per_s);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!shaping.netns && requested == "tbf")
    throw ShapingUnavailable(fmt::format("--shaping tbf unavailable: {}", why));
  shaping.fallback_reason = why;
  return shaping;
}

// The shards: under tbf hosted by threads in the shard namespace, listening on every address
// there (worker i reaches them at its own veth's end); else here, on loopback.
std::unique_ptr<ShardThread> start_shards(const Shaping& shaping, const Options& o) {
  DeploymentConfig config = cluster_config(o, shaping.netns ? "0.0.0.0" : "127.0.0.1");
  unsigned apply_helpers = std::max(1u, std::thread::hardware_concurrency()) - 1;
  auto start = [&] { return std::make_unique<ShardThread>(config, 1, apply_helpers); };
  return shaping.netns ? NetnsLinks::run_in(shaping.netns->shard_namespace(), start) : start();
}

// Worker `w`'s client: under tbf made in the worker's namespace (its threads stay there) and
// connecting to the shards over its own veth; else on loopback through in-process shapers.
std::unique_ptr<Client> connect_worker(const Shaping& shaping, const Options& o, uint32_t w,
                                       SchedulerConfig scheduler) {
  DeploymentConfig config = cluster_config(o, "127.0.0.1");
  if (!shaping.netns) {
    auto links =
        std::make_shared<WorkerLinks>(WorkerLinks{shaping.link_bytes_per_s, nullptr, nullptr});
    return std::make_unique<Client>(client_options(config, w, scheduler, links));
  }
  ClientOptions options = ClientOptions::from_config(config, WorkerId(w));
  options.scheduler = scheduler;
  for (size_t s = 0; s < config.shards.size(); ++s)
    options.shards[s] =
        ListenAddress{NetnsLinks::shard_side_address(w), config.shards[s].listen.port}.to_string();
  return NetnsLinks::run_in(shaping.netns->worker_namespace(w),
                            [&] { return std::make_unique<Client>(std::move(options)); });
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](timeval t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct PolicyResult {
  double iteration_s = 0;
  double cpu_share = 0;  // CPU seconds used / (wall seconds x cores)
};

PolicyResult run_policy(const ModelProfile& profile, const Options& o,
                        const std::string& policy, const Shaping& shaping) {
  auto shards = start_shards(shaping, o);
  SchedulerConfig scheduler = scheduler_for(policy, o);
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<EmulatedTrainer>> trainers;
  for (uint32_t w = 0; w < o.workers; ++w) {
    clients.push_back(connect_worker(shaping, o, w, scheduler));
    trainers.push_back(std::make_unique<EmulatedTrainer>(*clients.back(), profile));
  }
  auto epoch = Clock::now();
  double cpu_before = cpu_seconds();
  std::vector<std::vector<double>> starts(o.workers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < o.workers; ++w)
    threads.emplace_back([&, w] { starts[w] = trainers[w]->run(o.iterations, epoch); });
  for (auto& t : threads) t.join();
  double wall = std::chrono::duration<double>(Clock::now() - epoch).count();
  PolicyResult result;
  result.cpu_share = (cpu_seconds() - cpu_before) / (wall * std::thread::hardware_concurrency());
  std::vector<double> per_worker;
  for (auto& s : starts) per_worker.push_back(steady_iteration_s(s, kWarmupIterations));
  result.iteration_s = *std::max_element(per_worker.begin(), per_worker.end());
  return result;
}

std::vector<FluidLayer> fluid_layers(const ModelProfile& profile) {
  std::vector<FluidLayer> layers;
  for (const auto& l : profile.layers)
    layers.push_back({l.forward_s, l.backward_s, static_cast<double>(l.bytes())});
  return layers;
}

int run(const Options& o) {
  ModelProfile real = load_profile(o.model, o.models_dir);
  double balanced = balanced_link_rate(fluid_layers(real));
  double bandwidth = o.bandwidth.empty() ? balanced : parse_rate(o.bandwidth);
  double scale = o.time_scale > 0 ? o.time_scale : std::max(1.0, bandwidth / o.max_link_bytes_per_s);
  ModelProfile profile = scale_compute(real, scale);
  double link = bandwidth / scale;
  auto ideal = simulate_fluid(fluid_layers(profile), link, FluidPolicy::priority);
  // Not an ideal: whole tensors, first come first served, on a perfect link; what fifo should
  // measure if per-message costs were nil.
  auto fluid_fifo = simulate_fluid(fluid_layers(profile), link, FluidPolicy::fifo);
  std::printf("model %s: %zu layers, %.1f MB of parameters, compute %.3f s/iteration (unscaled)\n",
              real.model.c_str(), real.layers.size(), real.bytes() / 1e6, real.compute_s());
  Shaping shaping = choose_shaping(o.shaping, o.workers, link);
  std::printf("bandwidth %.3g Gbit/s%s; time scale %.2f: links shaped %s at %.1f MB/s, "
              "compute x%.2f\n",
              bandwidth * 8 / 1e9, o.bandwidth.empty() ? " (balanced: communication = compute)" : "",
              scale,
              shaping.netns ? "by tc tbf on veth pairs between network namespaces" : "in process",
              link / 1e6, scale);
  if (!shaping.fallback_reason.empty())
    std::printf("shaping in process: tbf unavailable: %s\n", shaping.fallback_reason.c_str());
  std::printf("%-15s %10s %9s %9s %6s\n", "policy", "iter_s", "vs fifo", "of ideal", "cpu");
  nlohmann::json results;
  double fifo_s = 0;
  for (const std::string& policy : o.policies) {
    PolicyResult r = run_policy(profile, o, policy, shaping);
    if (policy == "fifo") fifo_s = r.iteration_s;
    std::printf("%-15s %10.4f %9s %8.1f%% %5.0f%%%s\n", policy.c_str(), r.iteration_s,
                fifo_s > 0 ? fmt::format("{:.2f}x", fifo_s / r.iteration_s).c_str() : "-",
                100 * ideal.iteration_s / r.iteration_s, 100 * r.cpu_share,
                r.cpu_share > 0.85 ? "  (CPU-bound: the figure is not the link's)" : "");
    std::fflush(stdout);
    results[policy] = {{"iter_s", r.iteration_s / scale}, {"iter_scaled_s", r.iteration_s},
                       {"cpu_share", r.cpu_share}};
  }
  std::printf("%-15s %10.4f\n%-15s %10.4f   (fifo on a perfect link)\n%-15s %10.4f\n",
              "ideal (fluid)", ideal.iteration_s, "fifo (fluid)", fluid_fifo.iteration_s,
              "compute only", profile.compute_s());
  uint64_t drops = 0;
  for (uint32_t w = 0; shaping.netns && w < o.workers; ++w) drops += shaping.netns->tbf_drops(w);
  if (drops > 0)
    std::printf(
        "tbf dropped %llu packets: TCP's loss recovery, not only the rate, shaped the run\n",
        static_cast<unsigned long long>(drops));
  if (!o.json.empty()) {
    nlohmann::json j{{"model", real.model},         {"bandwidth_bps", bandwidth * 8},
                     {"workers", o.workers},        {"shards", o.shards},
                     {"shaping", shaping.name()},   {"time_scale", scale},
                     {"compute_s", real.compute_s()}, {"ideal_s", ideal.iteration_s / scale},
                     {"fifo_fluid_s", fluid_fifo.iteration_s / scale},
                     {"results", results}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace psched::bench

int main(int argc, char** argv) {
  psched::bench::Options o;
  CLI::App app{"psched-bench: scheduling policies on a model profile against the ideal"};
  app.add_option("--model", o.model, "profile name in configs/models, or a path to one");
  app.add_option("--models-dir", o.models_dir, "where profile names are looked up");
  app.add_option("--workers", o.workers)->check(CLI::Range(1u, 64u));
  app.add_option("--shards", o.shards)->check(CLI::Range(1u, 64u));
  app.add_option("--bandwidth", o.bandwidth, "per-worker link rate, e.g. 1gbit (default: balanced)");
  app.add_option("--time-scale", o.time_scale, "compute x this, bandwidth / this (default: auto)");
  app.add_option("--max-link-rate", o.max_link_bytes_per_s,
                 "auto time scale keeps shaped links at most this many bytes/s");
  app.add_option("--policy", o.policies, "fifo,priority,partition-only,priority-only")
      ->delimiter(',');
  app.add_option("--iters", o.iterations, "iterations per policy (two are warm-up)")
      ->check(CLI::Range(psched::bench::kWarmupIterations + 2, 100000));
  app.add_option("--partition-bytes", o.partition, "partition size for partitioned policies");
  app.add_option("--credit-bytes", o.credit, "credit window for partitioned policies");
  app.add_option("--mode", o.mode)->check(CLI::IsMember({"sync", "async"}));
  app.add_option("--port", o.port, "first shard port (on 127.0.0.1, or in the shard namespace)");
  app.add_option("--json", o.json, "write the results here");
  app.add_option("--shaping", o.shaping,
                 "tbf: tc tbf on veth pairs between network namespaces (root; exits 77 where "
                 "unavailable); inprocess; auto (default): tbf where available")
      ->check(CLI::IsMember({"auto", "tbf", "inprocess"}));
  CLI11_PARSE(app, argc, argv);
  psched::set_log_level(psched::LogLevel::warn);
  try {
    return psched::bench::run(o);
  } catch (const psched::bench::ShapingUnavailable& e) {
    std::fprintf(stderr, "psched-bench: %s\n", e.what());
    return psched::bench::kShapingUnavailable;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "psched-bench: %s\n", e.what());
    return 1;
  }
}
