// SPDX-License-Identifier: Apache-2.0
// psched: the operator's command line. `psched status [--config FILE]` asks every shard of a
// deployment for its /status over HTTP and prints one line per shard, then a line per shard of
// the job's placement (its slot map's epoch and the slots the shard owns) and, for a serving
// shard (psched-server --serve), the version it serves and its lookups' latency; a shard that
// does not answer is shown as down. Exits 0 when every shard answered, 1 otherwise.
//   --http HOST:PORT  (repeatable) asks these operator views instead of the deployment's: a
//                     container's health check asks its own shard (Containerfile)
//   --wait SECONDS    asks again every second until every shard answers or the time is up
//                     (prints the last round only): a pod that waits for the shards to serve
// `psched reshard --from DIR... (--to DIR --shards M [--split-bytes BYTES] | --to-config FILE)
// [--from-config FILE [--accept-log-loss]]` places a stopped job's checkpoints and update logs,
// written by N shards, on M shards (actors/shard/reshard.h): the servers of an M-shard
// deployment whose checkpoint directory is DIR then start from them. --to-config: that new
// deployment's file, which gives DIR (its checkpoint.directory), M and split_bytes.
// --from-config: the deployment file the job's servers ran with, needed when a shard has
// updates logged after its checkpoint (its servers were killed, or stopped before they
// checkpointed): reshard replays them under its settings as a start of those servers would,
// and --accept-log-loss goes on past a damaged or missing log as psched-server's does. The old
// shards' files are not changed. Exits 0 when the new checkpoints are in place, 2 (nothing
// written) otherwise.
// `psched export --from DIR... --to DIR [--with-optimizer-state] [--from-config FILE
// [--accept-log-loss]]` writes a stopped job's trained model out of its checkpoints into a
// folder of .npy files and a JSON manifest that numpy and torch read without psched
// (actors/shard/model_export.h; psched.torch.to_local builds a plain torch module from it).
// --from-config and --accept-log-loss as reshard's: a killed job's logged updates are replayed
// first. Exits 0 when the folder is in place, 2 (nothing written) otherwise. From running shards
// it cannot: a shard checkpoints on its interval or when stopped, never on request, so stop the
// job's servers first (SIGTERM checkpoints them).
// `psched import --from EXPORT (--to DIR --shards M [--split-bytes BYTES] | --to-config FILE)`
// makes an export written with --with-optimizer-state the checkpoints of M shards, which start
// the job again at the step after the export's, bit for bit as from its own checkpoints
// (actors/shard/model_import.h): on any number of shards, on another machine, or from arrays
// changed in numpy. --to, --shards, --split-bytes and --to-config as reshard's. Exits 0 when the
// checkpoints are in place, 2 (nothing written) otherwise.
// `psched shards add --config FILE --server NAME --control HOST:PORT [--wait S]` and
// `psched shards remove --config FILE --server NAME [--wait S]` move whole shards of a running
// job between its server processes (`servers:`, config/shard_servers.h): add gives server NAME,
// already started with psched-server --server NAME and answering GET /server at HOST:PORT, its
// share of the shards; remove gives NAME's shards to the others. Both rewrite FILE, which the
// servers and the trainers follow, and wait for the moved shards to be hosted. Exits 0 when they
// are, 1 when --wait ran out first (the file is written: the servers go on), 2 when refused
// (nothing written).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/asio.h"  // first: it fixes Boost 1.74's Asio includes

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "actors/shard/model_export.h"
#include "actors/shard/model_import.h"
#include "actors/shard/reshard.h"
#include "common/error.h"
#include "config/deployment.h"
#include "config/shard_servers.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;
using nlohmann::json;

constexpr std::chrono::seconds kTimeout{3};

