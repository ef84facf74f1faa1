// SPDX-License-Identifier: Apache-2.0
// psched-bench: iteration time of emulated training on a model profile through real shards over
// shaped links, for each scheduling policy, against the fluid-model ideal (docs/design.md §10).
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/emulated_trainer.h"
#include "bench/fluid_model.h"
#include "bench/loopback_ports.h"
#include "bench/measurement.h"
#include "bench/netns_links.h"
#include "bench/shaped_link.h"
#include "bench/tcp_echo.h"
#include "bench/thread_cpu.h"
#include "client/chrome_trace.h"
#include "client/worker_monitor.h"
#include "common/error.h"
#include "common/log.h"
#include "config/byte_size.h"
#include "link/stream_wrapper.h"
#include "server/shard_threads.h"

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
  int tune_iterations = 40;
  std::string partition = "256KiB";
  std::string credit = "2MiB";
  double byte_scale = 0;       // 0: automatic
  double max_iteration_s = 8;  // the automatic byte scale keeps compute-only below this
  std::string trace;
  std::string http;  // serve worker 0's /metrics and /status here while a policy runs
  std::string mode = "sync";
  uint16_t port = 0;  // 0: free ones (loopback_ports.h)
  std::string json;
  std::string shaping = "auto";
  bool rpc_calls = false;  // pushes and polls as RPC calls, not over the data stream
};

