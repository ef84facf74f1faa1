// SPDX-License-Identifier: Apache-2.0
// psched-transport-bench: push throughput and latency per partition size through a real
// psched shard (Client -> Cap'n Proto RPC -> ShardHost, all on 127.0.0.1 in this process)
// against a plain TCP echo on the same loopback, in the same run, and against the same echo
// carried by psched's threads and event loops, alone and with psched's per-byte work
// (bench/loop_echo.h; docs/design.md section 10, docs/benchmarks.md). The ratios are the
// result; absolute figures only orient (the machine is shared).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/loop_echo.h"
#include "bench/loopback_ports.h"
#include "bench/tcp_echo.h"
#include "client/client.h"
#include "common/error.h"
#include "common/log.h"
#include "config/byte_size.h"
#include "server/shard_threads.h"

namespace psched::bench {
namespace {

// The pipelined case: a variable of kPipelinePartitions partitions, kPipelineDepth in flight.
constexpr uint64_t kPipelinePartitions = 8;
constexpr unsigned kPipelineDepth = 4;
constexpr uint64_t kMaxMessageBytes = uint64_t(256) << 20;

struct Options {
  std::vector<std::string> sizes{"4KiB", "64KiB", "1MiB", "4MiB"};
  double seconds = 1.0;
  uint16_t port = 0;  // 0: free ones (loopback_ports.h)
  unsigned server_threads = 1;
  unsigned workers = 1;  // above 1: also N clients at once against N TCP streams
  unsigned apply_helpers = std::max(1u, std::thread::hardware_concurrency()) - 1;
  std::string json;
  std::string tls_dir;         // empty: plain TCP
  std::string checkpoint_dir;  // empty: no update log
  bool verbose = false;
  bool rpc_calls = false;     // pushes and polls as RPC calls, not over the data stream
  uint64_t echo_buffers = 1;  // distinct buffers each pipelined TCP echo stream cycles through
};

// --rpc-calls, for every client of the run.
bool g_data_stream = true;

// One size's measurements; the aggregate ones only with --workers above 1.
struct SizeResult {
  uint64_t size = 0;
  Measurement psched_sequential, tcp_sequential, psched_pipelined, tcp_pipelined;
  // The echo through psched's threads and loops, alone and with psched's per-byte work.
  Measurement loop_sequential, loop_pipelined, work_sequential, work_pipelined;
  Measurement loop_aggregate, work_aggregate;
  Measurement psched_aggregate, tcp_aggregate;
};

// Parses --sizes; each must be a positive multiple of 4 bytes (float32 elements).
std::vector<uint64_t> parse_sizes(const std::vector<std::string>& texts) {
  std::vector<uint64_t> sizes;
  for (const std::string& text : texts) {
    std::optional<uint64_t> size = parse_byte_size(text);
    if (!size || *size == 0 || *size % 4 != 0)
      fail(ErrorCode::invalid_argument, "--sizes: '{}' is not a positive multiple of 4 bytes",
           text);
    sizes.push_back(*size);
  }
  return sizes;
}

// One async shard on 127.0.0.1:port whose apply is real but cheap: sgd with lr 0. With
// `tls_dir`, over TLS with its server.pem, server.key and ca.pem (tests/tls/ has such files).
// With `checkpoint_dir`, the shard logs every update there before acknowledging it.
DeploymentConfig shard_config(uint16_t port, unsigned workers, const std::filesystem::path& tls_dir,
                              const std::filesystem::path& checkpoint_dir) {
  DeploymentConfig config;
  config.source = "psched-transport-bench";
  config.mode = Mode::async;
  config.workers = workers;
  config.shards.push_back({ListenAddress{"127.0.0.1", port}});
  config.split_bytes = uint64_t(1) << 62;  // never split: one shard holds every variable
  config.optimizer = {.kind = optim::OptimizerKind::sgd, .lr = 0.0};
  config.limits.max_message_bytes = kMaxMessageBytes;
  config.checkpoint.directory = checkpoint_dir;
  config.checkpoint.interval_seconds = 0;
  if (tls_dir.empty()) return config;
  auto file = [&](const char* name) { return ConfigFile{tls_dir / name, "--tls"}; };
  config.tls = {file("server.pem"), file("server.key"), file("ca.pem"), {}};
  return config;
}

ClientOptions client_options(const DeploymentConfig& shard, uint64_t partition_bytes,
                             uint64_t credit_bytes, WorkerId worker = WorkerId(0)) {
  ClientOptions options = ClientOptions::from_config(shard, worker);
  options.data_stream = g_data_stream;
  options.scheduler = {.policy = SchedulePolicy::priority,
                       .partition_bytes = partition_bytes,
                       .credit_bytes = credit_bytes};
  return options;
}

// The listener is bound before ShardThreads::start returns; the bounded retry is only a safety net.
std::unique_ptr<Client> connect_client(const ClientOptions& options) {
  for (int attempt = 1;; ++attempt) {
    try {
      return std::make_unique<Client>(options);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::disconnected || attempt == 50) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

// A client with a fresh variable of `variable_bytes`, cut into `partition_bytes` partitions
// with `credit_bytes` in flight; iteration() pushes the next step and waits for it.
class PushingClient {
 public:
  PushingClient(const DeploymentConfig& shard, const std::string& name, uint64_t variable_bytes,
                uint64_t partition_bytes, uint64_t credit_bytes, WorkerId worker = WorkerId(0))
      : client_(connect_client(client_options(shard, partition_bytes, credit_bytes, worker))),
        value_(variable_bytes / 4, 1.f),
        gradient_(variable_bytes / 4, 0.5f) {
    VariableSpec spec;
    spec.name = name;
    spec.shape = {value_.size()};
    spec.optimizer = {.kind = optim::OptimizerKind::sgd, .lr = 0.0};
    handle_ = client_->register_variable(spec, std::as_writable_bytes(std::span(value_)));
  }
  void iteration() {
    step_ = step_.next();
    client_->push(handle_, step_, std::as_bytes(std::span(gradient_)));
    client_->wait(handle_, step_);
  }

 private:
  std::unique_ptr<Client> client_;
  std::vector<float> value_, gradient_;
  VariableHandle handle_;
  Step step_;
};

Measurement psched_case(const DeploymentConfig& shard, const std::string& name,
                        uint64_t variable_bytes, uint64_t partition_bytes, uint64_t credit_bytes,
                        const Budget& budget) {
  PushingClient client(shard, name, variable_bytes, partition_bytes, credit_bytes);
  return time_iterations(budget, variable_bytes, [&] { client.iteration(); });
}

// What `workers` measurements made at once moved together: their bytes over the longest.
Measurement aggregate(const std::vector<Measurement>& each) {
  Measurement sum;
  sum.bytes_per_iteration = each.front().bytes_per_iteration;
  for (const Measurement& m : each) {
    sum.iterations += m.iterations;
    sum.seconds = std::max(sum.seconds, m.seconds);
  }
  return sum;
}

// Runs `measure(i)` for i in [0, workers) on a thread each, all at once.
template <typename Measure>
Measurement at_once(unsigned workers, Measure measure) {
  const ProcessUsage usage = ProcessUsage::now();
  Measurement all = aggregate(measure_at_once(workers, measure));
  usage.record_since(all);
  return all;
}

// The two echo baselines: their ports, and how many distinct buffers each pipelined TCP echo
// stream cycles through (--echo-buffers).
struct EchoPorts {
  uint16_t tcp = 0, loop = 0;
  uint64_t pipelined_buffers = 1;

  EchoRequests pipelined_requests(uint64_t size) const {
    return {.size = size, .buffers = pipelined_buffers};
  }
};

// Warms every client up with `iteration(client)`, then times them all at once, so that no
// client's setup or warm-up falls in another's timed window or in the CPU time.
template <typename ClientType, typename Iteration>
Measurement warm_then_at_once(std::vector<std::unique_ptr<ClientType>>& clients,
                              uint64_t bytes_per_iteration, const Budget& budget,
                              Iteration iteration) {
  for (auto& client : clients)
    for (uint64_t i = 0; i < budget.warmup; ++i) iteration(*client);
  Budget timed = budget;
  timed.warmup = 0;
  return at_once(clients.size(), [&](unsigned w) {
    return time_iterations(timed, bytes_per_iteration, [&] { iteration(*clients[w]); });
  });
}

// `workers` clients, each pipelining its own variable as the pipelined case does, against as
// many pipelined TCP streams, and as many loop echo clients of one loop echo server (as psched
// serves them from one shard loop), alone and with psched's per-byte work. Every client is made
// before any is timed.
void measure_aggregate(const DeploymentConfig& shard, EchoPorts echo, unsigned workers,
                       SizeResult& r, const Budget& budget) {
  const uint64_t bytes = kPipelinePartitions * r.size;
  std::vector<std::unique_ptr<PushingClient>> clients;
  for (unsigned w = 0; w < workers; ++w)
    clients.push_back(std::make_unique<PushingClient>(
        shard, fmt::format("many/{}/{}", w, format_byte_size(r.size)), bytes, r.size,
        kPipelineDepth * r.size, WorkerId(w)));
  r.psched_aggregate =
      warm_then_at_once(clients, bytes, budget, [](PushingClient& client) { client.iteration(); });
  std::vector<std::unique_ptr<TcpEchoClient>> streams;
  for (unsigned w = 0; w < workers; ++w)
    streams.push_back(
        std::make_unique<TcpEchoClient>(echo.tcp, echo.pipelined_requests(r.size), budget));
  r.tcp_aggregate =
      at_once(workers, [&](unsigned w) { return streams[w]->pipelined(kPipelineDepth); });
  streams.clear();
  auto loops = [&](EchoWork work) {
    std::vector<std::unique_ptr<LoopEchoClient>> loop_clients;
    for (unsigned w = 0; w < workers; ++w)
      loop_clients.push_back(
          std::make_unique<LoopEchoClient>(echo.loop, r.size, kPipelinePartitions, work));
    return warm_then_at_once(loop_clients, bytes, budget, [](LoopEchoClient& client) {
      client.exchange(kPipelinePartitions, kPipelineDepth);
    });
  };
  r.loop_aggregate = loops(EchoWork::none);
  r.work_aggregate = loops(EchoWork::psched);
}

SizeResult measure_size(const DeploymentConfig& shard, EchoPorts echo, uint64_t size,
                        unsigned workers, const Budget& budget) {
  SizeResult r;
  r.size = size;
  const std::string label = format_byte_size(size);
  r.psched_sequential = psched_case(shard, "seq/" + label, size, size, size, budget);
  r.tcp_sequential = tcp_sequential(echo.tcp, {.size = size}, budget);
  r.loop_sequential = loop_sequential(echo.loop, size, EchoWork::none, budget);
  r.work_sequential = loop_sequential(echo.loop, size, EchoWork::psched, budget);
  r.psched_pipelined = psched_case(shard, "pipe/" + label, kPipelinePartitions * size, size,
                                   kPipelineDepth * size, budget);
  r.tcp_pipelined = tcp_pipelined(echo.tcp, echo.pipelined_requests(size), kPipelineDepth, budget);
  r.loop_pipelined =
      loop_pipelined(echo.loop, size, kPipelinePartitions, kPipelineDepth, EchoWork::none, budget);
  r.work_pipelined = loop_pipelined(echo.loop, size, kPipelinePartitions, kPipelineDepth,
                                    EchoWork::psched, budget);
  if (workers > 1) measure_aggregate(shard, echo, workers, r, budget);
  return r;
}

double ratio(const Measurement& psched, const Measurement& tcp) {
  return psched.gb_per_s() / tcp.gb_per_s();
}

// A latency cell: "-" when the case recorded no per-iteration times.
std::string latency_us(const Measurement& m, double q) {
  return m.iteration_us.empty() ? std::string("-") : fmt::format("{:.1f}", m.percentile_us(q));
}

// psched's CPU time per byte over TCP's: below 1 it spends less, above 1 more.
double cpu_ratio(const Measurement& psched, const Measurement& tcp) {
  return psched.cpu_s_per_gb() / tcp.cpu_s_per_gb();
}

void print_row(uint64_t size, const Measurement& psched, const Measurement& tcp) {
  fmt::print(
      "{:>8} {:>12.3f} {:>10.3f} {:>7.3f} {:>12} {:>12} {:>10} {:>11.2f} {:>8.2f} {:>6.2f}\n",
      format_byte_size(size), psched.gb_per_s(), tcp.gb_per_s(), ratio(psched, tcp),
      latency_us(psched, 0.5), latency_us(psched, 0.99), latency_us(tcp, 0.5),
      psched.cpu_s_per_gb(), tcp.cpu_s_per_gb(), cpu_ratio(psched, tcp));
}

void print_header(const char* title) {
  fmt::print("\n{}\n{:>8} {:>12} {:>10} {:>7} {:>12} {:>12} {:>10} {:>11} {:>8} {:>6}\n", title,
             "size", "psched GB/s", "TCP GB/s", "ratio", "psched p50us", "psched p99us",
             "TCP p50us", "psched s/GB", "TCP s/GB", "cpu x");
}

// Calls `row(size, case, psched, tcp, loop, loop with work)` for every case measured.
template <typename Row>
void for_each_case(const std::vector<SizeResult>& results, unsigned workers, Row row) {
  for (const SizeResult& r : results) {
    row(r.size, "sequential", r.psched_sequential, r.tcp_sequential, r.loop_sequential,
        r.work_sequential);
    row(r.size, "pipelined", r.psched_pipelined, r.tcp_pipelined, r.loop_pipelined,
        r.work_pipelined);
    if (workers > 1)
      row(r.size, fmt::format("{} workers", workers), r.psched_aggregate, r.tcp_aggregate,
          r.loop_aggregate, r.work_aggregate);
  }
}

// Where psched's cost lies: TCP -> the same echo through psched's threads and loops -> with
// psched's per-byte work too -> psched.
void print_loop_table(const std::vector<SizeResult>& results, unsigned workers) {
  fmt::print(
      "\nthe same echo carried by psched's threads and event loops (caller -> client loop -> server"
      " loop and back; no RPC), alone and with psched's per-byte work (the server applies sgd,"
      " the client copies each answer out):\n{:>8} {:>11} {:>12} {:>12} {:>15} {:>10} {:>11}"
      " {:>10} {:>10}\n",
      "size", "case", "loop of TCP", "+work of TCP", "psched of +work", "loop p50us", "+work p50us",
      "loop s/GB", "+work s/GB");
  for_each_case(
      results, workers,
      [](uint64_t size, const std::string& name, const Measurement& psched, const Measurement& tcp,
         const Measurement& loop, const Measurement& work) {
        fmt::print("{:>8} {:>11} {:>12.3f} {:>12.3f} {:>15.3f} {:>10} {:>11} {:>10.2f} {:>10.2f}\n",
                   format_byte_size(size), name, ratio(loop, tcp), ratio(work, tcp),
                   ratio(psched, work), latency_us(loop, 0.5), latency_us(work, 0.5),
                   loop.cpu_s_per_gb(), work.cpu_s_per_gb());
      });
}

// Where hand-offs cost: every hand-off to a sleeping thread, and every partial read that
// sleeps for the rest, is a context switch (docs/benchmarks.md, "Transport").
void print_switch_table(const std::vector<SizeResult>& results, unsigned workers) {
  fmt::print(
      "\ncontext switches per request (the whole process, voluntary and involuntary; a thread"
      " that sleeps and is woken is one):\n{:>8} {:>11} {:>8} {:>8} {:>8} {:>8}\n",
      "size", "case", "psched", "TCP", "loop", "+work");
  for_each_case(results, workers,
                [](uint64_t size, const std::string& name, const Measurement& psched,
                   const Measurement& tcp, const Measurement& loop, const Measurement& work) {
                  fmt::print("{:>8} {:>11} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f}\n",
                             format_byte_size(size), name, psched.switches_per_request(size),
                             tcp.switches_per_request(size), loop.switches_per_request(size),
                             work.switches_per_request(size));
                });
}

void print_tables(const std::vector<SizeResult>& results, unsigned workers) {
  print_header("sequential: one request of `size` in flight (psched: 1 partition, credit = size)");
  for (const SizeResult& r : results) print_row(r.size, r.psched_sequential, r.tcp_sequential);
  print_header(
      "pipelined: 4 requests of `size` in flight (psched: variable of 8 x size, credit 4 x size;"
      " its latency is per 8-partition push+wait)");
  for (const SizeResult& r : results) print_row(r.size, r.psched_pipelined, r.tcp_pipelined);
  if (workers > 1) {
    print_header(fmt::format("{} workers at once, each pipelined as above, against {} pipelined TCP"
                             " streams (GB/s: all together)",
                             workers, workers)
                     .c_str());
    for (const SizeResult& r : results) print_row(r.size, r.psched_aggregate, r.tcp_aggregate);
  }
  print_loop_table(results, workers);
  print_switch_table(results, workers);
  fmt::print(
      "\nnote: both sides move `size` bytes to the server and `size` bytes back per request; GB/s"
      " = 1e9 bytes/s counted one way; the psched figure includes the shard's optimizer apply"
      " (sgd, lr 0) and the poll for the fresh value. s/GB: CPU seconds of the whole process"
      " (both ends) per GB; cpu x: psched's over TCP's, which depends little on the machine's"
      " load.\n");
}

// One case's figures; its requests are of `request_bytes`.
nlohmann::json to_json(const Measurement& m, uint64_t request_bytes) {
  nlohmann::json j = {{"bytes_per_iteration", m.bytes_per_iteration},
                      {"iterations", m.iterations},
                      {"seconds", m.seconds},
                      {"gb_per_s", m.gb_per_s()},
                      {"iterations_per_s", m.iterations_per_s()},
                      {"cpu_seconds", m.cpu_seconds},
                      {"cpu_s_per_gb", m.cpu_s_per_gb()},
                      {"context_switches", m.context_switches},
                      {"switches_per_request", m.switches_per_request(request_bytes)}};
  if (!m.iteration_us.empty()) {
    j["p50_us"] = m.percentile_us(0.5);
    j["p99_us"] = m.percentile_us(0.99);
  }
  return j;
}

nlohmann::json to_json(const Measurement& psched, const Measurement& tcp, uint64_t request_bytes) {
  return {{"psched", to_json(psched, request_bytes)},
          {"tcp", to_json(tcp, request_bytes)},
          {"ratio", ratio(psched, tcp)},
          {"cpu_ratio", cpu_ratio(psched, tcp)}};
}

// The same, and the echo through psched's threads and loops alone ("loop") and with psched's
// per-byte work ("loop_work"): each one's GB/s over TCP's ("loop_ratio", "loop_work_ratio"),
// and psched's over each ("psched_of_loop", "psched_of_loop_work").
nlohmann::json to_json(const Measurement& psched, const Measurement& tcp, const Measurement& loop,
                       const Measurement& work, uint64_t request_bytes) {
  nlohmann::json j = to_json(psched, tcp, request_bytes);
  j["loop"] = to_json(loop, request_bytes);
  j["loop_ratio"] = ratio(loop, tcp);
  j["psched_of_loop"] = ratio(psched, loop);
  j["loop_work"] = to_json(work, request_bytes);
  j["loop_work_ratio"] = ratio(work, tcp);
  j["psched_of_loop_work"] = ratio(psched, work);
  return j;
}

void write_json(const std::string& path, const Options& options,
                const std::vector<SizeResult>& results) {
  nlohmann::json sizes = nlohmann::json::array();
  for (const SizeResult& r : results)
    sizes.push_back({{"size_bytes", r.size},
                     {"size", format_byte_size(r.size)},
                     {"sequential", to_json(r.psched_sequential, r.tcp_sequential,
                                            r.loop_sequential, r.work_sequential, r.size)},
                     {"pipelined", to_json(r.psched_pipelined, r.tcp_pipelined, r.loop_pipelined,
                                           r.work_pipelined, r.size)}});
  if (options.workers > 1)
    for (size_t i = 0; i < results.size(); ++i)
      sizes[i]["aggregate"] =
          to_json(results[i].psched_aggregate, results[i].tcp_aggregate, results[i].loop_aggregate,
                  results[i].work_aggregate, results[i].size);
  nlohmann::json doc = {{"benchmark", "transport"},
                        {"seconds_per_case", options.seconds},
                        {"pipeline_depth", kPipelineDepth},
                        {"pipeline_partitions", kPipelinePartitions},
                        {"server_threads", options.server_threads},
                        {"workers", options.workers},
                        {"echo_buffers", options.echo_buffers},
                        {"tls", !options.tls_dir.empty()},
                        {"update_log", !options.checkpoint_dir.empty()},
                        {"sizes", sizes}};
  std::ofstream out(path);
  out << doc.dump(2) << "\n";
  if (!out) fail(ErrorCode::invalid_argument, "--json: cannot write '{}'", path);
}

int run(const Options& options) {
  if (!options.verbose) set_log_level(LogLevel::warn);
  const std::vector<uint64_t> sizes = parse_sizes(options.sizes);
  const Budget budget{.seconds = options.seconds};
  TcpEchoServer tcp_echo;
  LoopEchoServer loop_echo;
  const DeploymentConfig config =
      shard_config(options.port, options.workers, options.tls_dir, options.checkpoint_dir);
  ShardThreads shard(config, {}, options.server_threads, options.apply_helpers);
  shard.start();
  std::vector<SizeResult> results;
  for (uint64_t size : sizes)
    results.push_back(measure_size(config,
                                   {tcp_echo.port(), loop_echo.port(), options.echo_buffers}, size,
                                   options.workers, budget));
  if (options.echo_buffers > 1)
    fmt::print("the pipelined TCP echoes cycle through {} distinct buffers per end and stream\n",
               options.echo_buffers);
  print_tables(results, options.workers);
  if (!options.json.empty()) write_json(options.json, options, results);
  return 0;
}

}  // namespace
}  // namespace psched::bench

int main(int argc, char** argv) {
  CLI::App app{"psched-transport-bench: psched push+wait against a plain TCP echo on loopback"};
  psched::bench::Options o;
  app.add_option("--sizes", o.sizes, "partition sizes, comma-separated (4KiB,1MiB,...)")
      ->delimiter(',');
  app.add_option("--seconds", o.seconds, "time budget per case and size")
      ->check(CLI::PositiveNumber);
  app.add_option("--port", o.port, "the shard's loopback port (default: a free one)");
  app.add_option("--server-threads", o.server_threads, "event-loop threads serving the shard")
      ->check(CLI::Range(1u, 256u));
  app.add_option("--workers", o.workers,
                 "also run this many clients at once against as many TCP streams (aggregate)")
      ->check(CLI::Range(1u, 64u));
  app.add_option(
      "--apply-threads", o.apply_helpers,
      "extra threads applying one large partition (as psched-server; default cores - 1)");
  app.add_option("--json", o.json, "also write every figure to this file");
  app.add_option("--tls", o.tls_dir,
                 "connect over TLS with DIR/server.pem, server.key and ca.pem (e.g. tests/tls)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "the shard logs every update there (checkpoint.update_log), as a durable one");
  app.add_option("--echo-buffers", o.echo_buffers,
                 "distinct buffers per end each pipelined TCP echo stream cycles through (8: as "
                 "much memory as psched's pipelined variable of 8 partitions touches)")
      ->check(CLI::Range(uint64_t(1), uint64_t(64)));
  app.add_flag("--verbose", o.verbose, "keep psched's info log");
  app.add_flag("--rpc-calls", o.rpc_calls,
               "send pushes and polls as Cap'n Proto calls instead of over the data stream");
  CLI11_PARSE(app, argc, argv);
  psched::bench::g_data_stream = !o.rpc_calls;
  try {
    if (o.port == 0) o.port = psched::bench::free_loopback_ports(1);
    return psched::bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "psched-transport-bench: %s\n", e.what());
    return 1;
  }
}
