// SPDX-License-Identifier: Apache-2.0
// psched-server: hosts the shards a deployment file names (all, those given with --shard, or
// the one an environment variable names with --shard-from), until SIGINT or SIGTERM. With
// --server NAME it hosts the shards the file gives server NAME and follows the file as shards
// move between servers (server/server_follower.h). With
// `checkpoint:` configured it restores each shard at start and checkpoints periodically and at
// a clean stop. With --serve DIR the shards serve a trained job's checkpoints in DIR read-only
// instead (inference: pulls answered, pushes refused, nothing written), loading a newer one at
// SIGHUP or every --reload-seconds.
#include <pthread.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "apps/environment_index.h"
#include "common/error.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/placement.h"
#include "config/deployment.h"
#include "server/server_follower.h"
#include "server/shard_monitor.h"
#include "server/shard_threads.h"

namespace {

struct Options {
  std::string config;
  std::vector<uint32_t> shards;
  std::string shard_from;  // the environment variable holding the one shard to host
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  unsigned apply_helpers = std::max(1u, std::thread::hardware_concurrency()) - 1;
  bool accept_log_loss = false;
  std::string trace;    // where to write the shards' Chrome trace at the stop; empty: no trace
  std::string job;      // the job's name (--job); empty: named by its shards' addresses
  std::string serve;    // serve this checkpoint directory read-only (--serve); empty: train
  std::string server;   // follow the file as server NAME (--server); empty: host the shards given
  std::string control;  // --control: where a --server answers GET /server; empty: the file's
  double reload_seconds = 0;
};

// The job's identity for shards that start with no checkpoint (never 0): the stable hash of
// --job, else of the deployment's shard addresses, so that the processes of one deployment (one
// a shard, README) agree with no flag; two jobs that use the same addresses tell their
// checkpoints apart by --job.
uint64_t job_identity(const Options& options, const psched::DeploymentConfig& config) {
  if (!options.job.empty()) return psched::stable_hash(options.job) | 1;
  // Shards that move between servers change addresses: such a job is named by its number of
  // shards and its checkpoint directory's name, which every server sees whenever it starts.
  if (!config.servers.empty()) {
    std::filesystem::path directory = config.checkpoint.directory.lexically_normal();
    if (!directory.has_filename()) directory = directory.parent_path();  // "state/"
    return psched::stable_hash(fmt::format("psched job of {} shards in {}", config.shards.size(),
                                           directory.filename().string())) |
           1;
  }
  std::string addresses = "psched shards:";
  for (const psched::ShardConfig& shard : config.shards)
    addresses += " " + shard.listen.to_string();
  return psched::stable_hash(addresses) | 1;
}

// Requests kept per shard in a trace (about 100 bytes each); later ones are counted only.
constexpr size_t kTracedRequests = 1'000'000;

// Writes the shards' trace to `path`, logging (not throwing) a failure: the stop goes on.
void write_trace(psched::ShardThreads& host, const std::string& path) {
  std::ofstream out(path);
  out << host.trace().dump() << '\n';
  if (!out.flush())
    psched::log_error("psched-server: --trace: cannot write {}", path);
  else
    psched::log_info("psched-server: trace written to {}", path);
}

// Blocks SIGINT and SIGTERM (and, serving, SIGHUP) in this thread and every thread started
// after, so that only serve()'s sigwait takes them.
sigset_t block_signals(bool serving) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  if (serving) sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Where the shard index came from, for messages: "" or " (from SLURM_PROCID=3)".
std::string index_origin(const Options& options) {
  if (options.shard_from.empty()) return "";
  return fmt::format(" (from {}={})", options.shard_from, std::getenv(options.shard_from.c_str()));
}

// The shards to host: those --shard names, the one in --shard-from's variable, or all.
std::vector<psched::ShardId> chosen_shards(const Options& options,
                                           const psched::DeploymentConfig& config) {
  std::vector<uint32_t> indices = options.shards;
  if (!options.shard_from.empty())
    indices.push_back(psched::environment_index(options.shard_from, "no shard index"));
  if (indices.empty())
    for (uint32_t i = 0; i < config.shards.size(); ++i) indices.push_back(i);
  std::vector<psched::ShardId> shards;
  for (uint32_t i : indices) {
    if (i >= config.shards.size())
      psched::fail(psched::ErrorCode::bad_config, "{}: there is no shard {}{} (the file names {})",
                   config.source.string(), i, index_origin(options), config.shards.size());
    shards.push_back(psched::ShardId(i));
  }
  return shards;
}

// How often a --server process looks at its deployment file.
constexpr timespec kFollowEvery{0, 50'000'000};

// psched-server --server NAME: hosts what the file gives NAME, following it, until a signal.
int follow(const Options& options) {
  auto adjust = [&options](psched::DeploymentConfig& config) {
    config.checkpoint.accept_log_loss = options.accept_log_loss;
    config.checkpoint.job = job_identity(options, config);
  };
  sigset_t signals = block_signals(false);
  psched::ShardThreads host(options.threads, options.apply_helpers);
  std::optional<psched::ListenAddress> control;
  if (!options.control.empty()) control = psched::parse_listen_address(options.control);
  auto follower = std::make_unique<psched::ServerFollower>(
      options.server, std::filesystem::absolute(options.config), control, adjust, host);
  int signal = -1;
  while (signal < 0) {
    follower->poll();
    signal = sigtimedwait(&signals, nullptr, &kFollowEvery);
  }
  psched::log_info("psched-server: signal {} received, stopping", signal);
  follower.reset();  // its monitors before the shards go
  host.stop();
  return 0;
}

int serve(const Options& options) {
  psched::tune_malloc_for_large_messages();
  if (!options.server.empty()) return follow(options);
  psched::DeploymentConfig config = psched::load_deployment(options.config);
  if (!config.servers.empty() && options.serve.empty())
    psched::fail(psched::ErrorCode::bad_config,
                 "{} names servers: start each with --server NAME (its shards follow the file)",
                 options.config);
  config.checkpoint.accept_log_loss = options.accept_log_loss;
  config.checkpoint.job = job_identity(options, config);
  config.serve = {options.serve, options.reload_seconds};
  if (options.accept_log_loss)
    psched::log_warn(
        "psched-server: --accept-log-loss: a damaged or missing update log will lose the "
        "acknowledged updates it held instead of stopping the start");
  std::vector<psched::ShardId> shards = chosen_shards(options, config);
  sigset_t signals = block_signals(!options.serve.empty());
  psched::ShardThreads host(config, shards, options.threads, options.apply_helpers);
  if (!options.trace.empty()) host.start_tracing(kTracedRequests);
  host.start();
  std::vector<std::unique_ptr<psched::ShardMonitor>> monitors;
  for (size_t i = 0; i < host.size(); ++i) {
    monitors.push_back(
        std::make_unique<psched::ShardMonitor>(host.shard(i), host.listener(i), config, shards[i]));
    psched::log_info("shard {} dashboard on http://{}/ (also /metrics, /status)", shards[i].value,
                     config.shards[shards[i].value].http.to_string());
  }
  if (options.serve.empty())
    psched::log_info("psched-server: {} shard(s) on {} thread(s), {} mode, {} worker(s), config {}",
                     shards.size(), std::min<size_t>(shards.size(), std::max(1u, options.threads)),
                     to_string(config.mode), config.workers, options.config);
  else
    psched::log_info(
        "psched-server: {} shard(s) serving {} read-only on {} thread(s), config {}; SIGHUP "
        "loads a newer checkpoint{}",
        shards.size(), options.serve,
        std::min<size_t>(shards.size(), std::max(1u, options.threads)), options.config,
        options.reload_seconds > 0 ? fmt::format(", as does every {} s", options.reload_seconds)
                                   : "");

  int signal = 0;
  for (sigwait(&signals, &signal); signal == SIGHUP; sigwait(&signals, &signal)) {
    psched::log_info("psched-server: SIGHUP: loading the newest checkpoint of {}", options.serve);
    host.reload();
  }
  psched::log_info("psched-server: signal {} received, stopping", signal);
  monitors.clear();  // before the shards go: a snapshot in flight then answers nobody
  if (!options.trace.empty()) write_trace(host, options.trace);
  host.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"psched-server: parameter-server shards with priority scheduling"};
  Options options;
  app.add_option("--config", options.config, "deployment YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  auto* shard =
      app.add_option("--shard", options.shards, "host only these shard indices (default: all)");
  app.add_option("--shard-from", options.shard_from,
                 "host the one shard whose index this environment variable holds: a number "
                 "(SLURM_PROCID) or a name ending in -N (a StatefulSet pod's name)")
      ->excludes(shard);
  app.add_option("--threads", options.threads,
                 "event-loop threads serving the shards (default: cores; at most one per shard)");
  app.add_option("--apply-threads", options.apply_helpers,
                 "extra threads applying one large partition (default: cores - 1)");
  auto* server =
      app.add_option("--server", options.server,
                     "host the shards the file's servers: list gives this server, and follow the "
                     "file as shards move between servers (psched shards add|remove)")
          ->excludes(shard)
          ->excludes("--shard-from");
  app.add_option("--control", options.control,
                 "with --server: HOST:PORT to answer GET /server on, for a server the file does "
                 "not name yet (psched shards add then gives it shards; default: the file's)")
      ->needs(server);
  auto* serve_option = app.add_option(
      "--serve", options.serve,
      "serve this job's checkpoint directory read-only to inference clients: pushes are "
      "refused, nothing is written; SIGHUP loads a newer checkpoint beside and switches to it");
  app.add_option("--reload-seconds", options.reload_seconds,
                 "with --serve: look for a newer checkpoint this often (default 0: at SIGHUP only)")
      ->needs(serve_option)
      ->check(CLI::NonNegativeNumber);
  serve_option->excludes("--server");
  app.add_flag("--accept-log-loss", options.accept_log_loss,
               "start even when an update log is damaged or missing, losing the acknowledged "
               "updates from the damage on (logged); without it such a start is refused");
  app.add_option("--trace", options.trace,
                 "at the stop, write a Chrome trace (Perfetto, chrome://tracing) of every "
                 "request the shards served over data streams to this file: receive, apply, "
                 "wait and answer per partition, on the machine's monotonic clock");
  server->excludes("--trace");
  app.add_option("--job", options.job,
                 "the job's name, kept in its checkpoints when it starts with none (default: "
                 "named by the deployment's shard addresses; with servers:, by its number of "
                 "shards and its checkpoint directory's name); `psched reshard` takes only "
                 "checkpoints of one job, so give jobs that reuse those addresses names of "
                 "their own");
  CLI11_PARSE(app, argc, argv);
  // A file size limit (ulimit -f) then fails the write with EFBIG, which the update log
  // handles, instead of killing the server.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return serve(options);
  } catch (const psched::Error& e) {
    psched::log_error("psched-server: {}", e.what());
    return 2;
  } catch (const kj::Exception& e) {
    psched::log_error("psched-server: {}", e.getDescription().cStr());
    return 2;
  }
}