// GET http://address/target parsed, or nothing when nobody answers in time.
std::optional<json> fetch_json(const psched::ListenAddress& address, const char* target) {
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  std::optional<json> status;
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, address.to_string());
  http::response<http::string_body> response;
  beast::flat_buffer buffer;
  tcp::resolver resolver(io);
  stream.expires_after(kTimeout);  // one deadline for the whole exchange
  resolver.async_resolve(address.host, std::to_string(address.port), [&](auto ec, auto results) {
    if (ec) return;
    stream.async_connect(results, [&](auto ec, auto) {
      if (ec) return;
      http::async_write(stream, request, [&](auto ec, auto) {
        if (ec) return;
        http::async_read(stream, buffer, response, [&](auto ec, auto) {
          if (ec || response.result() != http::status::ok) return;
          status = json::parse(response.body(), nullptr, /*allow_exceptions=*/false);
          if (!status->is_object()) status.reset();  // not JSON, or not a document of ours
        });
      });
    });
  });
  io.run();
  return status;
}

// A shard's /status, or nothing when it does not answer in time.
std::optional<json> fetch_status(const psched::ListenAddress& address) {
  return fetch_json(address, "/status");
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  size_t i = 0;
  while (v >= 1024 && i + 1 < std::size(units)) v /= 1024, ++i;
  return i == 0 ? fmt::format("{} B", n) : fmt::format("{:.1f} {}", v, units[i]);
}

uint64_t error_total(const json& status) {
  uint64_t total = 0;
  for (const auto& [code, count] : status.at("errors").items()) total += count.get<uint64_t>();
  return total;
}

// Bytes as sent over bytes as the dtype carries them, both directions together: "0.50", "-"
// before any payload.
std::string wire_ratio(const json& status) {
  const json& wire = status.at("wire_bytes");
  uint64_t raw = 0, sent = 0;
  for (const char* direction : {"push", "pull"}) {
    raw += wire.at(direction).at("raw").get<uint64_t>();
    sent += wire.at(direction).at("sent").get<uint64_t>();
  }
  return raw == 0 ? "-" : fmt::format("{:.2f}", double(sent) / double(raw));
}

// "shard 0: members 0 1 3 (from steps 1 1 73), joins 1, leaves 1, 158 ranges short-handed, lag
// 0 0 2": a sync or bounded shard's membership.
std::string membership_line(size_t shard, const json& m) {
  std::vector<uint64_t> ids, from, lag;
  for (const json& w : m.at("workers")) {
    if (!w.at("member").get<bool>()) continue;
    ids.push_back(w.at("worker").get<uint64_t>());
    from.push_back(w.at("joined_at").get<uint64_t>());
    lag.push_back(w.at("lag_steps").get<uint64_t>());
  }
  return fmt::format(
      "shard {}: members {} (from steps {}), joins {}, leaves {}, {} ranges short-handed, lag {}",
      shard, fmt::join(ids, " "), fmt::join(from, " "), m.at("joins").get<uint64_t>(),
      m.at("leaves").get<uint64_t>(), m.at("short_handed_ranges").get<uint64_t>(),
      fmt::join(lag, " "));
}

// One line per table of shard `shard`'s /status: its rows, memory and traffic.
std::vector<std::string> table_lines(size_t shard, const json& tables) {
  std::vector<std::string> lines;
  for (const json& t : tables) {
    const auto max_rows = t.value("max_rows", uint64_t{0});
    const std::string bound = max_rows ? fmt::format(" of at most {} ({} evicted)", max_rows,
                                                     t.value("rows_evicted", uint64_t{0}))
                                       : "";
    const auto dropped = t.value("updates_dropped", uint64_t{0});
    lines.push_back(fmt::format(
        "shard {} table {}: {} rows{}, {} held ({} payload), {} rows pushed, {} pulled{}", shard,
        t.at("name").get<std::string>(), t.at("rows").get<uint64_t>(), bound,
        human_bytes(t.at("bytes").get<uint64_t>()),
        human_bytes(t.at("payload_bytes").get<uint64_t>()), t.at("rows_pushed").get<uint64_t>(),
        t.at("rows_pulled").get<uint64_t>(),
        dropped ? fmt::format(", {} updates before admission dropped", dropped) : ""));
  }
  return lines;
}