// "1gbit", "250mbit", "64kbit", "8000bit" or plain bits per second; returns bytes per second.
double parse_rate(const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {
      {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}};
  for (auto [suffix, scale] : kUnits) {
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

// The static grid the `grid` policy runs: partition sizes x credit as a multiple of them.
constexpr uint64_t kGridPartitions[] = {256 << 10, 1 << 20, 4 << 20};
constexpr uint64_t kGridCreditMultiples[] = {2, 8};

SchedulerConfig scheduler_for(const std::string& policy, const Options& o) {
  uint64_t partition = byte_size(o.partition, "--partition-bytes");
  uint64_t credit = byte_size(o.credit, "--credit-bytes");
  using enum SchedulePolicy;
  if (policy == "fifo") return {fifo, kWholeTensor, kUnlimitedCredit, false};
  if (policy == "priority" || policy == "grid") return {priority, partition, credit, false};
  if (policy == "autotune") return {priority, partition, credit, true};
  if (policy == "partition-only") return {fifo, partition, credit, false};
  if (policy == "priority-only") return {priority, kWholeTensor, kUnlimitedCredit, false};
  fail(ErrorCode::invalid_argument,
       "unknown policy '{}' (expected fifo, priority, partition-only, priority-only, autotune or "
       "grid)",
       policy);
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

// One worker's up- and downlink, made on its client's KJ thread at the first connection; every
// connection of that client goes through them.
class WorkerLinks : public StreamWrapper {
 public:
  explicit WorkerLinks(double bytes_per_s) : bytes_per_s_(bytes_per_s) {}

  kj::Own<kj::AsyncIoStream> wrap(kj::Own<kj::AsyncIoStream> stream, kj::Timer& timer) override {
    if (!up_) {
      up_ = std::make_unique<LinkShaper>(timer, bytes_per_s_);
      down_ = std::make_unique<LinkShaper>(timer, bytes_per_s_);
    }
    return kj::Own<kj::AsyncIoStream>(kj::heap<ShapedStream>(kj::mv(stream), *up_, *down_));
  }

 private:
  double bytes_per_s_;
  std::unique_ptr<LinkShaper> up_, down_;
};

ClientOptions client_options(const DeploymentConfig& config, uint32_t worker,
                             SchedulerConfig scheduler, bool rpc_calls) {
  ClientOptions options = ClientOptions::from_config(config, WorkerId(worker));
  options.scheduler = scheduler;
  options.data_stream = !rpc_calls;
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
std::unique_ptr<ShardThreads> start_shards(const Shaping& shaping, const Options& o) {
  DeploymentConfig config = cluster_config(o, shaping.netns ? "0.0.0.0" : "127.0.0.1");
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto start = [&] {
    auto shards = std::make_unique<ShardThreads>(config, std::vector<ShardId>{}, cores, cores - 1);
    shards->start();
    return shards;
  };
  return shaping.netns ? NetnsLinks::run_in(shaping.netns->shard_namespace(), start) : start();
}

// Worker `w`'s client: under tbf made in the worker's namespace (its threads stay there) and
// connecting to the shards over its own veth; else on loopback through in-process shapers.
std::unique_ptr<Client> connect_worker(const Shaping& shaping, const Options& o, uint32_t w,
                                       SchedulerConfig scheduler) {
  DeploymentConfig config = cluster_config(o, "127.0.0.1");
  if (!shaping.netns) {
    ClientOptions options = client_options(config, w, scheduler, o.rpc_calls);
    options.wrap_stream = std::make_shared<WorkerLinks>(shaping.link_bytes_per_s);
    return std::make_unique<Client>(options);
  }
  ClientOptions options = client_options(config, w, scheduler, o.rpc_calls);
  for (size_t s = 0; s < config.shards.size(); ++s)
    options.shards[s] =
        ListenAddress{NetnsLinks::shard_side_address(w), config.shards[s].listen.port}.to_string();
  return NetnsLinks::run_in(shaping.netns->worker_namespace(w),
                            [&] { return std::make_unique<Client>(std::move(options)); });
}

// Plain TCP through the same shaped links, to show whether the ideal is reachable here: every
// worker at once echoes kTcpMessageBytes messages, kTcpWindow in flight, with a server in the
// shard namespace, so bytes flow both ways at once as psched's do. Returns the slowest
// worker's rate (bytes/s one way); none without tbf (in-process shaping has no TCP to measure).
constexpr uint64_t kTcpMessageBytes = 1 << 20;
constexpr unsigned kTcpWindow = 8;
constexpr double kTcpSeconds = 2.0;
// TCP below this share of the link: the ideal moves bytes at TCP's rate.
constexpr double kTcpReachable = 0.95;

std::optional<double> measure_tcp(const Shaping& shaping, uint32_t workers) {
  if (!shaping.netns) return std::nullopt;
  auto echo = NetnsLinks::run_in(shaping.netns->shard_namespace(),
                                 [] { return std::make_unique<TcpEchoServer>("0.0.0.0"); });
  std::vector<Measurement> each = measure_at_once(workers, [&](uint32_t w) {
    return NetnsLinks::run_in(shaping.netns->worker_namespace(w), [&] {
      return tcp_pipelined(echo->port(), {.size = kTcpMessageBytes}, kTcpWindow,
                           Budget{.seconds = kTcpSeconds}, NetnsLinks::shard_side_address(w));
    });
  });
  double slowest = each.front().gb_per_s();
  for (const Measurement& m : each) slowest = std::min(slowest, m.gb_per_s());
  return slowest * 1e9;
}

struct PolicyResult {
  double iteration_s = 0;
  double cpu_share = 0;  // CPU seconds used / (wall seconds x cores)
  double gb_per_s = 0;   // bytes moved (gradients up plus values down, all workers) per second
  // CPU seconds per 1e9 bytes moved (gradients up plus values down), by thread role
  // (bench/thread_cpu.h), "other" (the rest of the process) and "total".
  std::map<std::string, double> cpu_s_per_gb;
  TuningState tuning;         // worker 0's, when autotuned
  bool tuned_steady = false;  // iteration_s is measured after every tuner converged
};

// Shows "label [#####.....] k/n" on stderr while `trainers` run, when stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar(std::string label, int iterations,
              const std::vector<std::unique_ptr<EmulatedTrainer>>& trainers)
      : label_(std::move(label)), iterations_(iterations), trainers_(trainers) {
    if (isatty(STDERR_FILENO)) thread_ = std::thread([this] { show(); });
  }
  ~ProgressBar() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void show() {
    constexpr int kWidth = 30;
    while (!done_) {
      int k = iterations_;
      for (const auto& t : trainers_) k = std::min(k, t->started_iterations());
      int filled = kWidth * k / iterations_;
      std::fprintf(stderr, "\r  %-15s [%s%s] %d/%d", label_.c_str(),
                   std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), k,
                   iterations_);
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::fprintf(stderr, "\r%*s\r", kWidth + 40, "");
  }

  std::string label_;
  int iterations_;
  const std::vector<std::unique_ptr<EmulatedTrainer>>& trainers_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

PolicyResult run_policy(const ModelProfile& profile, const Options& o, const std::string& label,
                        SchedulerConfig scheduler, int iterations, const Shaping& shaping,
                        std::vector<TracedWorker>* trace) {
  auto shards = start_shards(shaping, o);
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<EmulatedTrainer>> trainers;
  for (uint32_t w = 0; w < o.workers; ++w) {
    clients.push_back(connect_worker(shaping, o, w, scheduler));
    trainers.push_back(std::make_unique<EmulatedTrainer>(*clients.back(), profile));
  }
  // Worker 0's operator view (client/worker_monitor.h); destroyed before the clients.
  std::optional<HttpServer> http;
  if (!o.http.empty()) http.emplace(parse_listen_address(o.http), worker_routes(*clients[0]));
  auto epoch = Clock::now();
  const double cpu_before = ProcessUsage::now().cpu_seconds;
  std::map<std::string, double> threads_before = thread_cpu_seconds();
  std::vector<std::vector<double>> starts(o.workers);
  {
    ProgressBar progress(label, iterations, trainers);
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < o.workers; ++w)
      threads.emplace_back([&, w] { starts[w] = trainers[w]->run(iterations, epoch); });
    for (auto& t : threads) t.join();
  }
  double wall = std::chrono::duration<double>(Clock::now() - epoch).count();
  PolicyResult result;
  double cpu = ProcessUsage::now().cpu_seconds - cpu_before;
  result.cpu_share = cpu / (wall * std::thread::hardware_concurrency());
  double moved_gb = 2.0 * profile.bytes() * iterations * o.workers / 1e9;
  double named = 0;
  for (const auto& [role, seconds] : thread_cpu_seconds()) {
    result.cpu_s_per_gb[role] = (seconds - threads_before[role]) / moved_gb;
    named += seconds - threads_before[role];
  }
  result.cpu_s_per_gb["other"] = std::max(0.0, cpu - named) / moved_gb;  // trainers, gone too
  result.cpu_s_per_gb["total"] = cpu / moved_gb;
  // Steady state: after the warm-up, or, when autotuned, after the last tuner converged (and
  // one more iteration for the setting to take hold).
  size_t first = kWarmupIterations;
  if (scheduler.autotune) {
    result.tuning = clients[0]->tuning();
    result.tuned_steady = true;
    uint64_t converged_after = 0;
    for (auto& c : clients) {
      TuningState t = c->tuning();
      result.tuned_steady = result.tuned_steady && t.converged;
      converged_after = std::max(converged_after, t.converged_after);
    }
    first = std::max<size_t>(first, converged_after + 2);
    if (!result.tuned_steady || first + 2 > starts[0].size())
      first = starts[0].size() - std::max<size_t>(2, starts[0].size() / 4) - 1;
  }
  for (auto& s : starts)
    result.iteration_s =
        std::max(result.iteration_s, steady_iteration_s(s, static_cast<int>(first)));
  result.gb_per_s = moved_gb / iterations / result.iteration_s;
  if (trace)
    for (uint32_t w = 0; w < o.workers; ++w)
      trace->push_back(
          {fmt::format("{} / worker {}", label, w), clients[w]->take_records(), epoch});
  return result;
}

std::vector<FluidLayer> fluid_layers(const ModelProfile& profile) {
  std::vector<FluidLayer> layers;
  for (const auto& l : profile.layers)
    layers.push_back({l.forward_s, l.backward_s, static_cast<double>(l.bytes())});
  return layers;
}

// Row of the table and entry of the JSON for one policy's result.
struct Report {
  double scale;
  double ideal_s;
  double fifo_s = 0;
  nlohmann::json results;

  void add(const std::string& policy, const PolicyResult& r, nlohmann::json extra = {},
           const std::string& note = "") {
    if (policy == "fifo") fifo_s = r.iteration_s;
    std::printf("%-15s %10.4f %9s %8.1f%% %5.0f%% %7.2f%s%s\n", policy.c_str(), r.iteration_s,
                fifo_s > 0 ? fmt::format("{:.2f}x", fifo_s / r.iteration_s).c_str() : "-",
                100 * ideal_s / r.iteration_s, 100 * r.cpu_share, r.cpu_s_per_gb.at("total"),
                r.cpu_share > 0.85 ? "  (CPU-bound: the figure is not the link's)" : "",
                note.c_str());
    std::fflush(stdout);
    nlohmann::json entry{{"iter_s", r.iteration_s / scale},
                         {"iter_scaled_s", r.iteration_s},
                         {"cpu_share", r.cpu_share},
                         {"gb_per_s", r.gb_per_s},
                         {"cpu_s_per_gb", r.cpu_s_per_gb}};
    if (!extra.is_null()) entry.update(extra);
    results[policy] = entry;
  }
};

// Runs every setting of the static grid; reports the best.
void run_grid(const ModelProfile& profile, const Options& o, const Shaping& shaping,
              Report& report) {
  nlohmann::json points = nlohmann::json::array();
  PolicyResult best;
  SchedulerConfig best_config;
  for (uint64_t partition : kGridPartitions) {
    for (uint64_t multiple : kGridCreditMultiples) {
      SchedulerConfig config = scheduler_for("grid", o);
      config.partition_bytes = partition;
      config.credit_bytes = partition * multiple;
      std::string label = fmt::format("grid {}/{}", format_byte_size(partition),
                                      format_byte_size(config.credit_bytes));
      PolicyResult r = run_policy(profile, o, label, config, o.iterations, shaping, nullptr);
      points.push_back({{"partition_bytes", partition},
                        {"credit_bytes", config.credit_bytes},
                        {"iter_s", r.iteration_s / report.scale}});
      if (best.iteration_s == 0 || r.iteration_s < best.iteration_s) {
        best = r;
        best_config = config;
      }
    }
  }
  report.add("grid", best,
             {{"partition_bytes", best_config.partition_bytes},
              {"credit_bytes", best_config.credit_bytes},
              {"points", points}},
             fmt::format("  best of {}: {}/{}", points.size(),
                         format_byte_size(best_config.partition_bytes),
                         format_byte_size(best_config.credit_bytes)));
}

// The time and byte scales that keep the shaped links at most o.max_link_bytes_per_s and the
// compute-only iteration at most o.max_iteration_s (unless set by the user).
std::pair<double, double> choose_scales(const Options& o, const ModelProfile& real,
                                        double bandwidth) {
  double bytes = o.byte_scale > 0
                     ? o.byte_scale
                     : std::max(1.0, std::ceil(bandwidth * real.compute_s() /
                                               (o.max_link_bytes_per_s * o.max_iteration_s)));
  double time =
      o.time_scale > 0 ? o.time_scale : std::max(1.0, bandwidth / (bytes * o.max_link_bytes_per_s));
  return {time, bytes};
}

int run(const Options& o) {
  ModelProfile real = load_profile(o.model, o.models_dir);
  double balanced = balanced_link_rate(fluid_layers(real));
  double bandwidth = o.bandwidth.empty() ? balanced : parse_rate(o.bandwidth);
  auto [scale, byte_scale] = choose_scales(o, real, bandwidth);
  ModelProfile profile = scale_compute(scale_bytes(real, byte_scale), scale);
  // Communication time scales by byte_scale x (1 / link) and compute by `scale`: the link
  // keeps the real ratio of the two.
  double link = bandwidth / (scale * byte_scale);
  std::printf("model %s: %zu layers, %.1f MB of parameters, compute %.3f s/iteration (unscaled)\n",
              real.model.c_str(), real.layers.size(), real.bytes() / 1e6, real.compute_s());
  Shaping shaping = choose_shaping(o.shaping, o.workers, link);
  std::optional<double> tcp = measure_tcp(shaping, o.workers);
  // The ideal moves bytes at the link's rate. Where plain TCP does not reach that rate on this
  // machine, no transport can: the ideal then moves them at TCP's rate, so "of ideal" measures
  // psched rather than the machine. (Headers and noise keep TCP a few % below any link.)
  bool ideal_at_tcp = tcp && *tcp < kTcpReachable * link;
  double ideal_rate = ideal_at_tcp ? *tcp : link;
  auto ideal = simulate_fluid(fluid_layers(profile), ideal_rate, FluidPolicy::priority);
  // Not an ideal: whole tensors, first come first served, on a perfect link; what fifo should
  // measure if per-message costs were nil.
  auto fluid_fifo = simulate_fluid(fluid_layers(profile), ideal_rate, FluidPolicy::fifo);
  std::printf(
      "bandwidth %.3g Gbit/s%s; time scale %.2f: links shaped %s at %.1f MB/s, "
      "compute x%.2f",
      bandwidth * 8 / 1e9, o.bandwidth.empty() ? " (balanced: communication = compute)" : "", scale,
      shaping.netns ? "by tc tbf on veth pairs between network namespaces" : "in process",
      link / 1e6, scale);
  if (byte_scale > 1) std::printf("; tensors / %.0f (%.1f MB)", byte_scale, profile.bytes() / 1e6);
  std::printf("\n");
  if (!shaping.fallback_reason.empty())
    std::printf("shaping in process: tbf unavailable: %s\n", shaping.fallback_reason.c_str());
  if (tcp)
    std::printf(
        "plain TCP through the same links, both ways at once: %.3g Gbit/s each way per "
        "worker (%.0f%% of the link)%s\n",
        *tcp * 8 / 1e9, 100 * *tcp / link,
        ideal_at_tcp ? "; the ideal below moves bytes at TCP's rate" : "");
  std::printf("%-15s %10s %9s %9s %6s %7s\n", "policy", "iter_s", "vs fifo", "of ideal", "cpu",
              "s/GB");
  Report report{scale, ideal.iteration_s, 0, nlohmann::json::object()};
  std::vector<TracedWorker> trace;
  for (const std::string& policy : o.policies) {
    if (policy == "grid") {
      run_grid(profile, o, shaping, report);
      continue;
    }
    SchedulerConfig config = scheduler_for(policy, o);
    int iterations = config.autotune ? std::max(o.iterations, o.tune_iterations) : o.iterations;
    PolicyResult r = run_policy(profile, o, policy, config, iterations, shaping,
                                o.trace.empty() ? nullptr : &trace);
    if (!config.autotune) {
      report.add(policy, r);
      continue;
    }
    const TuningState& t = r.tuning;
    report.add(policy, r,
               {{"partition_bytes", t.current.partition_bytes},
                {"credit_bytes", t.current.credit_bytes},
                {"converged", r.tuned_steady},
                {"converged_after_iterations", t.converged_after},
                {"iterations", iterations}},
               fmt::format("  tuned to {}/{}{}", format_byte_size(t.current.partition_bytes),
                           format_byte_size(t.current.credit_bytes),
                           r.tuned_steady ? fmt::format(" after {} iterations", t.converged_after)
                                          : " (not converged: last quarter's median)"));
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
  if (!o.trace.empty()) {
    std::ofstream(o.trace) << chrome_trace(trace).dump() << "\n";
    std::printf("trace: %s (open in https://ui.perfetto.dev)\n", o.trace.c_str());
  }
  if (!o.json.empty()) {
    nlohmann::json j{{"model", real.model},
                     {"bandwidth_bps", bandwidth * 8},
                     {"workers", o.workers},
                     {"shards", o.shards},
                     {"mode", o.mode},
                     {"shaping", shaping.name()},
                     {"time_scale", scale},
                     {"byte_scale", byte_scale},
                     {"partition_bytes", byte_size(o.partition, "--partition-bytes")},
                     {"credit_bytes", byte_size(o.credit, "--credit-bytes")},
                     {"compute_s", real.compute_s()},
                     {"ideal_s", ideal.iteration_s / scale},
                     {"ideal_rate_bps", ideal_rate * scale * byte_scale * 8},
                     {"ideal_rate_basis", ideal_at_tcp ? "tcp" : "link"},
                     {"tcp_bps", tcp ? nlohmann::json(*tcp * scale * byte_scale * 8) : nullptr},
                     {"fifo_fluid_s", fluid_fifo.iteration_s / scale},
                     {"results", report.results}};
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
  app.add_option("--bandwidth", o.bandwidth,
                 "per-worker link rate, e.g. 1gbit (default: balanced)");
  app.add_option("--time-scale", o.time_scale, "compute x this, bandwidth / this (default: auto)");
  app.add_option("--max-link-rate", o.max_link_bytes_per_s,
                 "auto time scale keeps shaped links at most this many bytes/s");
  app.add_option("--policy", o.policies,
                 "fifo,priority,partition-only,priority-only,autotune,grid (autotune: priority "
                 "tuning partition and credit as it runs; grid: priority at each of a static "
                 "grid of settings, the best reported)")
      ->delimiter(',');
  app.add_option("--tune-iters", o.tune_iterations, "iterations of the autotune policy");
  app.add_option("--iters", o.iterations, "iterations per policy (two are warm-up)")
      ->check(CLI::Range(psched::bench::kWarmupIterations + 2, 100000));
  app.add_option("--partition-bytes", o.partition, "partition size for partitioned policies");
  app.add_option("--credit-bytes", o.credit, "credit window for partitioned policies");
  app.add_option("--byte-scale", o.byte_scale,
                 "tensors / this (default: auto, see --max-iteration)");
  app.add_option("--max-iteration", o.max_iteration_s,
                 "auto byte scale keeps the scaled compute-only iteration below this (seconds)");
  app.add_option("--http", o.http,
                 "serve worker 0's /metrics and /status (credit, queue by priority, iteration "
                 "time) on this host:port while each policy runs");
  app.add_option("--trace", o.trace, "write per-partition timelines here (Chrome trace JSON)");
  app.add_option("--mode", o.mode)->check(CLI::IsMember({"sync", "async"}));
  app.add_option("--port", o.port,
                 "first shard port (on 127.0.0.1, or in the shard namespace; default: free ones)");
  app.add_option("--json", o.json, "write the results here");
  app.add_option("--shaping", o.shaping,
                 "tbf: tc tbf on veth pairs between network namespaces (root; exits 77 where "
                 "unavailable); inprocess; auto (default): tbf where available")
      ->check(CLI::IsMember({"auto", "tbf", "inprocess"}));
  app.add_flag("--rpc-calls", o.rpc_calls,
               "send pushes and polls as Cap'n Proto calls instead of over the data stream");
  CLI11_PARSE(app, argc, argv);
  psched::set_log_level(psched::LogLevel::warn);
  try {
    if (o.port == 0) o.port = psched::bench::free_loopback_ports(o.shards);
    return psched::bench::run(o);
  } catch (const psched::bench::ShapingUnavailable& e) {
    std::fprintf(stderr, "psched-bench: %s\n", e.what());
    return psched::bench::kShapingUnavailable;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "psched-bench: %s\n", e.what());
    return 1;
  }
}