// The job's placement as shard `shard` reports it: its slot map's epoch and the slots it owns.
std::string placement_line(size_t shard, const json& p) {
  return fmt::format("placement shard {}: job {}, slot map epoch {} on {} shard(s), {} of {} slots",
                     shard, p.at("job").get<std::string>(), p.at("slot_map_epoch").get<uint64_t>(),
                     p.at("shards").get<uint64_t>(), p.at("slots").get<uint64_t>(),
                     p.at("slots_total").get<uint64_t>());
}

// The upper bound of the bucket of histogram `h` (histogram_json's) holding quantile `q`, as
// "<= 30 us"; "-" when it holds nothing, "> 30 s" past its last bound.
std::string quantile_bound(const json& h, double q) {
  const auto count = h.at("count").get<uint64_t>();
  if (count == 0) return "-";
  for (const json& bucket : h.at("buckets"))
    if (static_cast<double>(bucket.at(1).get<uint64_t>()) >= q * static_cast<double>(count)) {
      const double bound = bucket.at(0).get<double>();
      return bound < 1e-3 ? fmt::format("<= {:g} us", bound * 1e6)
             : bound < 1  ? fmt::format("<= {:g} ms", bound * 1e3)
                          : fmt::format("<= {:g} s", bound);
    }
  return fmt::format("> {:g} s", h.at("buckets").back().at(0).get<double>());
}

// A serving shard's version and lookups (`serving` and poll_wait_seconds of its /status).
std::string serving_line(size_t shard, const json& status) {
  const json& v = status.at("serving");
  const json& wait = status.at("poll_wait_seconds");
  return fmt::format(
      "serving shard {}: {} (generation {}, step {}) read-only, {} version(s) loaded, {} "
      "refused; {} lookups, p50 {}, p99 {} in the shard",
      shard, v.at("checkpoint").get<std::string>(), v.at("generation").get<uint64_t>(),
      v.at("step").get<uint64_t>(), v.at("versions_loaded").get<uint64_t>(),
      v.at("reloads_refused").get<uint64_t>(), wait.at("count").get<uint64_t>(),
      quantile_bound(wait, 0.5), quantile_bound(wait, 0.99));
}

// The operator views to ask: `http` when given, else every shard's of `config_file`.
std::vector<psched::ListenAddress> operator_views(const std::string& config_file,
                                                  const std::vector<std::string>& http) {
  std::vector<psched::ListenAddress> views;
  for (const std::string& address : http) views.push_back(psched::parse_listen_address(address));
  if (views.empty())
    for (const auto& shard : psched::load_deployment(config_file).shards)
      views.push_back(shard.http);
  return views;
}

int status(const std::vector<psched::ListenAddress>& views) {
  fmt::print("{:<5} {:<6} {:<21} {:>7} {:>7} {:>9} {:>7} {:>11} {:>11} {:>9} {:>11} {:>7}\n",
             "shard", "state", "http", "workers", "members", "variables", "polls", "received",
             "sent", "wire/raw", "partitions", "errors");
  std::vector<std::string> membership, tables, placement, serving;
  bool all_up = true;
  for (size_t i = 0; i < views.size(); ++i) {
    std::string http = views[i].to_string();
    std::optional<json> s = fetch_status(views[i]);
    if (!s) {
      all_up = false;
      fmt::print("{:<5} {:<6} {}\n", i, "down", http);
      continue;
    }
    const json& m = s->at("membership");
    std::string members =
        m.is_null() ? "-"
                    : fmt::format("{}/{}", m.at("members").get<uint64_t>(), m.at("workers").size());
    if (!m.is_null()) membership.push_back(membership_line(i, m));
    placement.push_back(placement_line(i, s->at("placement")));
    if (!s->value("serving", json()).is_null()) serving.push_back(serving_line(i, *s));
    for (std::string& line : table_lines(i, s->at("tables"))) tables.push_back(std::move(line));
    fmt::print("{:<5} {:<6} {:<21} {:>7} {:>7} {:>9} {:>7} {:>11} {:>11} {:>9} {:>11} {:>7}\n", i,
               "up", http, s->at("connected_workers").get<uint64_t>(), members,
               s->at("variables").get<uint64_t>(), s->at("polls_waiting").get<uint64_t>(),
               human_bytes(s->at("bytes_received").get<uint64_t>()),
               human_bytes(s->at("bytes_sent").get<uint64_t>()), wire_ratio(*s),
               s->at("partitions_applied").get<uint64_t>(), error_total(*s));
  }
  for (const std::string& line : placement) fmt::print("{}\n", line);
  for (const std::string& line : serving) fmt::print("{}\n", line);
  for (const std::string& line : membership) fmt::print("{}\n", line);
  for (const std::string& line : tables) fmt::print("{}\n", line);
  return all_up ? 0 : 1;
}

// "server c (10.0.0.3:9500): hosts 1 0; waits for 3 (its previous server has not let it go
// yet (pid 4242 on node-1))", a line per server of a job whose shards move (servers:), from
// each server's GET /server; false when one does not answer.
bool print_servers(const psched::DeploymentConfig& config) {
  bool all_up = true;
  for (const psched::ServerConfig& server : config.servers) {
    std::optional<json> answer = fetch_json(server.control, "/server");
    std::string what = "down";
    if (answer) {
      std::vector<std::string> waits;
      for (const json& w : answer->at("waiting"))
        waits.push_back(fmt::format("{} ({})", w.at("shard").get<uint32_t>(),
                                    w.at("reason").get<std::string>()));
      what = fmt::format(
          "hosts {}{}", fmt::join(answer->at("hosted").get<std::vector<uint32_t>>(), " "),
          waits.empty() ? "" : fmt::format("; waits for {}", fmt::join(waits, ", ")));
    }
    all_up = all_up && answer;
    fmt::print("server {} ({}): {}\n", server.name, server.control.to_string(), what);
  }
  return all_up;
}

// Every view answers within `wait_seconds`: the rounds before the last one print nothing.
bool all_answer(const std::vector<psched::ListenAddress>& views, double wait_seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
  for (;;) {
    bool up = true;
    for (const auto& view : views) up = up && fetch_status(view).has_value();
    if (up || std::chrono::steady_clock::now() >= deadline) return up;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// The settings a job's logged updates are replayed under (CheckpointSetOptions::replay): those
// of `from_config`, the deployment file its servers ran with, with `accept_log_loss`; none when
// no file is given. `tool` begins the messages.
std::optional<psched::ShardSettings> replay_settings(std::string_view tool,
                                                     const std::string& from_config,
                                                     bool accept_log_loss) {
  if (from_config.empty()) {
    if (accept_log_loss)
      psched::fail(psched::ErrorCode::bad_config,
                   "{}: --accept-log-loss without --from-config: the logs are replayed under the "
                   "deployment file the job ran with",
                   tool);
    return std::nullopt;
  }
  psched::DeploymentConfig previous = psched::load_deployment(from_config);
  previous.checkpoint.accept_log_loss = accept_log_loss;
  return psched::shard_settings(previous, psched::ShardId(0));
}

// --from-config and --accept-log-loss, for `command`, into `from_config` and `accept_log_loss`.
void add_replay_options(CLI::App* command, std::string& from_config, bool& accept_log_loss) {
  command
      ->add_option("--from-config", from_config,
                   "the deployment file the job's servers ran with: updates logged after a "
                   "shard's checkpoint are replayed under it")
      ->check(CLI::ExistingFile);
  command->add_flag("--accept-log-loss", accept_log_loss,
                    "go on past a damaged or missing update log, losing the updates it held (as "
                    "psched-server --accept-log-loss)");
}

// A refusal of `psched <tool>` on stderr; exit status 2. The tool's own messages begin
// "<tool>: "; what it passes on from a file, not.
int refused(std::string_view tool, std::string_view why) {
  const bool named = why.starts_with(tool) && why.substr(tool.size()).starts_with(": ");
  fmt::print(stderr, "psched {}{}{}\n", named ? "" : tool, named ? "" : ": ", why);
  return 2;
}

// What `psched reshard` was given.
struct ReshardArgs {
  std::vector<std::string> from;
  std::string to, to_config, from_config;
  std::optional<uint32_t> shards;
  std::optional<uint64_t> split_bytes;
  bool accept_log_loss = false;
};

// Where `tool` (reshard, import) places the job: --to and --shards, or the new deployment
// file's checkpoint directory, shard count and split_bytes.
psched::ReshardOptions placement(std::string_view tool, const ReshardArgs& args) {
  using psched::ErrorCode;
  psched::ReshardOptions options;
  if (args.to.empty() == args.to_config.empty())
    psched::fail(ErrorCode::bad_config,
                 "{}: give the new shards' checkpoint directory (--to DIR) or their deployment "
                 "file (--to-config FILE), one of them",
                 tool);
  options.to = args.to;
  options.shards = args.shards.value_or(0);
  options.split_bytes = args.split_bytes.value_or(0);
  if (!args.to_config.empty()) {
    const psched::DeploymentConfig next = psched::load_deployment(args.to_config);
    if (next.checkpoint.directory.empty())
      psched::fail(ErrorCode::bad_config,
                   "{}: --to-config {} has no checkpoint.directory for the new shards to start "
                   "from",
                   tool, args.to_config);
    const auto count = static_cast<uint32_t>(next.shards.size());
    if (args.shards && *args.shards != count)
      psched::fail(ErrorCode::bad_config, "{}: --shards {}, but --to-config {} names {} shards",
                   tool, *args.shards, args.to_config, count);
    if (args.split_bytes && *args.split_bytes != next.split_bytes)
      psched::fail(ErrorCode::bad_config,
                   "{}: --split-bytes {}, but --to-config {} has split_bytes {}", tool,
                   *args.split_bytes, args.to_config, next.split_bytes);
    options.to = next.checkpoint.directory;
    options.shards = count;
    options.split_bytes = next.split_bytes;
  } else if (!args.shards) {
    psched::fail(ErrorCode::bad_config,
                 "{}: give the new number of shards (--shards M) or the new deployment file "
                 "(--to-config FILE)",
                 tool);
  }
  return options;
}

// The options `args` make: placement()'s, the old shards' directories, and the replay settings
// from the old deployment file.
psched::ReshardOptions reshard_options(const ReshardArgs& args) {
  psched::ReshardOptions options = placement("reshard", args);
  options.from.assign(args.from.begin(), args.from.end());
  options.replay = replay_settings("reshard", args.from_config, args.accept_log_loss);
  if (options.replay) options.replay_source = "--from-config " + args.from_config;
  return options;
}

// The lines that say which shards were restored from their logs, and what that dropped or lost.
void print_replays(const std::vector<psched::ShardReplay>& replayed) {
  for (const auto& replay : replayed) {
    fmt::print("shard {}: restored from {} and its logs, {} logged update(s) replayed\n",
               replay.shard, replay.checkpoint.string(), replay.updates);
    for (const auto& dropped : replay.dropped) fmt::print("shard {}: {}\n", replay.shard, dropped);
    if (!replay.lost.empty())
      fmt::print("shard {}: LOST (--accept-log-loss): {}\n", replay.shard, replay.lost);
  }
}

// What a placement did: the map, what moved, the files written.
void print_placement(const psched::ReshardReport& r) {
  fmt::print(
      "placed the job of {} shard(s) on {}: slot map epoch {}, {} of {} slots moved; {} dense "
      "variable(s), {} table(s), {} row(s) ({} moved to another shard, {} of rows)\n",
      r.from_shards, r.map.shards(), r.map.epoch(), r.slots_moved, psched::SlotMap::kSlots,
      r.variables, r.tables, r.rows, r.rows_moved, human_bytes(r.row_bytes));
  if (r.rows_evicted > 0)
    fmt::print("{} row(s) over their table's max_rows on their new shard evicted\n",
               r.rows_evicted);
  for (const auto& file : r.written) fmt::print("wrote {}\n", file.string());
}

int run_reshard(const ReshardArgs& args) {
  const psched::ReshardReport r = psched::reshard(reshard_options(args));
  print_replays(r.replayed);
  print_placement(r);
  return 0;
}

int run_import(const ReshardArgs& args) {
  const psched::ReshardOptions where = placement("import", args);
  const psched::ImportReport r = psched::import_model({.from = args.from.at(0),
                                                       .to = where.to,
                                                       .shards = where.shards,
                                                       .split_bytes = where.split_bytes});
  fmt::print("imported the job exported at step {} from {}: {} row(s) read\n", r.step,
             args.from.at(0), r.rows);
  print_placement(r.placed);
  return 0;
}

// What `psched export` was given.
struct ExportArgs {
  std::vector<std::string> from;
  std::string to, from_config;
  bool with_optimizer_state = false, accept_log_loss = false;
};

int run_export(const ExportArgs& args) {
  psched::ExportOptions options{.from = {args.from.begin(), args.from.end()},
                                .to = args.to,
                                .with_optimizer_state = args.with_optimizer_state};
  options.replay = replay_settings("export", args.from_config, args.accept_log_loss);
  if (options.replay) options.replay_source = "--from-config " + args.from_config;
  const auto start = std::chrono::steady_clock::now();
  const psched::ExportReport r = psched::export_model(options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  print_replays(r.replayed);
  fmt::print(
      "exported the job of {} shard(s) at step {}: {} dense variable(s), {} table(s), {} row(s); "
      "{} written in {:.2f} s ({}/s) to {}\n",
      r.shards, r.step, r.variables, r.tables, r.rows, human_bytes(r.bytes_written), seconds,
      human_bytes(
          static_cast<uint64_t>(static_cast<double>(r.bytes_written) / std::max(seconds, 1e-6))),
      options.to.string());
  return 0;
}

// Where reshard and import place the job: --to and --shards [--split-bytes], or --to-config.
void add_placement_options(CLI::App* command, ReshardArgs& args) {
  auto* to =
      command->add_option("--to", args.to, "the new shards' checkpoint directory (must not exist)");
  command->add_option("--shards", args.shards, "the new number of shards");
  command->add_option("--split-bytes", args.split_bytes,
                      "the new deployment's split_bytes, where it is not the job's: dense "
                      "variables larger are split (default: each split or whole as before)");
  command
      ->add_option("--to-config", args.to_config,
                   "the new deployment file, instead of --to: its checkpoint.directory, number "
                   "of shards and split_bytes")
      ->check(CLI::ExistingFile)
      ->excludes(to);
}

// What `psched shards add|remove` was given.
struct ShardsArgs {
  std::string config, server, control;
  double wait_seconds = 120;
};

// The servers answering GET /server at their control address as `name`: refuses naming the
// first that does not (nothing is written then).
void require_answering(const psched::DeploymentConfig& config,
                       const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const psched::ServerConfig& server = *psched::find_server(config, name);
    std::optional<json> answer = fetch_json(server.control, "/server");
    if (!answer || answer->value("server", "") != name)
      psched::fail(psched::ErrorCode::bad_config,
                   "shards: server {} does not answer at {} ({}); start it there first: "
                   "psched-server --config {} --server {}",
                   name, server.control.to_string(),
                   answer ? fmt::format("server {} answers there", answer->value("server", "?"))
                          : "nothing answers",
                   config.source.string(), name);
  }
}

// Replaces `file` whole with `text` (written beside it, then renamed over it: readers see the
// old file or the new one, never a part), keeping its permissions.
void replace_file(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::path next = file;
  next += fmt::format(".psched-new-{}", ::getpid());
  try {
    {
      std::ofstream out(next, std::ios::trunc);
      out << text;
      if (!out.flush())
        psched::fail(psched::ErrorCode::io_error, "shards: cannot write {}", next.string());
    }
    std::filesystem::permissions(next, std::filesystem::status(file).permissions());
    std::filesystem::rename(next, file);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(next, ignored);
    throw;
  }
}

// Waits until every moved shard is hosted where it moved, printing each as it lands. False,
// naming what still waits and why, when `seconds` pass first.
bool wait_for_moves(const psched::DeploymentConfig& after, std::vector<psched::ShardMove> moves,
                    double seconds) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::map<std::string, json> last;
  while (!moves.empty()) {
    std::erase_if(moves, [&](const psched::ShardMove& move) {
      std::optional<json> answer =
          fetch_json(psched::find_server(after, move.to)->control, "/server");
      if (answer) last[move.to] = *answer;
      const auto held = answer ? answer->value("hosted", json::array()).get<std::vector<uint32_t>>()
                               : std::vector<uint32_t>{};
      const bool hosted = std::ranges::count(held, move.shard.value) > 0;
      if (hosted)
        fmt::print("shard {}: hosted by server {} after {:.1f} s\n", move.shard.value, move.to,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      return hosted;
    });
    if (moves.empty()) return true;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (const psched::ShardMove& move : moves)
        fmt::print(
            stderr, "psched shards: shard {} not hosted by server {} yet: {}\n", move.shard.value,
            move.to,
            last.contains(move.to) ? last[move.to].value("waiting", json()).dump() : "no answer");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// `psched shards add` (`adding`) or `remove`: plans the moves, checks the servers that take
// shards answer, writes the file, and waits for the shards to land. 0 when they did, 1 when the
// wait ran out (the file is written: the servers go on), 2 when refused (nothing written).
int run_shards(const ShardsArgs& args, bool adding) {
  const psched::DeploymentConfig before = psched::load_deployment(args.config);
  std::vector<psched::ShardMove> moves;
  const psched::DeploymentConfig after =
      adding ? psched::with_server_added(
                   before, {args.server, psched::parse_listen_address(args.control)}, moves)
             : psched::with_server_removed(before, args.server, moves);
  std::vector<std::string> takers;
  for (const psched::ShardMove& move : moves)
    if (std::ranges::find(takers, move.to) == takers.end()) takers.push_back(move.to);
  require_answering(after, takers);
  std::ifstream in(args.config);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string written = psched::rewrite_placement(text, after);
  psched::parse_deployment(written, args.config);  // what the servers will read is valid
  replace_file(args.config, written);
  for (const psched::ShardMove& move : moves)
    fmt::print("shard {}: server {} -> {} ({})\n", move.shard.value, move.from, move.to,
               after.shards[move.shard.value].listen.to_string());
  fmt::print("{} written: {} shard(s) move\n", args.config, moves.size());
  return wait_for_moves(after, moves, args.wait_seconds) ? 0 : 1;
}

// `psched shards add` and `psched shards remove`, into `args`; `add` and `remove` are set.
CLI::App* add_shards(CLI::App& app, ShardsArgs& args, CLI::App*& add, CLI::App*& remove) {
  CLI::App* command = app.add_subcommand(
      "shards", "move whole shards between the server processes of a running job (servers:)");
  command->require_subcommand(1);
  add = command->add_subcommand(
      "add", "give a new server (already running with --server NAME) its share of the shards");
  remove = command->add_subcommand(
      "remove", "give a server's shards to the others, which then host them; it may stop then");
  for (CLI::App* sub : {add, remove}) {
    sub->add_option("--config", args.config, "the deployment file the servers and trainers follow")
        ->required()
        ->check(CLI::ExistingFile);
    sub->add_option("--server", args.server, "the server's name")->required();
    sub->add_option("--wait", args.wait_seconds,
                    "wait this many seconds at most for the moved shards to be hosted")
        ->capture_default_str();
  }
  add->add_option("--control", args.control,
                  "HOST:PORT where the new server answers GET /server; its shards listen on "
                  "that host, on their ports")
      ->required();
  return command;
}

// `psched export`'s options into `args`.
CLI::App* add_export(CLI::App& app, ExportArgs& args) {
  CLI::App* command = app.add_subcommand(
      "export", "write a stopped job's model out of its checkpoints: .npy files and a manifest");
  command->add_option("--from", args.from, "directories holding the job's checkpoints and logs")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--to", args.to, "the folder to write (must not exist)")->required();
  command->add_flag("--with-optimizer-state", args.with_optimizer_state,
                    "also each variable's and row's optimizer state");
  add_replay_options(command, args.from_config, args.accept_log_loss);
  return command;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"psched: the operator's command line"};
  app.require_subcommand(1);
  std::string config = "configs/local.yaml";
  std::vector<std::string> http;
  double wait_seconds = 0;
  CLI::App* status_command =
      app.add_subcommand("status", "print every shard's state (from its /status page)");
  status_command->add_option("--config", config, "deployment YAML file")
      ->check(CLI::ExistingFile)
      ->capture_default_str();
  status_command->add_option("--http", http,
                             "HOST:PORT of an operator view to ask instead of the deployment's "
                             "(repeatable)");
  status_command
      ->add_option("--wait", wait_seconds,
                   "ask again every second until every shard answers, at most this many seconds")
      ->check(CLI::NonNegativeNumber);
  ReshardArgs reshard_args;
  CLI::App* reshard_command = app.add_subcommand(
      "reshard", "place a stopped job's checkpoints and update logs on another number of shards");
  reshard_command
      ->add_option("--from", reshard_args.from,
                   "directories holding the job's checkpoints and update logs")
      ->required()
      ->check(CLI::ExistingDirectory);
  add_placement_options(reshard_command, reshard_args);
  add_replay_options(reshard_command, reshard_args.from_config, reshard_args.accept_log_loss);
  ExportArgs export_args;
  CLI::App* export_command = add_export(app, export_args);
  ReshardArgs import_args;
  CLI::App* import_command = app.add_subcommand(
      "import",
      "make a job's export (with its optimizer state) the checkpoints of any number "
      "of shards, which start the job again where it stopped");
  import_command->add_option("--from", import_args.from, "the export folder")
      ->required()
      ->expected(1)
      ->check(CLI::ExistingDirectory);
  add_placement_options(import_command, import_args);
  ShardsArgs shards_args;
  CLI::App *shards_add = nullptr, *shards_remove = nullptr;
  add_shards(app, shards_args, shards_add, shards_remove);
  CLI11_PARSE(app, argc, argv);
  if (shards_add->parsed() || shards_remove->parsed()) {
    try {
      return run_shards(shards_args, shards_add->parsed());
    } catch (const std::exception& e) {  // psched::Error, a file system's, YAML's
      return refused("shards", e.what());
    }
  }
  if (export_command->parsed()) {
    try {
      return run_export(export_args);
    } catch (const psched::Error& e) {
      return refused("export", e.what());
    } catch (const std::filesystem::filesystem_error& e) {
      return refused("export", e.what());
    }
  }
  if (reshard_command->parsed()) {
    try {
      return run_reshard(reshard_args);
    } catch (const psched::Error& e) {
      return refused("reshard", e.what());
    }
  }
  if (import_command->parsed()) {
    try {
      return run_import(import_args);
    } catch (const psched::Error& e) {
      return refused("import", e.what());
    } catch (const std::filesystem::filesystem_error& e) {
      return refused("import", e.what());
    }
  }
  try {
    const auto views = operator_views(config, http);
    if (wait_seconds > 0) all_answer(views, wait_seconds);
    const int shards_up = status(views);
    const bool servers_up = !http.empty() || print_servers(psched::load_deployment(config));
    return shards_up == 0 && servers_up ? 0 : 1;
  } catch (const psched::Error& e) {
    fmt::print(stderr, "psched status: {}\n", e.what());
    return 2;
  } catch (const json::exception& e) {
    fmt::print(stderr, "psched status: unexpected /status document: {}\n", e.what());
    return 2;
  }
}
